"""Producer claims: a validator's claim over a worker's window of records, re-checked.

A `ProducerClaim` (signed by a key that may judge; admission has checked that) names a
producer and the rollout ids of one window of its records, the producer's task counters
`[k * PRODUCER_WINDOW, (k + 1) * PRODUCER_WINDOW)`, whose window statistic (at least
`WINDOW_OVER` records over the limit: `window_statistic`) the accuser found over the limit
(`verify.producer`). Windows are fixed blocks so that an
accuser cannot pick the noisiest of an honest worker's records. The evidence is the
records: the producer signed each, and any peer pulls them by id. A peer that can audit
re-runs the audit of every record of the window with its own model of each claimed
version, takes the window statistic itself and compares it with its own copy of
the run's limit (the calibration the run manifest pins), never the numbers the claim
carries:

    the statistic is over the limit -> the producer pays `PRODUCER_PENALTY`
    it is not                      -> the accuser pays `FALSE_ACCUSATION`
    not one window of the producer (a size other than PRODUCER_WINDOW, a record of
    another signer, counters outside one block or repeated)
                                   -> the accuser pays `FALSE_ACCUSATION`
    a record missing, or a version we cannot audit, before `case_ttl_s`
                                   -> the case is dropped; nobody pays

Who pays: only signers, for what they signed (the producer for its records, the
validator for its claim); a relay of either never pays here. A window is judged once.
Bounds as for single-record fraud cases (`protocol.fraud`): at most `max_open` claims
open, `max_open_per_accuser` per accusing key, a window of at most
`wire.MAX_CLAIM_RECORDS` records, and each case expires. Time is passed in;
`ProducerCases` does no I/O: it returns the same actions as `protocol.fraud`
(`NeedRecord`, `Audit`, `Punish`) for the node to carry out.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol import penalties
from protocol.content_id import content_id
from protocol.fraud import FALSE_ACCUSATION, Action, Audit, FraudConfig, NeedRecord, Punish

# A window: the records of one producer whose task counters share `counter // WINDOW`.
PRODUCER_WINDOW = 16
# A reproduced claim: a window of records, each deterministic to re-check. Less than
# a single reproduced fraud (a ban): the statistic is noise-limited by design.
PRODUCER_PENALTY = penalties.PRODUCER_WINDOW.cost


@dataclass
class _Claim:
    producer: bytes
    accuser: bytes
    rollout_ids: tuple[bytes, ...]
    opened_at: float
    counters: dict[bytes, int] = field(default_factory=dict)  # held records' task counters
    values: dict[bytes, float] = field(default_factory=dict)


# A window fails when at least this many of its records are over the limit ...
WINDOW_OVER = 4
# ... a record whose body never arrived counting as over any limit, but at most
# WINDOW_OVER - 1 of them: bodies that never came (our own pull may have failed) never
# fail a window alone, and cannot hide a changed record either.
MISSING = math.inf


def window_statistic(values: Iterable[float], over: int = WINDOW_OVER) -> float:
    """The rule's statistic: the `over`-th largest value of a window, over the limit
    exactly when at least `over` records are (the validator's tally and the re-check of
    a claim both apply it)."""
    vals = sorted(values, reverse=True)
    if not vals:
        raise ValueError("window_statistic: no values")
    return vals[min(over, len(vals)) - 1]


def window_failed(
    values: Iterable[float], limit: float, missing: int = 0, over: int = WINDOW_OVER
) -> bool:
    """Whether a window of audited record statistics, and `missing` records whose bodies
    never arrived, fails."""
    return window_statistic([*values, *[MISSING] * min(missing, over - 1)], over) > limit


def window_median(values: Iterable[float]) -> float:
    """The median of a window's values: not the rule (a minority of changed records
    keeps it honest); `swarm_node_bench.parts.window_statistic` compares the two."""
    vals = list(values)
    if not vals:
        raise ValueError("window_median: no values")
    return float(statistics.median(vals))


def claim_id(producer: bytes, rollout_ids: tuple[bytes, ...]) -> bytes:
    """One case per (producer, set of records), whoever claims it and in whatever order."""
    return content_id(producer + b"".join(sorted(set(rollout_ids))))


class ProducerCases:
    """Open producer claims of one peer (see the module docstring). `limit` is this
    peer's own limit of the statistic (its calibration of the run's precision)."""

    def __init__(self, limit: float, config: FraudConfig | None = None) -> None:
        if not limit > 0:
            raise ValueError(f"ProducerCases: limit must be > 0, got {limit}")
        self.limit = limit
        self.config = config or FraudConfig()
        self.cases: OrderedDict[bytes, _Claim] = OrderedDict()
        self.judged: OrderedDict[bytes, bool] = OrderedDict()  # claim id -> convicted
        self._auditing: set[bytes] = set()  # rollout ids we asked to audit
        self._by_record: dict[bytes, set[bytes]] = {}  # rollout id -> open claims naming it
        self.counts = {"opened": 0, "convicted": 0, "acquitted": 0, "expired": 0, "ignored": 0}

    def claimed(
        self, producer: bytes, rollout_ids: tuple[bytes, ...], accuser: bytes, now: float
    ) -> list[Action]:
        """A claim signed by `accuser` (a key that may judge) over `producer`'s records."""
        if accuser == producer:
            return []  # admission refuses claims on one's own work; never a case
        ids = tuple(dict.fromkeys(rollout_ids))
        if len(ids) != PRODUCER_WINDOW:
            return [
                Punish(
                    accuser,
                    FALSE_ACCUSATION,
                    f"producer claim of {len(ids)} records",
                    "false_accusation",
                )
            ]
        cid = claim_id(producer, ids)
        if cid in self.judged:
            if not self.judged[cid]:
                return [
                    Punish(accuser, FALSE_ACCUSATION, "false producer claim", "false_accusation")
                ]
            return []
        if cid in self.cases:
            return []  # the first accuser's case stands; a second one adds nothing
        by_accuser = sum(c.accuser == accuser for c in self.cases.values())
        if (
            len(self.cases) >= self.config.max_open
            or by_accuser >= self.config.max_open_per_accuser
        ):
            self.counts["ignored"] += 1
            return []
        self.cases[cid] = _Claim(producer, accuser, ids, now)
        for rid in ids:
            self._by_record.setdefault(rid, set()).add(cid)
        self.counts["opened"] += 1
        return [NeedRecord(rid, (producer, accuser)) for rid in ids]

    def record_held(
        self, rollout_id: bytes, signer: bytes, counter: int, now: float
    ) -> list[Action]:
        """A record some open claim names is here (or arrived), signed by `signer` for
        task `counter`: a claim it does not fit as one window of its producer is false;
        otherwise the record is audited, once."""
        out: list[Action] = []
        fits = False
        for cid in list(self._by_record.get(rollout_id, ())):
            case = self.cases[cid]
            others = {c for r, c in case.counters.items() if r != rollout_id}
            block = {c // PRODUCER_WINDOW for c in others}
            if signer != case.producer or counter in others or block - {counter // PRODUCER_WINDOW}:
                self._drop(cid)
                self._remember(cid, False)
                self.counts["acquitted"] += 1
                why = "producer claim is not one window of the producer's records"
                out.append(Punish(case.accuser, FALSE_ACCUSATION, why, "false_accusation"))
                continue
            case.counters[rollout_id] = counter
            fits = True
        if fits and rollout_id not in self._auditing:
            self._auditing.add(rollout_id)
            out.append(Audit(rollout_id))
        return out

    def audited(self, rollout_id: bytes, value: float | None, now: float) -> list[Action]:
        """Our own audit of `rollout_id` gave the statistic `value` (None: the audit stopped
        before the model, so this record says nothing of the producer's weights; the
        claims naming it are dropped, nobody pays)."""
        self._auditing.discard(rollout_id)
        out: list[Action] = []
        for cid in list(self._by_record.get(rollout_id, ())):
            case = self.cases[cid]
            if rollout_id not in case.counters:
                continue  # not checked against the claim yet (`record_held` first)
            if value is None:
                self._drop(cid)
                continue
            case.values[rollout_id] = value
            if len(case.values) == len(case.rollout_ids):
                out += self._judge(cid, case)
        return out

    def cannot_judge(self, rollout_id: bytes) -> list[Action]:
        """We cannot audit this record (its version's weights are not ours): every claim
        naming it is dropped, no blame."""
        self._auditing.discard(rollout_id)
        for cid in list(self._by_record.get(rollout_id, ())):
            self._drop(cid)
        return []

    def tick(self, now: float) -> list[Action]:
        """Drop claims older than `case_ttl_s` (3x that once an audit started); nobody pays."""
        ttl = self.config.case_ttl_s
        for cid, case in list(self.cases.items()):
            if now - case.opened_at > (3 * ttl if case.values else ttl):
                self._drop(cid)
                self.counts["expired"] += 1
        return []

    def wants(self, rollout_id: bytes) -> bool:
        """Whether an open case waits for the record `rollout_id`."""
        return rollout_id in self._by_record

    def _drop(self, cid: bytes) -> None:
        case = self.cases.pop(cid)
        for rid in case.rollout_ids:
            named = self._by_record.get(rid)
            if named is not None:
                named.discard(cid)
                if not named:
                    del self._by_record[rid]

    def _judge(self, cid: bytes, case: _Claim) -> list[Action]:
        self._drop(cid)
        stat = window_statistic(case.values.values())
        convicted = stat > self.limit
        self._remember(cid, convicted)
        if convicted:
            self.counts["convicted"] += 1
            why = f"producer claim reproduced: window statistic {stat:.3g} over {self.limit:.3g}"
            return [Punish(case.producer, PRODUCER_PENALTY, why, "producer_window")]
        self.counts["acquitted"] += 1
        why = f"false producer claim: our window statistic {stat:.3g} is within {self.limit:.3g}"
        return [Punish(case.accuser, FALSE_ACCUSATION, why, "false_accusation")]

    def _remember(self, cid: bytes, convicted: bool) -> None:
        self.judged[cid] = convicted
        while len(self.judged) > self.config.remember:
            self.judged.popitem(last=False)
