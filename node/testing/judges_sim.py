"""A trainer and its validators on virtual time: no single validator decides alone.

The trainer's own rules (`protocol.verified`, `protocol.judges`, `node.roles.trainer`'s
`judgement`, `settle` and `pick_ready`) driven by a scripted run. Three workers (an honest
one that a liar fails, another honest one, and a cheat that passes its probation honestly
and then changes every 4th record), three validators: A audits every record and
re-audits every failed one it has not judged, 6 s after it arrives; B samples a quarter,
8 s after, and re-audits failed ones 5 s after hearing the fail; the liar L answers 0.5 s
after each record: it fails every record of the honest worker and passes everything
else. The trainer holds unaudited work `HOLD_S`. Used by `tests/test_protocol_judges.py`
and `bench adversary`'s `validators` section.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from node.roles.rollout_fates import Fates
from node.roles.trainer import Collector, judgement, pick_ready, settle
from protocol.admission import Admitted, Kind
from protocol.authority import Authority
from protocol.standing import HOLD_S, StandingBook
from protocol.verified import VerifiedRule

A, B, LIAR = b"validator-a", b"validator-b", b"validator-liar"
HONEST, OTHER, CHEAT = b"worker-honest", b"worker-other", b"worker-cheat"
END_S = 300.0
HONEST_AFTER = 40  # the cheat passes its probation honestly, then changes every 4th record


def rid_of(producer: bytes, counter: int) -> bytes:
    return hashlib.sha256(producer + counter.to_bytes(8, "big")).digest()


def changed(producer: bytes, counter: int) -> bool:
    """Whether this record was made by a changed model (it fails an honest audit)."""
    return producer == CHEAT and counter >= HONEST_AFTER and counter % 4 == 0


def run(liar: bool) -> dict[str, Any]:
    """The whole run; returns what the trainer did."""
    validators = {A, B, LIAR} if liar else {A, B}
    collector = Collector(Authority(validator_keys=validators), VerifiedRule())
    standing = StandingBook(hold_s=HOLD_S)
    waiting: OrderedDict[bytes, tuple[Any, float]] = OrderedDict()
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
            rid = rid_of(producer, counter)
            made[rid] = (producer, counter)
            env = SimpleNamespace(signer=producer, policy_version=0, timestamp_ms=int(t * 1000))
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


def credit(r: dict[str, Any], producer: bytes) -> float:
    """`producer`'s credited reward at the end of run `r` (its standing's weight applied)."""
    value = r["collector"].credited_reward(producer, END_S, r["standing"].credit_weight(producer))
    return 0.0 if value is None else value


def figures() -> dict[str, Any]:
    """The `validators` section of `bench adversary`: the honest worker's credit with the
    liar over without it, and how many lying validators the trainer flagged."""
    with_liar, without = run(liar=True), run(liar=False)
    judges = with_liar["collector"].judges
    changed_ids = [rid for rid, (p, c) in with_liar["made"].items() if changed(p, c)]
    honest_ids = [rid for rid in with_liar["mature"] if with_liar["made"][rid][0] == HONEST]
    return {
        "honest_credit_kept": round(credit(with_liar, HONEST) / credit(without, HONEST), 3),
        "honest_trained_fraction": round(
            sum(rid in with_liar["trained"] for rid in honest_ids) / len(honest_ids), 3
        ),
        "bad_validators_flagged": int(judges.flagged(LIAR)),
        "bad_validators": 1,
        "honest_validators_flagged": int(judges.flagged(A)) + int(judges.flagged(B)),
        "cheater_changed_trained": sum(rid in with_liar["trained"] for rid in changed_ids),
        "validators": {
            name: judges.summary()[key.hex()[-12:]]
            for name, key in (("honest_a", A), ("honest_b", B), ("liar", LIAR))
        },
    }
