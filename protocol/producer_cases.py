"""Producer claims: a validator's claim over records of one worker, re-checked.

A `ProducerClaim` (signed by a key that may judge; admission has checked that) names a
producer and the rollout ids of some of its records (any number, up to
`wire.MAX_CLAIM_RECORDS`) that the accuser found over the run's limit of the producer
statistic (`verify.producer`). The evidence is the records: the producer signed each, and
any peer pulls them by id. A peer that can audit re-runs the audit of every named record
with its own model of each claimed version, compares each statistic with its own copy of
the run's limit (the calibration the run manifest pins), never the numbers the claim
carries, and applies `claim_failed` to the records over it:

    the window rule: at least `WINDOW_OVER` of them in one window (the producer's task
    counters `[k * PRODUCER_WINDOW, (k + 1) * PRODUCER_WINDOW)`), or
    the sequential rule (`sequential_failed`): a span of the producer's counters in which
    the records over the limit are too many for an honest worker's rate
                                   -> the producer pays `PRODUCER_PENALTY`
    neither                        -> the accuser pays `FALSE_ACCUSATION`
    not records of the producer (a record of another signer, a counter repeated)
                                   -> the accuser pays `FALSE_ACCUSATION`
    a record missing, or a version we cannot audit, before `case_ttl_s`
                                   -> the case is dropped; nobody pays

Why the accuser's choice of records cannot convict an honest worker: both rules count only
records over the limit, and a claim names a subset of them. Windows are fixed blocks, so
the named records of one window are at most all of that window's; the sequential rule
counts every counter of the span (`counter_max - counter_min + 1`) as a record of the
producer, each one it does not name as within the limit, so naming fewer only weakens it.

The sequential rule is a one-sided sequential probability ratio test (Wald) over the
producer's task counters from the span's first named record on: per counter the
log-likelihood ratio of "over the limit with probability `SEQ_P1`" against the honest
"with probability at most `SEQ_P0`" (`span_llr`), failed once it reaches
`log(1 / SEQ_ALPHA)`. Under the honest hypothesis the likelihood ratio is a (super)martingale,
so by Ville's inequality an honest worker's ratio ever reaches `1 / SEQ_ALPHA` from a given
start with probability at most `SEQ_ALPHA`, however long it runs; the accuser chooses the
start among the honest worker's own records over the limit (about `SEQ_P0` of them), so
over a history of n records the false-positive rate is at most `n * SEQ_P0 * SEQ_ALPHA`.
docs/DESIGN.md has the figures, and the power against a change rate under the window
threshold.

Who pays: only signers, for what they signed (the producer for its records, the
validator for its claim); a relay of either never pays here. A set of records is judged
once. Bounds as for single-record fraud cases (`protocol.fraud`): at most `max_open`
claims open, `max_open_per_accuser` per accusing key, and each case expires. Time is
passed in; `ProducerCases` does no I/O: it returns the same actions as `protocol.fraud`
(`NeedRecord`, `Audit`, `Punish`) for the node to carry out.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocol import penalties
from protocol.content_id import content_id
from protocol.fraud import FALSE_ACCUSATION, Action, Audit, FraudConfig, NeedRecord, Punish
from protocol.wire import MAX_CLAIM_RECORDS

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


# The sequential rule: an honest record is over the limit with probability at most SEQ_P0
# (the limit is the largest statistic honest records showed in calibration; the window
# rule's own false-positive rate, P(at least 4 of 16 over) a window, assumes as much); the test is
# against SEQ_P1, and an honest worker is caught from a given start with probability at
# most SEQ_ALPHA over its whole history (module docstring).
SEQ_P0 = 0.005
SEQ_P1 = 0.1
SEQ_ALPHA = 1e-9
SEQ_THRESHOLD = math.log(1.0 / SEQ_ALPHA)
_LLR_OVER = math.log(SEQ_P1 / SEQ_P0)
_LLR_WITHIN = math.log((1.0 - SEQ_P1) / (1.0 - SEQ_P0))


def span_llr(over: int, span: int) -> float:
    """The log-likelihood ratio of `over` records over the limit in a span of `span`
    counters of one producer (every other counter of the span counted within it)."""
    return over * _LLR_OVER + (span - over) * _LLR_WITHIN


def failing_span(over_counters: Iterable[int]) -> tuple[int, int] | None:
    """The (first, last) counters of a span whose records over the limit (`over_counters`,
    the producer's task counters) fail the sequential rule, or None: the best span
    starting and ending at such a record (every other span of them is weaker)."""
    cs = sorted(set(over_counters))
    best: tuple[float, int, int] | None = None
    for i, lo in enumerate(cs):
        for j in range(i, len(cs)):
            llr = span_llr(j - i + 1, cs[j] - lo + 1)
            if llr >= SEQ_THRESHOLD and (best is None or llr > best[0]):
                best = (llr, lo, cs[j])
    return None if best is None else (best[1], best[2])


def sequential_failed(over_counters: Iterable[int]) -> bool:
    """Whether the producer's records over the limit at `over_counters` fail the
    sequential rule (module docstring)."""
    return failing_span(over_counters) is not None


def claim_failed(values: Mapping[int, float], limit: float) -> bool:
    """The re-check of a claim: `values` maps each named record's task counter to our own
    statistic; failed by the window rule in any window, or by the sequential rule."""
    over = [c for c, v in values.items() if v > limit]
    per_window: dict[int, int] = {}
    for c in over:
        per_window[c // PRODUCER_WINDOW] = per_window.get(c // PRODUCER_WINDOW, 0) + 1
    return max(per_window.values(), default=0) >= WINDOW_OVER or sequential_failed(over)


class SequentialTest:
    """One producer's records over the limit, for the sequential rule: `add` each one (its
    task counter and what names it); the most recent `max_kept` are kept (a claim names at
    most `wire.MAX_CLAIM_RECORDS`)."""

    def __init__(self, max_kept: int = MAX_CLAIM_RECORDS) -> None:
        self.max_kept = max_kept
        self._over: dict[int, bytes] = {}

    def add(self, counter: int, rollout_id: bytes = b"") -> bool:
        """A record over the limit; whether a span of them now fails the rule (only spans
        holding the new record are new: the others were tested when their records came)."""
        self._over[counter] = rollout_id
        while len(self._over) > self.max_kept:
            del self._over[min(self._over)]
        if counter not in self._over:
            return False
        cs = sorted(self._over)
        k = cs.index(counter)
        return any(
            span_llr(j - i + 1, cs[j] - cs[i] + 1) >= SEQ_THRESHOLD
            for i in range(k + 1)
            for j in range(k, len(cs))
        )

    def evidence(self) -> dict[int, bytes] | None:
        """The records (counter -> rollout id) of the failing span, or None."""
        span = failing_span(self._over)
        if span is None:
            return None
        return {c: r for c, r in sorted(self._over.items()) if span[0] <= c <= span[1]}

    def clear(self) -> None:
        """Forget the records held (a claim made of them)."""
        self._over.clear()


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
        if not 1 <= len(ids) <= MAX_CLAIM_RECORDS:
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
        task `counter`: a claim it is not a record of (another signer, a counter named
        twice) is false; otherwise the record is audited, once."""
        out: list[Action] = []
        fits = False
        for cid in list(self._by_record.get(rollout_id, ())):
            case = self.cases[cid]
            others = {c for r, c in case.counters.items() if r != rollout_id}
            if signer != case.producer or counter in others:
                self._drop(cid)
                self._remember(cid, False)
                self.counts["acquitted"] += 1
                why = "producer claim names records that are not the producer's"
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
        values = {case.counters[r]: v for r, v in case.values.items()}
        over = sum(v > self.limit for v in values.values())
        convicted = claim_failed(values, self.limit)
        self._remember(cid, convicted)
        if convicted:
            self.counts["convicted"] += 1
            why = (
                f"producer claim reproduced: {over} of {len(values)} records over {self.limit:.3g}"
            )
            return [Punish(case.producer, PRODUCER_PENALTY, why, "producer_window")]
        self.counts["acquitted"] += 1
        why = f"false producer claim: {over} of {len(values)} records over {self.limit:.3g}"
        return [Punish(case.accuser, FALSE_ACCUSATION, why, "false_accusation")]

    def _remember(self, cid: bytes, convicted: bool) -> None:
        self.judged[cid] = convicted
        while len(self.judged) > self.config.remember:
            self.judged.popitem(last=False)
