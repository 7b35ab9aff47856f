"""Which sampled rollout a validator audits next: the queue between sampling and audit.

A verdict is worth most while the trainer can still use the rollout: a rollout made with
version v is usable until the run's newest version passes v + S (`max_staleness`). A
validator that audits in arrival order falls behind whenever workers produce faster than
it audits, and then spends its time on rollouts that are already too stale to train on,
while the fresh ones go stale in its queue. So, in order:

1. fraud re-checks first (a case waits on them, and they are rare);
2. then the highest policy version, oldest first within a version;
3. records more than S versions behind the newest version are dropped unaudited (no
   verdict, no penalty: our lateness must not cost the producer);
4. bounded: a full queue evicts its least useful record (lowest version, oldest).

"Newest" is what the caller passes to `set_newest` — the newest version the trainer
signed (the node's weight store), never a version a record merely claims, so a record
claiming a far-future version cannot make honest records look stale. Pure and IO-free:
items are opaque to the queue.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Any

__all__ = ["AuditQueue"]


class AuditQueue:
    """The validator's queue of sampled records (see the module docstring for its order and
    bounds)."""

    def __init__(self, max_staleness: int, capacity: int) -> None:
        if max_staleness < 0 or capacity < 1:
            raise ValueError("AuditQueue: max_staleness >= 0 and capacity >= 1")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.newest: int | None = None
        self.rechecks: list[Any] = []
        # Two heaps over the same entries, each O(log n) per push and pop: `_best` on
        # (-version, arrival) pops the next to audit (highest version, oldest within it),
        # `_worst` on (version, arrival) the next to evict (lowest version, oldest). An
        # entry taken from one stays in the other until it surfaces there (lazy deletion):
        # `_live` holds the arrivals still queued; `_compact` drops the dead entries once
        # they outnumber the live ones. Arrivals are unique, so items are never compared.
        self._best: list[tuple[int, int, Any]] = []
        self._worst: list[tuple[int, int, Any]] = []
        self._live: set[int] = set()
        self._arrival = itertools.count()
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.rechecks) + len(self._live)

    def set_newest(self, version: int) -> None:
        """The newest version the run has published (from a signed source only)."""
        if self.newest is None or version > self.newest:
            self.newest = version

    def push(self, item: Any, version: int, recheck: bool = False) -> list[Any]:
        """Queue `item`; returns the items evicted to make room (possibly `item` itself)."""
        if recheck:
            if len(self) >= self.capacity and not self._live:
                self.dropped["full"] += 1
                return [item]
            self.rechecks.append(item)
            return self._evict()
        n = next(self._arrival)
        heapq.heappush(self._best, (-version, n, item))
        heapq.heappush(self._worst, (version, n, item))
        self._live.add(n)
        return self._evict()

    def take(self, n: int) -> list[Any]:
        """Up to `n` items to audit now, stale ones dropped on the way."""
        out = self.rechecks[:n]
        del self.rechecks[: len(out)]
        while len(out) < n and self._live:
            neg_version, arrival, item = heapq.heappop(self._best)
            if arrival not in self._live:
                continue  # evicted earlier
            self._live.discard(arrival)
            if self._too_stale(-neg_version):
                # the heap pops the highest version first: everything left is as stale
                self.dropped["stale"] += 1 + len(self._live)
                self._best.clear()
                self._worst.clear()
                self._live.clear()
                break
            out.append(item)
        self._compact()
        return out

    def _too_stale(self, version: int) -> bool:
        return self.newest is not None and self.newest - version > self.max_staleness

    def _evict(self) -> list[Any]:
        evicted = []
        while len(self) > self.capacity and self._live:
            _, arrival, item = heapq.heappop(self._worst)
            if arrival not in self._live:
                continue  # taken for audit earlier
            self._live.discard(arrival)
            evicted.append(item)
            self.dropped["full"] += 1
        self._compact()
        return evicted

    def _compact(self) -> None:
        """Rebuild a heap that holds more dead entries than live ones (amortised O(1))."""
        live = self._live
        for heap in (self._best, self._worst):
            if len(heap) > 2 * len(live) + 64:
                heap[:] = [e for e in heap if e[1] in live]
                heapq.heapify(heap)
