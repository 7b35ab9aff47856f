"""The trainer role: train on checked rollouts and publish policy versions.

Which rollouts count is the run's rule, not this module's: `protocol.verified.judge` (only
verdicts of keys that may judge, never the producer's own, naming the right producer, with
the manifest's quorum) and `protocol.accounting.WorkLedger` (dense counters: a producer
that withholds counters past its allowance is refused and scored down, and withheld work
counts as reward 0). Which of them train is `protocol.standing.StandingBook`'s rule, kept
from the verdicts heard: a rollout with a pass verdict of its own; or, from a producer in
good standing (its probation's audits passed, none failed), an unaudited one that waited
`standing.HOLD_S` for an audit to land. No single validator decides alone when the run
has two or more: a failed verdict contests its rollout until a second validator's
re-audit confirms it (a rejection, which bans the producer here: its waiting rollouts are
dropped and nothing of it trains again) or outvotes it, and a producer claim bans once a
second validator claims the same producer (`settle`, `judgement`). Each validator's pass
rate and agreement with the decided rollouts are kept (`protocol.judges.JudgeBook`,
`validators` in status): a vote against a decision costs its validator, and one that
keeps disagreeing is flagged and no longer counted. Records of a policy version a trainer
key equivocated over are neither trained nor judged (`protocol.equivocation`)
(`trained_verified`, `trained_unaudited`, `producers_banned`, `producers_probation`
in status). A rollout picked is then re-scored from its task
(`trainer.samples.Rescorer`: a claimed reward that differs is never trained on), queued in
`trainer.train_loop.Trainer` (staleness bound S from the manifest) and trained on in
groups; every `rl.publish_every` groups the trainer checkpoints and publishes the next
version through `peer.weights.publish` (the broadcast path). On restart it resumes from
its checkpoint (`<data dir>/trainer/`) at the version it last published; a version number
is never handed out twice (the checkpoint is written before the publish, and the weights
store numbers versions `newest + 1`). With `--publish-every S` it trains nothing and
publishes perturbed weights every S seconds instead (`node.roles.publisher`: a drill of the
broadcast path).

Resource handling: model work (re-scoring, forward/backward, AdamW) runs in a worker
thread, one batch at a time, so the event loop keeps its deadlines. Rollouts waiting for a
verdict are bounded (`MAX_WAITING`, oldest dropped) and so are tracked rollouts.
Error handling: a rollout that cannot be re-scored is counted under its refusal reason and
dropped; a failed publish is logged in `status` and retried at the next cadence point.

Credit (`protocol.credit.CreditBook`): a producer is credited the reward the trainer
re-scores from each body it holds (every held body is re-scored at the next train turn,
verified or not), 0 for a record a judge failed at its version; a
header whose body never arrives within the body pull window is a skipped counter (reward
0), a claim whose version goes back is out of order (0, never trained on; going back again
to another version within 10 minutes of signed time costs `penalties.OUT_OF_ORDER`), a key
with few counters yet is credited at most the swarm's mean, a claim of a version
first heard `credit.STALE_AFTER_S` after a newer one was published (`on_published`) is
stale (0, never trained on), and a header
whose claimed reward differs from the re-score costs its producer `penalties.FALSE_CLAIM`. The trainer's admission refuses rollouts of versions it has not
published (`AdmissionConfig.publishes_versions`).

Shape: `Collector` keeps what the trainer heard; `TrainerRole` holds the rollouts waiting
for verdicts, the model and its trainer, and runs the train / publish / report turns; its
status counts what became of the rollouts (`fates`, `node.roles.rollout_fates`).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import trio

from node.errors import CommandError
from node.local_model import check_datasets
from node.paths import resolve_model
from node.peer.ports import TrainerPeer
from node.roles.config import ModelChoice, RoleIO, TrainerConfig
from node.roles.publisher import publish_loop
from node.roles.rollout_fates import Fates
from node.weights.store import WeightsError
from protocol import penalties
from protocol.accounting import WITHHELD_PENALTY, GapCharges, WorkLedger
from protocol.admission import Admitted, Kind
from protocol.authority import Authority
from protocol.body_pull import PullConfig
from protocol.credit import CreditBook, FalseClaim, OutOfOrder
from protocol.judges import Charge, JudgeBook
from protocol.standing import Banned, Decision, StandingBook, State
from protocol.verified import Status, VerifiedRule, Vote, judge
from trainer.checkpoint import snapshot_state
from trainer.groups import heldout_items, heldout_solved
from trainer.model_dir import load_model_dir
from trainer.samples import Refused, Rescorer

PULLS_BODIES = True
NEEDS_MODEL = True
MAX_WAITING = 8192  # opened rollouts waiting for verdicts
STEP_POLL_S = 1.0
PARTIAL_WAIT_S = 15.0  # a group with >= 2 verified members trains after waiting this long
LEARN_EVAL_TASKS = 128  # held-out tasks scored at the start and after a published version
# ... but at most once per this many seconds: scoring 128 tasks costs about as much CPU as
# the rollouts of 8 groups, and on a small swarm that CPU is the workers'.
LEARN_EVAL_EVERY_S = 45.0
MAX_TRACKED = 100_000
MAX_VOTES = 16  # votes remembered per rollout
MAX_WENT_BACK = 1024  # out-of-order charges kept between two `take_went_back` calls
REPORT_EVERY_S = 2.0
CLOSE_TIMEOUT_S = 60.0  # the other ranks stop (they exit on STOP; stop_local kills after 30 s)
PRINT_EVERY_S = 30.0


class _Track:
    __slots__ = (
        "body",
        "counter",
        "judge_score",
        "producer",
        "reward",
        "signed_at",
        "task",
        "version",
        "votes",
    )

    def __init__(self) -> None:
        self.body = False
        self.producer = b""
        self.counter = 0
        self.reward = 0.0
        self.judge_score = 0.0  # the re-score in the first passing verdict
        self.version = 0
        self.signed_at = 0.0  # when its producer signed it (go-backs are judged by it)
        self.task: tuple[str, int] | None = None
        self.votes: list[Vote] = []


class Collector:
    """What the trainer heard: rollouts, votes and counters (driven by `on_deliver`)."""

    def __init__(
        self,
        authority: Authority,
        rule: VerifiedRule,
        ledger: WorkLedger | None = None,
        pull_window_s: float = PullConfig().window_s,
    ):
        self.authority, self.rule = authority, rule
        self.gaps = GapCharges(ledger)
        self.ledger = self.gaps.ledger
        self.tracks: OrderedDict[bytes, _Track] = OrderedDict()
        self.credit = CreditBook(pull_window_s=pull_window_s)  # the body puller's window
        self.judges = JudgeBook()  # the validators' pass rates, agreement and flags
        self.went_back: list[bytes] = []  # producers to charge OUT_OF_ORDER (`take_went_back`)

    def track(self, rid: bytes) -> _Track:
        """The record kept of rollout `rid` (a new one past `MAX_TRACKED` forgets the oldest)."""
        t = self.tracks.get(rid)
        if t is None:
            t = self.tracks[rid] = _Track()
            if len(self.tracks) > MAX_TRACKED:
                self.tracks.popitem(last=False)
        return t

    def on_deliver(self, item: Admitted) -> list[bytes]:
        """Take one admitted item; returns the producers that just went past their
        allowance (charge each once). The producer of a claim going back again
        (`protocol.credit.OutOfOrder`) joins `went_back`: charge it `penalties.OUT_OF_ORDER`."""
        now = item.received_at
        if item.kind in (Kind.ROLLOUT_RECORD, Kind.ROLLOUT_HEADER):
            header = item.obj.header if item.kind is Kind.ROLLOUT_RECORD else item.obj
            t = self.track(item.content_id)
            t.producer = item.envelope.signer
            t.reward = header.reward
            t.version = item.envelope.policy_version
            t.counter = header.counter
            t.signed_at = item.envelope.timestamp_ms / 1000.0
            t.task = (header.dataset, header.task_index)
            t.body = t.body or item.kind is Kind.ROLLOUT_RECORD
            back = self.credit.on_header(
                t.producer, t.counter, t.version, t.reward, now, signed_at=t.signed_at
            )
            self._judged(t, now)
            if back is not None and len(self.went_back) < MAX_WENT_BACK:
                self.went_back.append(back.producer)
            return self.gaps.on_rollout(t.producer, header.counter, header.reward, now)
        if item.kind is Kind.VERDICT:
            t = self.track(item.obj.rollout_id)
            if len(t.votes) < MAX_VOTES:
                t.votes.append(Vote(item.envelope.signer, item.obj.producer, item.obj.passed))
                first_pass = item.obj.passed and not any(v.passed for v in t.votes[:-1])
                if first_pass and item.obj.producer == (t.producer or item.obj.producer):
                    t.judge_score = float(item.obj.reward_rescored)
            self._judged(t, now)
        return self.on_time(now)

    def on_published(self, version: int, now: float) -> None:
        """We published `version` at `now` (or resumed at it): claims of older versions
        heard `credit.STALE_AFTER_S` later are stale (`protocol.credit`)."""
        self.credit.on_published(version, now)

    def take_went_back(self) -> list[bytes]:
        """The producers to charge `penalties.OUT_OF_ORDER` since the last call (one entry
        per claim going back again; at most `MAX_WENT_BACK` between calls)."""
        out, self.went_back = self.went_back, []
        return out

    def on_rescored(self, rid: bytes, reward: float, now: float) -> list[bytes]:
        """We re-scored the body of `rid` at `reward`; returns its producer if its header
        claimed another reward (charge it `penalties.FALSE_CLAIM`)."""
        t = self.tracks.get(rid)
        if t is None or not t.producer:
            return []
        false = self.credit.on_body(
            t.producer, t.counter, t.version, t.reward, reward, now, signed_at=t.signed_at
        )
        self._judged(t, now)
        if isinstance(false, OutOfOrder) and len(self.went_back) < MAX_WENT_BACK:
            self.went_back.append(false.producer)
        return [t.producer] if isinstance(false, FalseClaim) else []

    def _judged(self, t: _Track, now: float) -> None:
        if not t.producer:
            return
        st = self.status(t)
        if st in (Status.VERIFIED, Status.REJECTED):
            passed = st is Status.VERIFIED
            self.credit.on_judged(t.producer, t.counter, t.version, passed, t.judge_score, now)

    def on_time(self, now: float) -> list[bytes]:
        """Time passed: pull windows close (skipped counters) and gaps are judged; returns
        the producers that just went past their allowance."""
        self.credit.on_time(now)
        return self.gaps.on_time(now)

    def credited_reward(
        self, producer: bytes, now: float = math.inf, weight: float = 1.0
    ) -> float | None:
        """The producer's credit: re-scored rewards of its held bodies (failed ones 0),
        with skipped and withheld counters at 0 (`protocol.credit`), times `weight`: its standing's
        `StandingBook.credit_weight` (0 once banned: a failed audit claws it all back)."""
        s = self.ledger.standing(producer, now)
        credited = self.credit.credited_reward(producer, s.withheld if s is not None else 0)
        return None if credited is None else credited * weight

    def on_late(self, item: Admitted) -> list[bytes]:
        """A rollout admission refused as too stale (`Reject.late`): its producer published
        it, only late, so its counter is no gap; nothing else of it counts — its claimed
        reward neither (reward 0: nobody re-scores a late rollout, so a shopper cannot turn
        withheld counters into claimed solves by signing them stale)."""
        header = item.obj.header if item.kind is Kind.ROLLOUT_RECORD else item.obj
        return self.gaps.on_rollout(item.signer, header.counter, 0.0, item.received_at)

    def status(self, t: _Track) -> Status:
        """Verified, rejected or pending, by the run's rule over its votes."""
        if not t.producer:
            return Status.PENDING
        return judge(t.producer, t.votes, self.authority, self.rule, self.judges.flagged_keys())

    def summarize(self, version: int, max_staleness: int, now: float = math.inf) -> dict[str, Any]:
        """Status figures: bodies held, verified, usable at `version`, refused producers."""
        statuses = [(t, self.status(t)) for t in self.tracks.values() if t.body]
        verified = [t for t, s in statuses if s is Status.VERIFIED]
        usable = [
            t
            for t in verified
            if version - t.version <= max_staleness and self.ledger.allowed(t.producer, now)
        ]
        producers = {t.producer for t in self.tracks.values() if t.producer}
        refused = sorted(p for p in producers if not self.ledger.allowed(p, now))
        credit = [s for p in producers if (s := self.credit.standing(p))]
        return {
            "bodies": len(statuses),
            "verified": len(verified),
            "rejected": sum(1 for _, s in statuses if s is Status.REJECTED),
            "unverified": sum(1 for _, s in statuses if s in (Status.PENDING, Status.CONTESTED)),
            "contested": sum(1 for _, s in statuses if s is Status.CONTESTED),
            "usable_at_version": len(usable),
            "task_groups": len({t.task for t in usable}),
            "usable_reward_mean": round(sum(t.reward for t in usable) / len(usable), 4)
            if usable
            else None,
            "producers_refused": len(refused),
            "withheld": sum(s.withheld for p in producers if (s := self.ledger.standing(p))),
            "skipped": sum(s.skipped for s in credit),
            "false_claims": sum(s.false_claims for s in credit),
        }


def _load(choice: ModelChoice, manifest: Any, device: Any) -> tuple[Any, Any, dict[str, Any], Path]:
    """Model (on `device`, float32: the master), tokenizer, the starting weights' state
    dict (version 0) and the model directory (blocking)."""
    check_datasets(manifest, "run manifest")
    path = resolve_model(choice.model, manifest.model, choice.models_dir)
    model, tokenizer = load_model_dir(path)
    model = model.to(device)
    return model, tokenizer, model.state_dict(), path


def start_ranks(
    config: TrainerConfig, device: str, model_dir: Path, manifest: Any, step: Any
) -> tuple[Any, list[Any]]:
    """Rank 0 of the trainer's ranks (`trainer.distributed`): under torchrun the ranks it
    launched, with `nproc` > 1 the ones it spawns here; the others are sent the setup.
    (None, []) for a trainer alone (blocking: call in a thread)."""
    from trainer.distributed import (  # deferred: heavy import
        RankEnv,
        RankError,
        Ranks,
        follower_argv,
        rank_device,
        start_local,
    )
    from trainer.follower import RankSetup  # deferred: heavy import

    try:
        env = RankEnv.from_env()
        if env is None and config.nproc <= 1:
            return None, []
        if env is not None:
            if config.nproc > 1:
                raise CommandError("--nproc starts ranks on this machine: not under torchrun")
            ranks, procs = Ranks(env, rank_device(device, env.local_rank)), []
        else:
            argv = follower_argv(device, config.model.threads)
            ranks, procs = start_local(config.nproc, device, argv)
    except RankError as exc:
        raise CommandError(f"trainer: {exc}") from None
    ranks.share(RankSetup(str(model_dir), manifest, step))
    return ranks, procs


def train_ready(
    trainer: Any, rescorer: Any, ready: list[Any], threads: int | None, now: float
) -> int:
    """Re-score and queue `ready`, then step until a version is due or groups run out.
    Returns the number of steps taken (runs in a worker thread)."""
    from trainer.engine_hf import torch_threads  # deferred: heavy import

    for ro in ready:
        try:
            trainer.add(rescorer.sample(ro), now)
        except Refused as exc:
            trainer.refused[exc.reason] += 1
    trainer.flush_partial(now, PARTIAL_WAIT_S)
    steps = 0
    version = trainer.version
    with torch_threads(threads):
        while trainer.version == version and trainer.step() is not None:
            steps += 1
    return steps


def rescore_bodies(rescorer: Any, bodies: list[Any]) -> list[tuple[bytes, float]]:
    """(rollout id, re-scored reward) of each body of its assigned task (worker thread);
    a body that is not of its task is left out (admission and audits deal with it)."""
    out = []
    for ro in bodies:
        try:
            out.append((ro.rollout_id, rescorer.rescore(ro)))
        except Refused:
            pass
    return out


def _heldout(model: Any, tokenizer: Any, manifest: Any, threads: int | None) -> list[bool]:
    """Per task of `LEARN_EVAL_TASKS` held-out tasks of the run's mix, solved or not (worker
    thread; the same tasks and sampling seeds every time, so evaluations pair up)."""
    from trainer.engine_hf import HFEngine, torch_threads  # deferred: heavy import

    names = [d.name for d in manifest.datasets for _ in range(d.weight)]
    items = heldout_items(names, LEARN_EVAL_TASKS)
    with torch_threads(threads):
        engine = HFEngine(model, tokenizer, max_batch=LEARN_EVAL_TASKS)
        return heldout_solved(engine, tokenizer, items, manifest.max_new_tokens)


def judged(standing: StandingBook, authority: Authority, item: Admitted) -> list[Banned]:
    """A verdict or a producer claim moves its producer's standing when its signer may
    judge and is not the producer itself: a pass counts towards the probation, a failure
    or a claim bans."""
    signer, producer = item.envelope.signer, item.obj.producer
    if signer == producer or not authority.may_judge(signer):
        return []
    if item.kind is Kind.VERDICT:
        return standing.audited(producer, item.obj.passed, item.obj.reason)
    return standing.ban(producer, "producer window over the limit")


def settle(
    collector: Collector, standing: StandingBook, rid: bytes, reason: str = "failed audit"
) -> tuple[list[Banned], list[Charge]]:
    """What the votes on rollout `rid` decide once confirmed (`protocol.verified.judge`):
    the first decision moves its producer's standing (a pass towards its probation, a
    rejection bans it); every vote that disagrees with it is charged to its validator
    (`protocol.judges.JudgeBook`). Call after each verdict and each rollout heard."""
    t = collector.tracks.get(rid)
    if t is None or not t.producer:
        return [], []
    st = collector.status(t)
    if st not in (Status.VERIFIED, Status.REJECTED):
        return [], []
    first = not collector.judges.is_decided(rid)
    ignore = collector.judges.flagged_keys()
    votes = [
        v
        for v in t.votes
        if v.producer == t.producer
        and v.signer != t.producer
        and v.signer not in ignore
        and collector.authority.may_judge(v.signer)
    ]
    charges = collector.judges.decided(rid, st is Status.VERIFIED, votes)
    bans = standing.audited(t.producer, st is Status.VERIFIED, reason) if first else []
    return bans, charges


def judgement(
    collector: Collector, standing: StandingBook, item: Admitted
) -> tuple[list[Banned], list[Charge]]:
    """A verdict or a producer claim heard by the trainer (`collector.on_deliver` took it
    first): counted for its validator, then what it decides (`settle`); a claim bans its
    producer once `need` distinct judges claimed it (`JudgeBook.claimed`)."""
    authority, judges = collector.authority, collector.judges
    signer, producer = item.envelope.signer, item.obj.producer
    if signer == producer or not authority.may_judge(signer) or judges.flagged(signer):
        return [], []
    if item.kind is Kind.VERDICT:
        judges.voted(signer, item.obj.passed)
        return settle(collector, standing, item.obj.rollout_id, item.obj.reason)
    n = authority.judges() - sum(1 for k in judges.flagged_keys() if authority.may_judge(k))
    if judges.claimed(producer, signer, min(collector.rule.confirm, max(1, n))):
        return standing.ban(producer, "producer window over the limit"), []
    return [], []


_VERDICT = {Status.VERIFIED: True, Status.REJECTED: False, Status.PENDING: None}


def pick_ready(
    collector: Collector,
    standing: StandingBook,
    waiting: OrderedDict[bytes, tuple[Any, float]],
    version: int,
    s: int,
    now: float,
    fates: Fates,
) -> tuple[list[Any], int]:
    """Take the rollouts that train now out of `waiting` (`StandingBook.decide` on each
    one's verdict, producer and arrival); drop rejected, banned and stale ones. Returns
    them and how many of them had no verdict of their own."""
    ready, unaudited = [], 0
    for rid in list(waiting):
        ro, arrived_at = waiting[rid]
        t = collector.tracks.get(rid)
        if t is None or version - ro.envelope.policy_version > s:
            if t is not None:  # refused for staleness (an untracked one is no such refusal)
                fates.stale_waiting += 1
            del waiting[rid]
            continue
        if collector.credit.not_trained(t.producer, t.counter):  # gone back, or left behind
            del waiting[rid]
            continue
        if not collector.ledger.allowed(t.producer, now):
            del waiting[rid]
            continue
        status = collector.status(t)
        if status is Status.CONTESTED:
            continue  # a pending fail: one pass does not outweigh it, nor does the hold
        verdict = _VERDICT[status]
        if verdict is None and collector.judges.suspect(t.producer):
            continue  # an unconfirmed claim names its producer: only its own pass trains it
        decision = standing.decide(t.producer, verdict, arrived_at, now)
        if decision is Decision.TRAIN:
            ready.append(waiting.pop(rid)[0])
            unaudited += verdict is None
        elif decision is Decision.DROP:
            del waiting[rid]
    return ready, unaudited


class TrainerRole:
    """The trainer at work: what it heard (`Collector`), the rollouts waiting for their
    verdicts, and, once `start` has loaded them, the model, its `Trainer` and the version
    last published. `on_deliver`/`on_late` take the peer's items (event loop);
    `train_forever` trains, publishes and reports."""

    def __init__(self, peer: TrainerPeer, config: TrainerConfig, io: RoleIO) -> None:
        self.peer, self.config, self.io, self.manifest = peer, config, io, peer.manifest
        self.collector = Collector(
            peer.admission.authority, VerifiedRule(quorum=self.manifest.verdict_quorum)
        )
        self.waiting: OrderedDict[bytes, tuple[Any, float]] = (
            OrderedDict()
        )  # rid -> (record, arrived)
        self.standing = StandingBook()
        self.trained = {"trained_verified": 0, "trained_unaudited": 0}
        self.fates = Fates()  # what became of the rollouts heard of (status: `fates`)
        self.unscored: list[Any] = []  # held bodies not re-scored yet (at most MAX_WAITING)
        self.model: Any = None
        self.tokenizer: Any = None
        self.trainer: Any = None
        self.rescorer: Any = None
        self.published = 0
        self.publish_error: str | None = None
        self.learning: list[dict[str, Any]] = []
        self.rank_procs: list[Any] = []  # ranks 1..N-1 this process spawned (`--nproc`)
        self.started = time.time()
        self.last_print = -math.inf
        self.last_eval = -math.inf

    def on_deliver(self, item: Admitted) -> None:
        """Take one admitted item: charge producers the collector finds at fault, queue a
        record to wait for its verdict, move standing on a verdict or a claim. A verdict
        on a record of a disputed version (`protocol.equivocation`) counts for nothing."""
        if item.kind is Kind.VERDICT and self.disputed(item.obj.rollout_id):
            return
        for bad in self.collector.on_deliver(item):
            self.peer.report(
                bad, WITHHELD_PENALTY, "withheld assignment counters", penalties.WITHHELD.name
            )
        for bad in self.collector.take_went_back():
            self.peer.report(
                bad,
                penalties.OUT_OF_ORDER.cost,
                "went back to an older version again",
                penalties.OUT_OF_ORDER.name,
            )
        if item.kind is Kind.ROLLOUT_RECORD:
            if len(self.unscored) < MAX_WAITING:
                self.unscored.append(item.obj)
            self.waiting[item.content_id] = (item.obj, time.time())
            if len(self.waiting) > MAX_WAITING:
                self.waiting.popitem(last=False)
                self.fates.unverified_dropped += 1
        if item.kind in (Kind.VERDICT, Kind.PRODUCER_CLAIM):
            self.on_judgement(item)
        elif item.kind in (Kind.ROLLOUT_RECORD, Kind.ROLLOUT_HEADER):
            self.carry_out(*settle(self.collector, self.standing, item.content_id))

    def disputed(self, rid: bytes) -> bool:
        """Whether the rollout `rid` was made under a version a trainer key equivocated over."""
        t = self.collector.tracks.get(rid)
        return t is not None and self.peer.admission.equivocations.is_disputed(t.version)

    def on_judgement(self, item: Admitted) -> None:
        """A verdict or a producer claim (`judgement`)."""
        self.carry_out(*judgement(self.collector, self.standing, item))

    def carry_out(self, bans: list[Banned], charges: list[Charge]) -> None:
        """A ban drops the producer's waiting rollouts; a validator whose verdict disagreed
        with the re-audits pays."""
        for ban in bans:
            for rid in [
                r for r, (ro, _t) in self.waiting.items() if ro.envelope.signer == ban.producer
            ]:
                del self.waiting[rid]
        for c in charges:
            self.peer.report(c.judge, c.penalty, c.reason, c.offence)

    def on_late(self, item: Admitted) -> None:
        """A rollout refused as too stale: counted in `fates`, its counter no gap."""
        self.fates.on_late(item.content_id)
        for bad in self.collector.on_late(item):
            self.peer.report(
                bad, WITHHELD_PENALTY, "withheld assignment counters", penalties.WITHHELD.name
            )

    async def start(self) -> None:
        """Load the model (adopted as version 0) and the trainer, resuming from its
        checkpoint at the version last published."""
        from trainer.devices import resolve_device  # deferred: heavy import
        from trainer.distributed import RankEnv, rank_device  # deferred: heavy import
        from trainer.micro_step import StepSettings  # deferred: heavy import
        from trainer.train_loop import Trainer  # deferred: heavy import

        peer, config, manifest = self.peer, self.config, self.manifest
        device = resolve_device(config.model.device)
        env = RankEnv.from_env()
        where = rank_device(device, env.local_rank if env is not None else 0)
        model, tokenizer, base, path = await trio.to_thread.run_sync(
            _load, config.model, manifest, where
        )
        if peer.weights is not None:
            await peer.weights.adopt_base(base)
        step = StepSettings(micro_batch=config.micro_batch)
        ranks, self.rank_procs = await trio.to_thread.run_sync(
            start_ranks, config, device, path, manifest, step
        )
        trainer = await trio.to_thread.run_sync(
            lambda: Trainer.from_manifest(
                model,
                tokenizer,
                manifest,
                ckpt_dir=config.data_dir / "trainer",
                step_settings=step,
                ranks=ranks,
            )
        )
        self.model, self.tokenizer, self.trainer = model, tokenizer, trainer
        self.rescorer = Rescorer(manifest, tokenizer)
        self.published = (
            (peer.weights.newest() or 0) if peer.weights is not None else trainer.version
        )
        trainer.version = max(trainer.version, self.published)
        self.collector.on_published(self.published, time.time())
        on = f"{where}" if ranks is None else f"{ranks.world} ranks (DDP), rank 0 on {where}"
        self.io.say(
            f"trainer: {'resumed' if trainer.resumed else 'starting'} at version {trainer.version} "
            f"on {on}; training on verified rollouts, a version every "
            f"{manifest.rl_publish_every} groups"
        )
        self.last_print = trio.current_time()
        self.started = time.time()

    def close(self) -> None:
        """Stop the other ranks, if any, and wait for those this process spawned (blocking)."""
        from trainer.distributed import stop_local  # deferred: heavy import

        if self.trainer is not None:
            self.trainer.close()
        stop_local(self.rank_procs)

    async def evaluate(self) -> None:
        """Score the held-out tasks; the result joins `learning` in status."""
        trainer = self.trainer
        self.last_eval = trio.current_time()
        solved = await trio.to_thread.run_sync(
            _heldout, self.model, self.tokenizer, self.manifest, self.config.model.threads
        )
        rate = round(sum(solved) / len(solved), 4)
        reward = trainer.last_stats.get("reward_mean")
        self.learning.append(
            {
                "t": round(time.time() - self.started, 1),
                "version": trainer.version,
                "solve_rate": rate,
                "reward_mean": None if reward is None else round(reward, 4),
                "steps": trainer.steps,
                "solved": "".join("1" if x else "0" for x in solved),
            }
        )
        self.io.status["learning"] = self.learning
        self.io.say(f"trainer: held-out solve rate {rate:.3f} at version {trainer.version}")

    async def train_forever(self) -> None:
        """Re-score, train, publish and report in turns, until cancelled."""
        while True:
            steps = 0
            await self.rescore()  # credit, even while training waits
            if self.publish_error is None:  # never train past a version the swarm has not got
                steps = await self.train()
            if self.peer.weights is not None and self.trainer.version > self.published:
                await self.publish()
            self.report()
            if steps == 0:
                await trio.sleep(STEP_POLL_S)

    async def rescore(self) -> None:
        """Re-score the bodies that arrived since the last turn: the credit of their
        producers, and `penalties.FALSE_CLAIM` for each header that claimed otherwise."""
        bodies, self.unscored = self.unscored, []
        scored = await trio.to_thread.run_sync(rescore_bodies, self.rescorer, bodies)
        now = time.time()
        for rid, reward in scored:
            for bad in self.collector.on_rescored(rid, reward, now):
                self.peer.report(
                    bad,
                    penalties.FALSE_CLAIM.cost,
                    "claimed a reward its body does not earn",
                    penalties.FALSE_CLAIM.name,
                )
        for bad in self.collector.on_time(now):
            self.peer.report(
                bad, WITHHELD_PENALTY, "withheld assignment counters", penalties.WITHHELD.name
            )

    async def train(self) -> int:
        """Train on the rollouts waiting that may train now; returns the steps taken."""
        for rid in [r for r in self.waiting if self.disputed(r)]:
            del self.waiting[rid]  # neither passed nor failed: never trained
        ready, unaudited = pick_ready(
            self.collector,
            self.standing,
            self.waiting,
            self.trainer.version,
            self.manifest.max_staleness,
            time.time(),
            self.fates,
        )
        self.trained["trained_unaudited"] += unaudited
        self.trained["trained_verified"] += len(ready) - unaudited
        return await trio.to_thread.run_sync(
            train_ready,
            self.trainer,
            self.rescorer,
            ready,
            self.config.model.threads,
            time.monotonic(),
        )

    async def publish(self) -> None:
        """Publish the trained version (retried at the next turn if it fails)."""
        trainer, io, weights = self.trainer, self.io, self.peer.weights
        assert weights is not None, "called only for a peer that keeps weights"
        try:
            dtype = self.manifest.weights_dtype  # "float32": the master as it is
            state = await trio.to_thread.run_sync(  # a whole-model copy: off the event loop
                snapshot_state, self.model.state_dict(), None if dtype == "float32" else dtype
            )
            self.published = await weights.publish(state)
            self.collector.on_published(self.published, time.time())
            self.publish_error = None
            if self.published != trainer.version:  # the store numbered it: follow the store
                trainer.version = self.published
                await trio.to_thread.run_sync(trainer.save_checkpoint)
            io.say(f"trainer: published version {self.published} after {trainer.steps} steps")
            if trio.current_time() - self.last_eval >= LEARN_EVAL_EVERY_S:
                await self.evaluate()
        except WeightsError as exc:  # retried at the next turn; training waits
            if self.publish_error is None:
                io.say(f"trainer: cannot publish version {trainer.version}: {exc}")
            self.publish_error = f"{type(exc).__name__}: {exc}"

    def report(self) -> None:
        """Status figures at every turn; a line on the console every `PRINT_EVERY_S`."""
        trainer, io = self.trainer, self.io
        summary = self.collector.summarize(
            trainer.version, self.manifest.max_staleness, time.time()
        )
        states = [
            self.standing.state(p) for p in {ro.envelope.signer for ro, _t in self.waiting.values()}
        ]
        io.status.update(
            summary,
            **trainer.status(),
            **self.trained,
            published=self.published,
            waiting=len(self.waiting),
            producers_banned=self.standing.count(State.BANNED),
            validators=self.collector.judges.summary(),
            producers_probation=sum(s is State.PROBATION for s in states),
        )
        io.status["publish_error"] = self.publish_error
        io.status["fates"] = self.fates.counts(trainer, self.waiting)
        io.status["updated_at"] = time.time()
        if trio.current_time() - self.last_print >= PRINT_EVERY_S:
            self.last_print = trio.current_time()
            io.say(progress_line(trainer.version, trainer.steps, summary, trainer.status()))


def _mean(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def progress_line(version: int, steps: int, summary: dict[str, Any], status: dict[str, Any]) -> str:
    """The trainer's progress line: the same reward figures `status` shows (the mean over
    usable verified rollouts, and that of the last training batch), "n/a" before any."""
    return (
        f"trainer: version {version}, {steps} steps, {summary['verified']} verified, "
        f"reward mean {_mean(summary.get('usable_reward_mean'))} "
        f"(last batch {_mean(status['last'].get('reward_mean'))}), "
        f"{status['train_tokens_per_s']} tokens/s, refused {status['refused']}"
    )


async def run(peer: TrainerPeer, config: TrainerConfig, io: RoleIO) -> None:
    """Train and publish until cancelled (or, with `publish_every_s`, run the broadcast
    drill instead)."""
    role = TrainerRole(peer, config, io)
    peer.on_deliver(role.on_deliver)
    peer.on_late(role.on_late)
    if config.publish_every_s > 0:  # a broadcast drill: perturbed versions on a clock, no training
        await publish_loop(peer.weights, config, io)
        return
    try:
        await role.start()
        await role.evaluate()  # the starting (warm-start) level
        await role.train_forever()
    finally:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:  # the other ranks stop with this one
            scope.shield = True
            await trio.to_thread.run_sync(role.close)
