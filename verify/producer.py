"""Per-producer evidence: a worker judged by the median error of its audited records.

A record's audit measures how far the verifier's recomputation is from what the worker
recorded (`verify.auditor`). Honest noise (kernels, batch shapes, KV cache against
prefill) spreads that error over records, so a per-record limit has to sit above the
honest tail, and a small systematic change can hide under it in part of a worker's
records: weights one training step old, or a 1% rank-1 change to one matrix (issue 11's
`stale_version` and `sensitivity`). Such a change is in every record of that worker,
though, while honest noise is not: the median over a window of a worker's records
exceeds the largest error any single honest record showed in calibration only when at
least half of the window does.

Measured on the built-in policy (64 records a case, two seeds, fp32 worker and audit, the
statistic `logprob_err_mean`): honest records over four variations reach 8.8e-7 one by
one, their windows' medians at most 2.6e-7; a rank-1 change of 0.3% to a middle-layer
MLP matrix, of which a third to two thirds of the records fail alone, gives windows with
medians of at least 4.7e-6, and weights one training step old at least 4.4e-5. In bf16
the rule finds nothing at 10%: honest windows reach medians of 2.6e-3 against 0.3-2.7e-3
for the changed workers, whose own rounding is as large as the change.

What lives here, pure (no model, no IO): `ProducerTally` keeps, per producer, the
statistic of its last `window` audited records (passed or failed: a failed record is as
much the producer's work) and returns a `ProducerFinding` when a full window's median is
over the limit; `window_median` is the
rule itself, which a peer re-checking a finding applies to its own audits of the same
records. A finding is evidence only with those records: the node turns it into a signed
claim whose re-check re-audits every record it names (the fraud rule of one record,
applied to a set).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

WINDOW = 16
STAT = "logprob_err_mean"


def window_median(values: Sequence[float]) -> float:
    """The median of a window's statistic (the rule a re-check applies as well)."""
    if not values:
        raise ValueError("window_median: no values")
    return float(statistics.median(values))


@dataclass(frozen=True, slots=True)
class ProducerFinding:
    """A full window of `producer`'s audited records whose median is over `limit`."""

    producer: bytes
    rollout_ids: tuple[bytes, ...]
    median: float
    limit: float


class ProducerTally:
    """Per producer, the statistic of its last `window` audited records; bounded to
    `max_producers` (the least recently seen is forgotten first)."""

    def __init__(
        self, limit: float, *, window: int = WINDOW, stat: str = STAT, max_producers: int = 4096
    ) -> None:
        if window < 1 or max_producers < 1:
            raise ValueError("ProducerTally: window and max_producers must be >= 1")
        if not limit > 0:
            raise ValueError(f"ProducerTally: limit must be > 0, got {limit}")
        self.limit = limit
        self.window = window
        self.stat = stat
        self.max_producers = max_producers
        self._seen: OrderedDict[bytes, deque[tuple[bytes, float]]] = OrderedDict()

    def add(
        self, producer: bytes, rollout_id: bytes, metrics: Mapping[str, float]
    ) -> ProducerFinding | None:
        """One audited record's metrics. A record without the statistic (an audit that
        stopped at a cheap check, before the model) is not counted."""
        value = metrics.get(self.stat)
        if value is None:
            return None
        q = self._seen.pop(producer, None)
        if q is None:
            q = deque(maxlen=self.window)
            while len(self._seen) >= self.max_producers:
                self._seen.popitem(last=False)
        self._seen[producer] = q
        q.append((rollout_id, float(value)))
        if len(q) < self.window:
            return None
        median = window_median([v for _, v in q])
        if median <= self.limit:
            return None
        finding = ProducerFinding(producer, tuple(rid for rid, _ in q), median, self.limit)
        q.clear()  # the next finding needs a fresh window
        return finding

    def held(self, producer: bytes) -> int:
        """How many records of `producer` the current window holds."""
        q = self._seen.get(producer)
        return len(q) if q is not None else 0
