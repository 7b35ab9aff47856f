"""Per-producer evidence: a worker judged by how many of a window's records are off.

A record's audit measures how far the verifier's recomputation is from what the worker
recorded (`verify.auditor`). Honest noise (kernels, batch shapes, KV cache against
prefill) spreads that error over records, so a per-record limit has to sit above the
honest tail, and a small systematic change can hide under it in part of a worker's
records: weights one training step old, or a 1% rank-1 change to one matrix (`bench verify`'s
`stale_version` and `sensitivity`). Such a change shows in the records it made, though,
while honest noise does not: the producer limit is the largest error any single honest
record showed in calibration, and a window fails when `WINDOW_OVER` of its records are
over it (`protocol.producer_cases.window_failed`), so a worker that changes only a
minority of each window is caught as well (the median would stay honest).

How much of a window must be changed to be caught, on the built-in policy with a slightly
changed model, is in docs/BENCHMARKS.md (`python -m swarm_node_bench.parts.window_statistic`). In bf16 the
rule is blind to small changes: a worker's own rounding is as large as the change.

What lives here, pure (no model, no IO): `ProducerTally` collects, per producer, the
statistic of its audited records (passed or failed: a failed record is as much the
producer's work) in windows, and the headers of the windows it audits whole; it returns a
`ProducerFinding` when a window fails, judged when full or `close_after_s` after it last
heard anything (a header whose body never came counting as failed), or when the
producer's records over the limit fail the sequential rule (`rule` "sequential", naming
those records). The rule itself
(`window_failed`, the blocks) lives in `protocol.producer_cases`, which a peer
re-checking a finding applies to its own audits of the same records. A window is an
aligned block of the producer's task counters, `[k * WINDOW, (k + 1) * WINDOW)`, not any
WINDOW records: a validator that could choose the records could pick the noisiest of an
honest worker's many. `protocol.producer_cases` re-checks the node's signed claims of a
finding.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.producer_cases import (
    MISSING,
    PRODUCER_WINDOW,
    WINDOW_OVER,
    SequentialTest,
    span_llr,
    window_failed,
    window_statistic,
)

WINDOW = PRODUCER_WINDOW
STAT = "logprob_err_mean"
# A window that heard nothing (no header, body or audit of it) for this long is judged with
# what it holds, each header whose body never arrived counting as a failed record (`MISSING`).
CLOSE_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class ProducerFinding:
    """Records of `producer` over `limit`, named in counter order: a window whose statistic
    is over it (`rule` "window"; `missing` of them are headers whose bodies never arrived,
    counted as failed), or a span that fails the sequential rule (`rule` "sequential",
    `statistic` its log-likelihood ratio, every record named over the limit)."""

    producer: bytes
    rollout_ids: tuple[bytes, ...]
    statistic: float
    limit: float
    missing: int = 0
    rule: str = "window"


@dataclass
class _Window:
    last_at: float  # when it last heard of a header, body or audit
    values: dict[int, tuple[bytes, float]] = field(default_factory=dict)  # counter -> audited
    expected: dict[int, bytes] = field(default_factory=dict)  # counter -> header's rollout id
    bodies: set[int] = field(default_factory=set)  # counters whose body is here


class ProducerTally:
    """Per (producer, window), the statistic of its audited records and the headers of
    records expected in it; at most `max_windows` windows open (the least recently added
    to is forgotten first), and as many producers' records over the limit for the
    sequential rule (`sequential` False: the window rule alone)."""

    def __init__(
        self,
        limit: float,
        *,
        window: int = WINDOW,
        stat: str = STAT,
        max_windows: int = 4096,
        close_after_s: float = CLOSE_AFTER_S,
        sequential: bool = True,
    ) -> None:
        if window < 1 or max_windows < 1:
            raise ValueError("ProducerTally: window and max_windows must be >= 1")
        if not limit > 0:
            raise ValueError(f"ProducerTally: limit must be > 0, got {limit}")
        self.limit = limit
        self.window = window
        self.stat = stat
        self.max_windows = max_windows
        self.close_after_s = close_after_s
        self.sequential = sequential  # the sequential rule too (off: windows alone)
        self.judged = 0  # windows whose statistic was taken
        self._cleared: list[tuple[bytes, int]] = []  # (producer, window index) judged clean
        self._open: OrderedDict[tuple[bytes, int], _Window] = OrderedDict()
        # per producer, its records over the limit (the sequential rule); as many as windows
        self._over: OrderedDict[bytes, SequentialTest] = OrderedDict()

    def _get(self, producer: bytes, counter: int, now: float) -> _Window:
        key = (producer, counter // self.window)
        held = self._open.pop(key, None)
        if held is None:
            held = _Window(now)
            while len(self._open) >= self.max_windows:
                self._open.popitem(last=False)
        held.last_at = max(held.last_at, now)
        self._open[key] = held
        return held

    def expect(self, producer: bytes, counter: int, rollout_id: bytes, now: float) -> None:
        """A header of a record whose window we audit: if its body never arrives
        (`body_held`), the window is judged with it failed once `close_after_s` passed."""
        held = self._get(producer, counter, now)
        if counter not in held.values and counter not in held.bodies:
            held.expected.setdefault(counter, rollout_id)

    def body_held(self, producer: bytes, counter: int, now: float) -> None:
        """The body of a record is here (audited or about to be): never missing."""
        held = self._get(producer, counter, now)
        held.bodies.add(counter)
        held.expected.pop(counter, None)

    def add(
        self,
        producer: bytes,
        counter: int,
        rollout_id: bytes,
        metrics: Mapping[str, float],
        now: float = 0.0,
    ) -> ProducerFinding | None:
        """One audited record's metrics (its producer's task `counter` places it in a
        window). A record without the statistic (an audit that stopped at a cheap check,
        before the model) is not counted; its window is judged when it closes."""
        value = metrics.get(self.stat)
        if value is None:
            return None
        held = self._get(producer, counter, now)
        held.values[counter] = (rollout_id, float(value))
        held.expected.pop(counter, None)
        over = self._sequential(producer, counter, rollout_id, float(value))
        if len(held.values) < self.window:
            return over
        del self._open[(producer, counter // self.window)]
        return self._judge(producer, counter // self.window, held) or over

    def _sequential(
        self, producer: bytes, counter: int, rollout_id: bytes, value: float
    ) -> ProducerFinding | None:
        """The sequential rule over the producer's audited records: a finding naming the
        failing span's records (then forgotten: a next finding needs new ones)."""
        if not (self.sequential and value > self.limit):
            return None
        test = self._over.pop(producer, None) or SequentialTest()
        self._over[producer] = test
        while len(self._over) > self.max_windows:
            self._over.popitem(last=False)
        if not test.add(counter, rollout_id):
            return None
        span = test.evidence()
        test.clear()
        assert span is not None
        llr = span_llr(len(span), max(span) - min(span) + 1)
        return ProducerFinding(producer, tuple(span.values()), llr, self.limit, rule="sequential")

    def close(self, now: float) -> list[ProducerFinding]:
        """Judge the windows that heard nothing for more than `close_after_s` with what
        they hold: the audited records, and each expected record whose body never arrived
        as failed."""
        out = []
        for key, held in list(self._open.items()):
            if now - held.last_at <= self.close_after_s:
                continue
            del self._open[key]
            if held.values:
                found = self._judge(key[0], key[1], held)
                if found is not None:
                    out.append(found)
        return out

    def take_cleared(self) -> list[tuple[bytes, int]]:
        """The (producer, window index) judged and found clean since the last call."""
        out, self._cleared = self._cleared, []
        return out

    def _judge(self, producer: bytes, index: int, held: _Window) -> ProducerFinding | None:
        self.judged += 1
        missing = {c: rid for c, rid in held.expected.items() if c not in held.values}
        values = [v for _, v in held.values.values()]
        if not window_failed(values, self.limit, len(missing)):
            self._cleared.append((producer, index))
            del self._cleared[: -self.max_windows]
            return None
        ids = tuple(
            {**missing, **{c: rid for c, (rid, _v) in held.values.items()}}[c]
            for c in sorted({*missing, *held.values})
        )
        stat = window_statistic(values + [MISSING] * min(len(missing), WINDOW_OVER - 1))
        return ProducerFinding(producer, ids, stat, self.limit, len(missing))

    def held(self, producer: bytes, counter: int) -> int:
        """How many audited records the window of `producer`'s `counter` holds so far."""
        held = self._open.get((producer, counter // self.window))
        return 0 if held is None else len(held.values)
