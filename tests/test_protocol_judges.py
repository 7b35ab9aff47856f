"""No single validator decides alone, either way: the trainer's rules (`protocol.verified`,
`protocol.judges`, `node.roles.trainer.judgement`/`settle`/`pick_ready`) on virtual time.

Three validators: two honest (A audits every record and re-audits every failed one it
has not judged, 6 s after it arrives; B samples a quarter, 8 s after, and re-audits failed
ones 5 s after hearing the fail), and a liar L that answers 0.5 s after each record: it
fails every record of one honest worker and passes everything else, the changed records
of a cheating worker included. The trainer holds unaudited work `HOLD_S`.
"""

from __future__ import annotations

import hashlib
import heapq
from types import SimpleNamespace
from typing import Any

import pytest

from node.roles.rollout_fates import Fates
from node.roles.trainer import Collector, judgement, pick_ready, settle
from protocol.admission import Admitted, Kind
from protocol.authority import Authority
from protocol.judges import JudgeBook
from protocol.standing import HOLD_S, StandingBook
from protocol.verified import VerifiedRule, Vote

A, B, LIAR = b"validator-a", b"validator-b", b"validator-liar"
HONEST, OTHER, CHEAT = b"worker-honest", b"worker-other", b"worker-cheat"
END_S = 300.0
HONEST_AFTER = 40  # the cheat passes its probation honestly, then changes every 4th record


def _rid(producer: bytes, counter: int) -> bytes:
    return hashlib.sha256(producer + counter.to_bytes(8, "big")).digest()


def changed(producer: bytes, counter: int) -> bool:
    """Whether this record was made by a changed model (it fails an honest audit)."""
    return producer == CHEAT and counter >= HONEST_AFTER and counter % 4 == 0


def run(liar: bool) -> dict[str, Any]:
    """The whole run; returns what the trainer did."""
    validators = {A, B, LIAR} if liar else {A, B}
    collector = Collector(Authority(validator_keys=validators), VerifiedRule())
    standing = StandingBook(hold_s=HOLD_S)
    waiting: dict[bytes, tuple[Any, float]] = {}
    events: list[tuple[float, int, str, Any]] = []
    seq = iter(range(10**9))
    judged_by: dict[bytes, set[bytes]] = {}  # rollout -> validators that sent a verdict
    made: dict[bytes, tuple[bytes, int]] = {}
    charges: dict[bytes, float] = {}
    trained: list[bytes] = []

    def at(t: float, what: str, payload: Any) -> None:
        heapq.heappush(events, (t, next(seq), what, payload))

    def verdict(t: float, judge: bytes, rid: bytes, passed: bool) -> None:
        if judge in judged_by.setdefault(rid, set()):
            return
        judged_by[rid].add(judge)
        at(t, "verdict", (judge, rid, passed))

    for producer in (HONEST, OTHER, CHEAT):
        for counter in range(int(END_S) - 40):
            at(counter + 0.1 * len(producer) % 1, "record", (producer, counter))

    def deliver(item: Admitted, now: float) -> None:
        collector.on_deliver(item)
        bans, owed = (
            judgement(collector, standing, item)
            if item.kind is Kind.VERDICT
            else settle(collector, standing, item.content_id)
        )
        for ban in bans:
            for rid in [r for r, (ro, _) in waiting.items() if ro.envelope.signer == ban.producer]:
                del waiting[rid]
        for c in owed:
            charges[c.judge] = charges.get(c.judge, 0.0) + c.penalty

    clock = 0.0
    while events:
        t, _, what, payload = heapq.heappop(events)
        while clock < t:  # the trainer's turns, once a second
            ready, _ = pick_ready(collector, standing, waiting, 0, 10, clock, Fates())
            trained.extend(ro.rollout_id for ro in ready)
            clock += 1.0
        if what == "record":
            producer, counter = payload
            rid = _rid(producer, counter)
            made[rid] = (producer, counter)
            env = SimpleNamespace(signer=producer, policy_version=0)
            header = SimpleNamespace(counter=counter, reward=1.0, dataset="d", task_index=counter)
            ro = SimpleNamespace(rollout_id=rid, envelope=env, header=header)
            deliver(Admitted(Kind.ROLLOUT_RECORD, rid, b"relay", env, ro, b"", t), t)  # type: ignore[arg-type]
            collector.on_rescored(rid, 1.0, t)
            waiting[rid] = (ro, t)
            good = not changed(producer, counter)
            if liar:
                verdict(t + 0.5, LIAR, rid, producer != HONEST)
            verdict(t + 6.0, A, rid, good)
            if rid[0] < 64:  # B's sample: a quarter
                verdict(t + 8.0, B, rid, good)
        else:
            judge, rid, passed = payload
            producer, counter = made[rid]
            obj = SimpleNamespace(
                rollout_id=rid, producer=producer, passed=passed, reason="x", reward_rescored=1.0
            )
            env = SimpleNamespace(signer=judge, policy_version=0)
            deliver(Admitted(Kind.VERDICT, rid, b"relay", env, obj, b"", t), t)  # type: ignore[arg-type]
            if not passed:  # a failed verdict opens a fraud case at the others: re-audited
                good = not changed(producer, counter)
                verdict(t + 5.0, A, rid, good)
                verdict(t + 5.0, B, rid, good)
    mature = [rid for rid, (p, c) in made.items() if c < END_S - 80]
    return {
        "collector": collector,
        "standing": standing,
        "charges": charges,
        "trained": set(trained),
        "made": made,
        "mature": mature,
    }


def _credit(r: dict[str, Any], producer: bytes) -> float:
    value = r["collector"].credited_reward(producer, END_S, r["standing"].credit_weight(producer))
    return 0.0 if value is None else value


@pytest.fixture(scope="module")
def with_liar() -> dict[str, Any]:
    return run(liar=True)


def test_the_honest_worker_a_liar_fails_keeps_its_credit_and_is_trained(with_liar):
    without = run(liar=False)
    assert _credit(with_liar, HONEST) >= 0.9 * _credit(without, HONEST) > 0
    mine = [rid for rid in with_liar["mature"] if with_liar["made"][rid][0] == HONEST]
    assert sum(rid in with_liar["trained"] for rid in mine) >= 0.9 * len(mine)


def test_the_liars_instant_passes_train_no_changed_record(with_liar):
    changed_ids = [rid for rid, (p, c) in with_liar["made"].items() if changed(p, c)]
    assert changed_ids and not any(rid in with_liar["trained"] for rid in changed_ids)
    assert with_liar["standing"].state(CHEAT).value == "banned"


def test_the_lying_validator_is_flagged_and_charged_and_the_honest_ones_are_not(with_liar):
    judges: JudgeBook = with_liar["collector"].judges
    assert judges.flagged(LIAR) and not judges.flagged(A) and not judges.flagged(B)
    assert with_liar["charges"].get(LIAR, 0.0) <= -100  # each disagreement, then the flag
    assert with_liar["charges"].get(A, 0.0) == 0 == with_liar["charges"].get(B, 0.0)
    summary = judges.summary()
    liar, honest = summary[LIAR.hex()[-12:]], summary[A.hex()[-12:]]
    assert honest["agreement"] == 1.0 and liar["agreement"] < 0.9


def test_one_validator_still_decides_alone_when_it_is_the_only_one():
    """A run with one validator key has no second opinion: its fail rejects at once."""
    collector = Collector(Authority(validator_keys={A}), VerifiedRule())
    rid = _rid(HONEST, 0)
    t = collector.track(rid)
    t.producer, t.votes = HONEST, [Vote(A, HONEST, False)]
    assert collector.status(t).value == "rejected"
