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
    def __init__(self, max_staleness: int, capacity: int) -> None:
        if max_staleness < 0 or capacity < 1:
            raise ValueError("AuditQueue: max_staleness >= 0 and capacity >= 1")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.newest: int | None = None
        self.rechecks: list[Any] = []
        # min-heap on (-version, arrival): the highest version first, oldest first within it
        self._heap: list[tuple[int, int, Any]] = []
        self._arrival = itertools.count()
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.rechecks) + len(self._heap)

    def set_newest(self, version: int) -> None:
        """The newest version the run has published (from a signed source only)."""
        if self.newest is None or version > self.newest:
            self.newest = version

    def push(self, item: Any, version: int, recheck: bool = False) -> list[Any]:
        """Queue `item`; returns the items evicted to make room (possibly `item` itself)."""
        if recheck:
            if len(self) >= self.capacity and not self._heap:
                self.dropped["full"] += 1
                return [item]
            self.rechecks.append(item)
            return self._evict()
        heapq.heappush(self._heap, (-version, next(self._arrival), item))
        return self._evict()

    def take(self, n: int) -> list[Any]:
        """Up to `n` items to audit now, stale ones dropped on the way."""
        out = self.rechecks[:n]
        del self.rechecks[: len(out)]
        while len(out) < n and self._heap:
            neg_version, _, item = heapq.heappop(self._heap)
            if self._too_stale(-neg_version):
                # the heap pops the highest version first: everything left is as stale
                self.dropped["stale"] += 1 + len(self._heap)
                self._heap.clear()
                break
            out.append(item)
        return out

    def _too_stale(self, version: int) -> bool:
        return self.newest is not None and self.newest - version > self.max_staleness

    def _evict(self) -> list[Any]:
        evicted = []
        while len(self) > self.capacity and self._heap:
            # the least useful entry: the lowest version, oldest within it
            worst = max(self._heap, key=lambda e: (e[0], -e[1]))
            self._heap.remove(worst)
            heapq.heapify(self._heap)
            evicted.append(worst[2])
            self.dropped["full"] += 1
        return evicted
