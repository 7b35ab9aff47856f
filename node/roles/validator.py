"""The validator role: audit a fraction of the rollouts it admits and gossip signed verdicts.

Which rollouts: those whose audit-sample ticket (`protocol.audit_sample`: our own
deterministic signature over the rollout id) falls below `audit_fraction`. Only we can
compute it, so a producer cannot re-sign its rollout until no validator samples it; the
ticket travels in the verdict, so anyone can check afterwards that the sample was honest.
In what order:
`protocol.audit_queue.AuditQueue` (fraud re-checks, then the newest policy version first;
records the trainer can no longer use are dropped unaudited, `dropped_stale`). How: one
batched prefill per batch with `verify.auditor.audit_many` (proof statistics, sampling
replay, log-probs, task and reward re-derived by `trainer.judge.make_judge`), in a
worker thread. A failed audit also costs the producer score (`Peer.report`), which bans
a peer that keeps cheating.

Fraud evidence (`protocol.fraud`): another validator's failed verdict opens a case; we
take the record (the store, or the body pull that every header starts) and audit it
ourselves, unsampled, with the same machinery. Reproduced, the producer is banned; not
reproduced, the accusing validator pays. The re-audit's verdict is published (with no
sample ticket), and so is our verdict of a record audited only for its window once
another validator fails it: a trainer decides a failed rollout only once a second
validator's verdict confirms or overturns it (`protocol.verified`, `reaudits_published`).

Per producer (`verify.producer`): every audited record's `logprob_err_mean` joins its
producer's window (an aligned block of its task counters). Records sampled one by one
almost never fill a window, so a window whose own ticket is sampled
(`producer_window_fraction`, `protocol.audit_sample.window_ticket`) is audited whole; its
records that no record ticket sampled publish no verdict (`window_audited`). A window
is judged when it is full or `verify.producer.CLOSE_AFTER_S` after it opened, each header
of an audited window whose body never came counting as a failed record (`producer_windows`
counts them); one with at least `WINDOW_OVER` records over the calibrated limit costs the
producer `PRODUCER_PENALTY` here, and so do its records over the limit when they fail the
sequential rule over all of its audited records (`protocol.producer_cases`); either
finding, about any number of records, is gossiped as a signed `ProducerClaim` that any
peer re-checks and a trainer acts on. Another validator's claim is re-checked like a failed verdict
(`protocol.producer_cases`): we take every record of the window, audit each ourselves,
and the producer or the accuser pays by our own statistic (`producer_findings`,
`producer_findings_last`, `producer_claims` in status).

Equivocation (`protocol.equivocation`): a record made under a policy version whose
manifests a trainer key equivocated over is neither passed nor failed here (`disputed`):
the honest halves of a split swarm hold different weights under one number, and neither
may charge the other for it.

Standing (`protocol.standing.StandingBook`, from our own audits): a producer on probation
(a fresh key, or one that failed) has every record audited and its windows judged whole;
one in good standing is sampled at `audit_fraction`. The pass verdicts of a producer on
probation are held (`protocol.standing.HeldPasses`) until the record's window is judged
clean, and dropped if it is not; we publish no pass verdict for a producer we banned
(`withheld_passes`): a record that passes alone says nothing of a producer whose window
failed, and a trainer would train on it.

Shape: `ValidatorRole` holds all of the above; `run` loads the model in a worker thread,
hands the peer's admitted items to `ValidatorRole.on_deliver` and runs its
`audit_forever` loop, in one nursery (where record lookups for open cases run too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio

from node.local_model import check_device, load_calibration
from node.paths import resolve_model
from node.peer.ports import ValidatorPeer
from node.roles.config import RoleIO, ValidatorConfig
from node.roles.policy_versions import HeldVersions
from protocol import penalties
from protocol.admission import Admitted, Kind
from protocol.audit_queue import AuditQueue
from protocol.audit_sample import sample_ticket, sampled, window_ticket
from protocol.codec import encode
from protocol.fraud import Audit, FraudCases, NeedRecord, Punish
from protocol.identity import Identity
from protocol.producer_cases import PRODUCER_PENALTY, ProducerCases
from protocol.rollout import open_record
from protocol.standing import HeldPasses, StandingBook, State, cleared_passes
from protocol.wire import ProducerClaim, RolloutRecord
from trainer.model_dir import load_model_dir
from verify.producer import ProducerTally

PULLS_BODIES = True
NEEDS_MODEL = True
FAILED_AUDIT_PENALTY = penalties.FAILED_AUDIT.cost
QUEUE = 1024
CLOSE_EVERY_S = 10.0  # how often windows past their time are judged
UNPUBLISHED_KEPT = 4096  # window-only verdicts kept, to answer another validator's fail
SAID_KEPT = 65_536  # rollouts we published a verdict on (one verdict per rollout)

# Queued for a window audit only (`protocol.audit_sample.window_ticket`): the record's own
# ticket did not sample it, so its verdict counts here and is not published.
WINDOW_ONLY = b""


def selected(identity: Identity, run_id: str, rollout_id: bytes, fraction: float) -> bytes | None:
    """Our sample: the ticket of about `fraction` of rollout ids (None for the others),
    unpredictable to producers; the ticket travels in the verdict."""
    ticket = sample_ticket(identity, run_id, rollout_id)
    return ticket if sampled(ticket, fraction) else None


def load(
    config: ValidatorConfig, manifest: Any, say: Callable[[str], None]
) -> tuple[Any, Any, Any, Any]:
    """Model, judge, audit settings and EOS ids (blocking: call in a thread)."""
    from trainer.engine_hf import torch_threads  # deferred: heavy import
    from trainer.judge import make_judge  # deferred: heavy import
    from verify.auditor import eos_token_ids, settings_for_run  # deferred: heavy import

    path = resolve_model(config.model.model, manifest.model, config.model.models_dir)
    device = check_device(config.model.device, manifest.worker_precision)
    with torch_threads(config.model.threads):
        model, tokenizer = load_model_dir(path)
        model = model.to(device)  # audits judge on this device (at the run's precision)
    settings, note = load_calibration(path, settings_for_run(manifest), manifest)
    say(f"validator: {manifest.worker_precision} workers; {note}")
    return model, make_judge(manifest, tokenizer), settings, eos_token_ids(model)


class ValidatorRole:
    """One validator at work: the audit queue, its counts, the models of the versions it
    holds, the producer tally and the open fraud and claim cases. Admitted items come in
    through `on_deliver` (event loop); `audit_forever` audits the queue batch by batch."""

    def __init__(
        self,
        peer: ValidatorPeer,
        config: ValidatorConfig,
        io: RoleIO,
        model: Any,
        judge: Any,
        settings: Any,
        eos_ids: Any,
    ) -> None:
        self.peer, self.config, self.io = peer, config, io
        self.judge, self.settings, self.eos_ids = judge, settings, eos_ids
        self.queue = AuditQueue(peer.manifest.max_staleness, QUEUE)
        self.kick_send, self.kick_receive = trio.open_memory_channel[None](1)
        self.counts = {
            "seen": 0,
            "sampled": 0,
            "passed": 0,
            "failed": 0,
            "queue_full": 0,
            "unauthorized": 0,
            "rechecks": 0,
            "dropped_stale": 0,
            "producer_findings": 0,
            "window_audited": 0,
        }
        self.reasons: dict[str, int] = {}
        self.fraud = FraudCases()
        th = settings.thresholds if settings.precision == "fp32" else settings.bf16_thresholds
        self.producers = ProducerTally(th.producer_logprob_err_median)
        self.claims = ProducerCases(th.producer_logprob_err_median)
        self.findings: list[dict[str, Any]] = []
        self.standing = StandingBook()
        self.held_passes = HeldPasses()
        self.last_close = time.time()
        self.held = HeldVersions(model)
        # rollout id -> our verdict of a window-only audit, published if another fails it
        self.unpublished: OrderedDict[bytes, Any] = OrderedDict()
        self.said: OrderedDict[bytes, None] = OrderedDict()  # rollouts we published a verdict on
        # set by `run` while it runs (record lookups start in it); None once it stops, as
        # deliveries go on while the node drains
        self.nursery: trio.Nursery | None = None

    # -- cases and the queue -------------------------------------------------------------

    async def publish(self, verdict: Any) -> None:
        """Publish our verdict on a rollout, at most once: a second one (a re-audit that
        came out otherwise at a borderline) would be two conflicting objects of one slot,
        evidence of equivocation against our own key (`protocol.equivocation`). The store
        remembers what we said before a restart."""
        me = self.peer.identity.peer_id
        rid = verdict.rollout_id
        if rid not in self.said and any(
            v.validator == me
            for v in await trio.to_thread.run_sync(self.peer.store.verdicts_for, rid)
        ):
            self.said[rid] = None
        if rid in self.said:
            self.counts["said_before"] = self.counts.get("said_before", 0) + 1
            return
        self.said[verdict.rollout_id] = None
        while len(self.said) > SAID_KEPT:
            self.said.popitem(last=False)
        await self.peer.publish_verdict(verdict)

    def carry_out(self, actions: list[Any], record: Any = None) -> None:
        """Carry out what a fraud case or a producer claim decided."""
        for action in actions:
            if isinstance(action, Punish):
                self.peer.report(action.peer, action.penalty, action.reason, action.offence)
            elif isinstance(action, NeedRecord) and self.nursery is not None:
                self.nursery.start_soon(self.from_store, action.rollout_id)
            elif isinstance(action, Audit) and record is not None:
                self.enqueue(record, None)  # no ticket: a re-check, not our sample
                self.counts["rechecks"] += 1

    def enqueue(self, ro: Any, ticket: bytes | None) -> None:
        """Queue a record for audit (`ticket` None: a re-check for an open case)."""
        version = ro.envelope.policy_version
        for old_ro, old_ticket in self.queue.push((ro, ticket), version, recheck=ticket is None):
            self.counts["queue_full"] += 1
            if old_ticket is None:
                self.cannot_judge(old_ro.rollout_id)
        self.io.status["queued"] = len(self.queue)
        with contextlib.suppress(trio.WouldBlock):
            self.kick_send.send_nowait(None)

    def cannot_judge(self, rid: bytes) -> None:
        """We cannot judge `rid`: the open cases on it are dropped."""
        self.fraud.cannot_judge(rid)
        self.claims.cannot_judge(rid)

    def wanted(self, rid: bytes) -> bool:
        """Whether an open fraud case or producer claim needs the record `rid`."""
        return self.fraud.is_open(rid) or self.claims.wants(rid)

    def record_here(self, ro: Any) -> None:
        """A record that an open fraud case or producer claim needs is held: audit it
        (once, whichever case asked)."""
        rid, now = ro.rollout_id, time.time()
        acts = list(self.fraud.record_held(rid, now)) if self.fraud.is_open(rid) else []
        if self.claims.wants(rid):
            acts += self.claims.record_held(rid, ro.envelope.signer, ro.header.counter, now)
        audits = [a for a in acts if isinstance(a, Audit)]
        self.carry_out([a for a in acts if not isinstance(a, Audit)] + audits[:1], ro)

    async def from_store(self, rid: bytes) -> None:
        """Look `rid` up in the store for an open case (the body pull brings it if not)."""
        row = await trio.to_thread.run_sync(self.peer.store.get_rollout, rid)
        if row is None or row.body is None or not self.wanted(rid):
            return  # the body pull brings it to on_deliver, or the case expires
        try:
            ro = open_record(encode(RolloutRecord(header=row.header, body=row.body)))
        except Exception:  # stored records were checked on the way in; be safe anyway
            self.cannot_judge(rid)
            return
        self.record_here(ro)

    # -- admitted items ------------------------------------------------------------------

    def on_deliver(self, item: Admitted) -> None:
        """Dispatch one admitted item by kind (verdict, claim, record, header)."""
        handler = {
            Kind.VERDICT: self.on_verdict,
            Kind.PRODUCER_CLAIM: self.on_claim,
            Kind.ROLLOUT_RECORD: self.on_record,
            Kind.ROLLOUT_HEADER: self.on_header,
        }.get(item.kind)
        if handler is not None:
            handler(item)

    def on_verdict(self, item: Admitted) -> None:
        """Another validator's failed verdict opens a fraud case."""
        v = item.obj
        if v.passed or item.envelope.signer == self.peer.identity.peer_id:
            return
        now = time.time()
        self.fraud.tick(now)
        self.carry_out(
            self.fraud.accused(v.rollout_id, v.producer, item.envelope.signer, v.reason, now)
        )
        mine = self.unpublished.pop(v.rollout_id, None)
        banned = self.standing.state(v.producer) is State.BANNED  # no passes for it
        if mine is not None and not banned and self.nursery is not None and self.may_publish():
            # We audited it for its window and said nothing: a second opinion is owed now.
            self.counts["reaudits_published"] = self.counts.get("reaudits_published", 0) + 1
            self.nursery.start_soon(self.publish, mine)

    def on_claim(self, item: Admitted) -> None:
        """Another validator's producer claim opens a claim case."""
        c = item.obj
        if item.envelope.signer == self.peer.identity.peer_id:
            return
        now = time.time()
        self.claims.tick(now)
        self.carry_out(self.claims.claimed(c.producer, c.rollout_ids, item.envelope.signer, now))

    def window_audited(self, producer: bytes, counter: int) -> bool:
        """Whether `producer`'s window of `counter` is audited whole: its window ticket
        is sampled, or the producer is not in good standing with us."""
        if self.standing.state(producer) is not State.GOOD:
            return True
        window = counter // self.producers.window
        ticket = window_ticket(self.peer.identity, self.peer.run_id, producer, window)
        return sampled(ticket, self.config.producer_window_fraction)

    def on_header(self, item: Admitted) -> None:
        """A header: if its window is audited whole, its body is expected (a body that
        never comes counts as a failed record of the window)."""
        now = time.time()
        if self.window_audited(item.envelope.signer, item.obj.counter):
            self.producers.expect(item.envelope.signer, item.obj.counter, item.content_id, now)
        if now - self.last_close >= CLOSE_EVERY_S and self.nursery is not None:
            self.last_close = now
            self.nursery.start_soon(self.close_windows, now)

    async def close_windows(self, now: float) -> None:
        """Judge the producers' windows past their time."""
        authorized = self.peer.admission.authority.may_judge(self.peer.identity.peer_id)
        for found in self.producers.close(now):
            await self.on_finding(found, authorized)
        await self.publish_cleared()

    async def publish_cleared(self) -> None:
        """Publish the held pass verdicts of the windows judged clean."""
        for verdict in cleared_passes(
            self.producers.take_cleared(), self.held_passes, self.standing
        ):
            await self.publish(verdict)

    def on_record(self, item: Admitted) -> None:
        """A rollout record: for an open case, sampled by its own ticket (every record of
        a producer on probation), or queued for the audit of its producer's window."""
        peer, config = self.peer, self.config
        if self.wanted(item.content_id):
            self.record_here(item.obj)
        self.counts["seen"] += 1
        ro = item.obj
        signer, counter = ro.envelope.signer, ro.header.counter
        fraction = self.standing.audit_fraction(signer, config.audit_fraction)
        ticket = selected(peer.identity, peer.run_id, item.content_id, fraction)
        if ticket is None and not self.window_audited(signer, counter):
            return
        self.producers.body_held(signer, counter, time.time())
        self.enqueue(ro, WINDOW_ONLY if ticket is None else ticket)
        self.counts["sampled"] += ticket is not None

    # -- auditing ------------------------------------------------------------------------

    async def audit_forever(self) -> None:
        """Audit the queue batch by batch, until cancelled."""
        while True:
            batch = await self.next_batch()
            if not batch:
                continue
            known = await self.judgeable(batch)
            if not known:
                continue
            started = time.monotonic()
            judged = await trio.to_thread.run_sync(self.audit_held, known)
            authorized = self.may_publish()
            for (ro, ticket), verdict in judged:
                await self.settle(ro, ticket, verdict, authorized)
            self.publish_status(started, len(judged))

    async def next_batch(self) -> list[Any]:
        """Wait for queued records; take up to `batch_size` of them, the newest version first."""
        while not self.queue:
            await self.kick_receive.receive()
        weights = self.peer.weights
        newest = weights.newest() if weights is not None else None
        if newest is not None:
            self.queue.set_newest(newest)
        batch = self.queue.take(self.config.batch_size)
        self.counts["dropped_stale"] = self.queue.dropped["stale"]
        self.io.status.update(queued=len(self.queue), queue_capacity=self.queue.capacity)
        return batch

    async def judgeable(self, batch: list[Any]) -> list[Any]:
        """The items of `batch` whose version's model we hold (fetched first if need be).

        Version-aware: each record is judged with the weights of the version it claims.
        A version this validator does not hold is not judged at all (no verdict, no
        penalty: our lack must not cost the producer); `unknown_version` counts them.
        A disputed version (`protocol.equivocation`) is judged by nobody: `disputed`."""
        disputed = self.peer.admission.equivocations.is_disputed
        for ro, _ticket in batch:
            if disputed(ro.envelope.policy_version):
                self.cannot_judge(ro.rollout_id)
                self.counts["disputed"] = self.counts.get("disputed", 0) + 1
        batch = [item for item in batch if not disputed(item[0].envelope.policy_version)]
        for version in {ro.envelope.policy_version for ro, _ in batch}:
            await self.held.fetch(self.peer, version)
        known = [item for item in batch if self.held.holds(item[0].envelope.policy_version)]
        for ro, ticket in batch:
            if ticket is None and not self.held.holds(ro.envelope.policy_version):
                self.cannot_judge(ro.rollout_id)
        self.counts["unknown_version"] = (
            self.counts.get("unknown_version", 0) + len(batch) - len(known)
        )
        return known

    def audit_held(self, batch: list[Any]) -> list[tuple[Any, Any]]:
        """(item, verdict) per item, each version's records against that version's model
        (blocking: runs in a worker thread)."""
        from trainer.engine_hf import torch_threads  # deferred: heavy import
        from verify.auditor import audit_many  # deferred: heavy import

        by_version: dict[int, list[Any]] = {}
        for item in batch:
            by_version.setdefault(item[0].envelope.policy_version, []).append(item)
        out = []
        with torch_threads(self.config.model.threads):
            for version, items in sorted(by_version.items()):
                rollouts = [ro for ro, _ in items]
                verdicts = audit_many(
                    rollouts,
                    self.held.get(version),
                    judge=self.judge,
                    eos_ids=self.eos_ids,
                    settings=self.settings,
                )
                out += list(zip(items, verdicts, strict=True))
                key = f"audited_v{version}"
                self.counts[key] = self.counts.get(key, 0) + len(items)
        return out

    def may_publish(self) -> bool:
        """Whether our verdicts count (a validator key or a delegation); said once if not."""
        authorized = self.peer.admission.authority.may_judge(self.peer.identity.peer_id)
        if not authorized and not self.counts["unauthorized"]:
            self.io.say(
                "validator: this key is not in the run's validator_keys and holds no "
                "delegation: auditing, but not publishing verdicts nobody would count"
            )
        return bool(authorized)

    async def settle(self, ro: Any, ticket: bytes | None, verdict: Any, authorized: bool) -> None:
        """What one verdict decides: open cases, the producer's window, the published
        verdict, the counts and the producer's score."""
        now = time.time()
        if self.peer.admission.equivocations.is_disputed(ro.envelope.policy_version):
            self.cannot_judge(ro.rollout_id)  # the evidence came while it was audited
            return
        metrics = {m.name: m.value for m in verdict.metrics}
        case = self.fraud.is_open(ro.rollout_id)
        self.carry_out(self.fraud.audited(ro.rollout_id, verdict.passed, verdict.reason, now))
        self.carry_out(self.claims.audited(ro.rollout_id, metrics.get(self.producers.stat), now))
        if ticket is None:
            if case and authorized:  # the re-audit's word: no validator decides alone
                self.counts["reaudits_published"] = self.counts.get("reaudits_published", 0) + 1
                await self.publish(verdict)
            return  # a re-check decides nothing else here
        signer = ro.envelope.signer
        probation = self.standing.state(signer) is State.PROBATION
        if not (verdict.passed and probation):  # a held pass counts once its window is clean
            self.standing.audited(signer, verdict.passed, verdict.reason)
        now_verdict = None
        if ticket == WINDOW_ONLY:
            self.counts["window_audited"] += 1  # no ticket samples it: nothing to publish
            self.unpublished[ro.rollout_id] = verdict  # unless another validator fails it
            while len(self.unpublished) > UNPUBLISHED_KEPT:
                self.unpublished.popitem(last=False)
        elif not authorized:
            self.counts["unauthorized"] += 1
        elif verdict.passed and probation:  # published (and counted) once its window is clean
            window = ro.header.counter // self.producers.window
            self.held_passes.hold(
                signer, window, dataclasses.replace(verdict, sample_ticket=ticket)
            )
        else:
            now_verdict = dataclasses.replace(verdict, sample_ticket=ticket)
        found = self.producers.add(signer, ro.header.counter, ro.rollout_id, metrics, now)
        if found is not None:
            await self.on_finding(found, authorized)
        if (
            now_verdict is not None
            and now_verdict.passed
            and self.standing.state(signer) is State.BANNED
        ):
            self.counts["withheld_passes"] = self.counts.get("withheld_passes", 0) + 1
        elif now_verdict is not None:
            await self.publish(now_verdict)
        await self.publish_cleared()
        if verdict.passed:
            self.counts["passed"] += 1
        else:
            self.counts["failed"] += 1
            self.reasons[verdict.reason] = self.reasons.get(verdict.reason, 0) + 1
            self.peer.report(
                ro.envelope.signer,
                FAILED_AUDIT_PENALTY,
                f"failed audit: {verdict.reason}",
                penalties.FAILED_AUDIT.name,
            )

    async def on_finding(self, found: Any, authorized: bool) -> None:
        """Records of a producer over the limit (a window, or a span failing the sequential
        rule): it pays here, loses its standing with us, and the claim is gossiped, whatever
        the number of records (a peer re-checking it that cannot pull a withheld body drops
        the case, nobody pays; a trainer bans on it)."""
        self.counts["producer_findings"] += 1
        self.standing.ban(found.producer, f"producer {found.rule} over the limit")
        self.held_passes.failed(found.producer)
        self.peer.report(
            found.producer,
            PRODUCER_PENALTY,
            f"producer {found.rule} statistic {found.statistic:.3g} over {found.limit:.3g}",
            penalties.PRODUCER_WINDOW.name,
        )
        self.findings.append(
            {
                "producer": found.producer.hex()[-12:],
                "rule": found.rule,
                "statistic": found.statistic,
                "limit": found.limit,
                "records": len(found.rollout_ids),
                "missing": found.missing,
            }
        )
        del self.findings[:-8]
        if authorized:
            await self.peer.publish_producer_claim(
                ProducerClaim(
                    producer=found.producer,
                    rollout_ids=found.rollout_ids,
                    statistic=self.producers.stat,
                    median=min(found.statistic, 1e6),
                    limit=found.limit,
                )
            )

    def publish_status(self, started: float, audited: int) -> None:
        """The audit counts and the time per rollout, into the role's status."""
        self.io.status.update(
            **self.counts,
            fail_reasons=dict(self.reasons),
            fraud=dict(self.fraud.counts),
            producer_findings_last=list(self.findings),
            producer_windows=self.producers.judged,
            producer_claims=dict(self.claims.counts),
            audit_s_per_rollout=round((time.monotonic() - started) / audited, 3),
        )


async def run(peer: ValidatorPeer, config: ValidatorConfig, io: RoleIO) -> None:
    """Load the model, then audit what the peer admits until cancelled."""
    model, judge, settings, eos_ids = await trio.to_thread.run_sync(
        load, config, peer.manifest, io.say
    )
    role = ValidatorRole(peer, config, io, model, judge, settings, eos_ids)
    async with trio.open_nursery() as nursery:
        role.nursery = nursery
        peer.on_deliver(role.on_deliver)
        io.say(f"validator: model loaded; auditing {config.audit_fraction:.0%} of rollouts")
        try:
            await role.audit_forever()
        finally:
            role.nursery = None
