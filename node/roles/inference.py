"""The inference role: generate rollouts with the run's policy, store them, gossip headers
paced to what peers admit from this worker (`pace_for`: its signer rate, scaled by its
verified standing).

Each batch: task assignments from (run seed, our peer id, counter) via
`trainer.tasks`, generation and activation proofs through the same code as
`swarm-node rollouts` (`trainer.produce.generate_records`), run in a worker thread.
The counter resumes from the store's ledger after a restart, so a task is never assigned
twice and envelope sequence numbers (the counter) keep increasing. With no peer subscribed
to the rollouts topic the worker waits (and says so) instead of piling up work nobody sees.

With `--rollouts-per-version Q` a worker makes at most Q rollouts per version the trainer
publishes, at most S - 1 versions ahead (S the run's staleness bound; `at_budget`): work beyond
what the trainer consumes per version would only go stale while it waits, and on a shared
machine it takes the trainer's CPU. The wait for the next version is bounded
(`BUDGET_WAIT_S`); a trainer that publishes nothing does not stop the worker for good.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import psutil
import trio

from node.local_model import check_datasets, check_device, load_engine
from node.paths import resolve_model
from node.peer.config import PACE_MARGIN
from node.peer.ports import InferencePeer
from node.roles.config import InferenceConfig, RoleIO
from node.roles.policy_versions import HotSwap
from protocol.admission import AdmissionConfig, Admitted, Kind
from protocol.rollout import open_record, read_records
from trainer.groups import heldout_items, heldout_solved
from trainer.produce import generate_records
from trainer.samples import Refused, Rescorer

PULLS_BODIES = False
NEEDS_MODEL = True
PEER_POLL_S = 0.5  # how often a worker without peers looks again
BUDGET_POLL_S = 0.5  # how often a worker at its budget looks for a newer version
BUDGET_WAIT_S = 60.0  # the longest it waits for one before making a batch anyway
CLOSE_TIMEOUT_S = 30.0  # vLLM's own shutdown waits 5 s for its processes, then kills them


def load(config: InferenceConfig, manifest: Any) -> Any:
    """Check the datasets and the device, find and load the model at the run's precision
    (blocking: call in a thread)."""
    check_datasets(manifest, "run manifest")
    device = check_device(config.model.device, manifest.worker_precision)
    path = resolve_model(config.model.model, manifest.model, config.model.models_dir)
    return load_engine(
        path,
        batch_size=config.batch_size,
        threads=config.model.threads,
        engine=config.engine,
        device=device,
        precision=manifest.worker_precision,
    )


async def _wait_for_peers(peer: InferencePeer, io: RoleIO, produced: int) -> None:
    """With nobody subscribed to our rollouts, work made now would go stale unseen: hold
    the next batch (the unpublished backlog stays at most one batch) until a peer is here."""
    topic = peer.topics["rollouts"]
    if peer.host.topic_peers(topic):
        return
    io.say(
        f"inference: no peers on {topic}; waiting for peers before producing more "
        f"({produced} rollouts made so far)"
    )
    io.status["waiting_for_peers"] = True
    while not peer.host.topic_peers(topic) and io.producing:
        await trio.sleep(PEER_POLL_S)
    io.status["waiting_for_peers"] = False
    if io.producing:
        io.say(f"inference: {len(peer.host.topic_peers(topic))} peer(s) here; producing")


def at_budget(produced: int, versions_gained: int, per_version: int, lead: int) -> bool:
    """Whether a worker that made `produced` rollouts while the policy went forward
    `versions_gained` versions has made its `per_version` share of each version and `lead`
    versions ahead (never with `per_version` 0)."""
    return per_version > 0 and produced >= per_version * (max(0, versions_gained) + lead)


async def _within_budget(
    peer: InferencePeer,
    config: InferenceConfig,
    io: RoleIO,
    swap: HotSwap,
    produced: int,
    first: int,
) -> int:
    """The version the next batch is made with, once the worker is within its budget
    (`at_budget`) or has waited `BUDGET_WAIT_S` for a newer version."""
    say = lambda m: io.say(f"inference: {m}")  # noqa: E731
    version = await swap.before_batch(say)
    lead = max(1, peer.manifest.max_staleness - 1)  # its last rollouts still train within S
    deadline = trio.current_time() + BUDGET_WAIT_S
    waited = trio.current_time()
    while (
        at_budget(produced, version - first, config.rollouts_per_version, lead)
        and io.producing
        and trio.current_time() < deadline
    ):
        await trio.sleep(BUDGET_POLL_S)
        version = await swap.before_batch(say)
    io.status["budget_wait_s"] = round(
        io.status.get("budget_wait_s", 0.0) + trio.current_time() - waited, 1
    )
    return version


class _Local:
    """`--local-train I:J` (SAPO style): own records and pulled swarm records feed a
    `trainer.local_train.LocalTrainer` (a separate copy; never published). Model work runs
    in a worker thread after each batch; the held-out solve rate of the copy is scored every
    `LOCAL_EVAL_EVERY` rounds and shown in `status` under `local_train`."""

    def __init__(
        self, peer: InferencePeer, config: InferenceConfig, io: RoleIO, engine: Any
    ) -> None:
        from trainer.local_train import LocalTrainer  # deferred: heavy import

        own, foreign = config.local_train or (0, 0)
        self.peer, self.config, self.io, self.engine = peer, config, io, engine
        self.local = LocalTrainer(engine.model, engine.tokenizer, peer.manifest, own, foreign)
        self.rescorer = Rescorer(peer.manifest, engine.tokenizer)
        self.inbox: list[tuple[Any, bool]] = []
        self.refused = 0
        self.evals: list[dict[str, Any]] = []
        peer.on_deliver(self._on_deliver)

    def _on_deliver(self, item: Admitted) -> None:
        if item.kind is Kind.ROLLOUT_RECORD and item.envelope.signer != self.peer.identity.peer_id:
            if len(self.inbox) < LOCAL_INBOX:
                self.inbox.append((item.obj, False))

    def own(self, records: list[bytes]) -> None:
        """Our own records, for the local copy."""
        self.inbox.extend((open_record(r), True) for r in records)

    def work(self) -> None:
        """Re-score what came in, train the rounds that are ready (worker thread)."""
        from trainer.engine_hf import HFEngine, torch_threads  # deferred: heavy import

        batch, self.inbox = self.inbox, []
        for ro, own in batch:
            try:
                self.local.offer(self.rescorer.sample(ro), own)
            except Refused:
                self.refused += 1
        with torch_threads(self.config.model.threads):
            while self.local.round() is not None:
                if self.local.rounds % LOCAL_EVAL_EVERY == 1:
                    m = self.peer.manifest
                    names = [d.name for d in m.datasets for _ in range(d.weight)]
                    engine = HFEngine(self.local.model, self.engine.tokenizer, max_batch=64)
                    solved = heldout_solved(
                        engine, self.engine.tokenizer, heldout_items(names, 64), m.max_new_tokens
                    )
                    self.evals.append(
                        {
                            "round": self.local.rounds,
                            "solve_rate": round(sum(solved) / len(solved), 4),
                        }
                    )
        st = self.local.trainer.status()
        self.io.status["local_train"] = {
            "own": self.local.own,
            "foreign": self.local.foreign,
            "rounds": self.local.rounds,
            "published": [],  # local training never publishes
            "heldout_solve_rate": self.evals[-1]["solve_rate"] if self.evals else None,
            "evals": self.evals[-20:],
            "refused": self.refused,
            "train_tokens_per_s": st["train_tokens_per_s"],
        }


LOCAL_INBOX = 4096
LOCAL_EVAL_EVERY = 10


async def run(peer: InferencePeer, config: InferenceConfig, io: RoleIO) -> None:
    """Load the engine, produce until cancelled or bounded, and always close the engine
    (vLLM's engine runs in child processes that must not outlive the node)."""
    loaded: list[Any] = []  # filled by the thread even if we are cancelled while it loads
    engine_pids: set[int] = set()  # the engine's own processes (vLLM: engine core, worker)

    def load_it() -> None:
        before = set(child_pids())
        loaded.append(load(config, peer.manifest))
        engine_pids.update(set(child_pids()) - before)

    try:
        await trio.to_thread.run_sync(load_it)
        await _produce(peer, config, io, loaded[0])
    finally:
        if loaded:
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await trio.to_thread.run_sync(loaded[0].close)
            left = sorted(engine_pids & set(child_pids()))
            io.status["engine_processes"] = {"started": len(engine_pids), "left": left}
            if engine_pids:
                io.say(
                    f"inference: engine closed; {len(left)} of its {len(engine_pids)} processes left"
                )


def child_pids() -> list[int]:
    """Live descendant processes of this one, less Python's multiprocessing resource
    tracker (a helper of the standard library that exits with us, not an engine process)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "multiprocessing.resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.Error:
            continue
        out.append(child.pid)
    return out


def pace_for(config: AdmissionConfig, factor: float) -> tuple[float, float]:
    """(headers a second, burst) a worker publishes at: `PACE_MARGIN` of what its peers
    admit from it (`signer_rate` and `signer_burst` scaled by its verified standing,
    `factor`, within the per-connection `sender_rate`/`sender_burst`)."""
    rate = PACE_MARGIN * min(config.signer_rate * factor, config.sender_rate)
    burst = PACE_MARGIN * min(config.signer_burst * factor, config.sender_burst)
    return rate, max(1.0, burst)


def _pace(peer: InferencePeer, io: RoleIO) -> None:
    """Follow what peers admit from us now: our own admission hears the same verdicts
    about our work as theirs, so it scales our signer rate as they do. A header batch never
    holds more than that burst (a full batch over it would be dropped in part)."""
    outbox = peer.outbox
    factor = peer.admission.signer_rate_factor(peer.identity.peer_id)
    rate, burst = pace_for(peer.admission.config, factor)
    batch = max(1, min(peer.cfg.header_batch, int(burst)))
    outbox.set_max_batch(batch)
    outbox.item_rate_per_s, outbox.item_burst = rate, max(float(batch), burst)
    io.status.update(pace_per_s=round(rate, 2), standing_factor=factor)


async def _produce(peer: InferencePeer, config: InferenceConfig, io: RoleIO, engine: Any) -> None:
    from verify.toploc import build_proofs_bytes_many  # deferred: heavy import

    manifest = peer.manifest

    # the model directory is version 0; the vLLM engine's own copy of the weights swaps too
    swap = HotSwap(peer, engine.model, version=0, also_load=getattr(engine, "load_weights", None))
    local = _Local(peer, config, io, engine) if config.local_train else None
    status = await trio.to_thread.run_sync(peer.store.produced_status)
    counter = status["produced"]
    tmp = config.data_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    produced = 0
    rewards: list[float] = []
    started = time.monotonic()
    io.status.update(produced=0, counter=counter)
    io.say(f"inference: model loaded; resuming at counter {counter}")
    first_version = await swap.before_batch(lambda m: io.say(f"inference: {m}"))
    last_print = time.monotonic()
    while config.max_rollouts is None or produced < config.max_rollouts:
        if not io.producing:
            io.say(f"inference: paused after {produced} rollouts (still serving them)")
            io.status["paused"] = True
            break
        await _wait_for_peers(peer, io, produced)
        version = await _within_budget(peer, config, io, swap, produced, first_version)
        io.status.update(policy_version=version, swaps={str(v): t for v, t in swap.swaps.items()})
        n = (
            config.batch_size
            if config.max_rollouts is None
            else min(config.batch_size, config.max_rollouts - produced)
        )
        out = tmp / f"batch-{counter}.msgpack"
        summary = await trio.to_thread.run_sync(
            functools.partial(
                generate_records,
                engine=engine,
                manifest=manifest,
                identity=peer.identity,
                n=n,
                out=out,
                policy_version=version,
                start_counter=counter,
                batch_size=n,
                build_proofs=build_proofs_bytes_many,
                say=lambda _m: None,
            )
        )
        with open(out, "rb") as fh:
            records = list(read_records(fh))
        out.unlink(missing_ok=True)
        _pace(peer, io)
        await peer.produce_many(records)
        if local is not None:
            local.own(records)
            await trio.to_thread.run_sync(local.work)
        counter += len(records)
        produced += len(records)
        rewards.append(float(summary["reward_mean"]) * len(records))
        io.status.update(
            produced=produced,
            counter=counter,
            reward_mean=round(sum(rewards) / max(produced, 1), 4),
            tokens_per_s=summary.get("tokens_per_s"),
            rollouts_per_min=round(produced / max(time.monotonic() - started, 1e-9) * 60, 1),
        )
        if time.monotonic() - last_print >= 30.0:
            last_print = time.monotonic()
            io.say(
                f"inference: {produced} rollouts produced, reward mean {io.status['reward_mean']}, "
                f"{io.status['rollouts_per_min']}/min"
            )
    else:
        io.say(f"inference: produced {produced} rollouts (bound reached)")
    await trio.sleep_forever()
