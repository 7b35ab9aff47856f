"""The discrete-event core: a virtual clock and a heap of scheduled callbacks.

What lives here: `EventLoop` (schedule a callback at a virtual time, run until a time,
count events, report progress) and `derive_rng` (one seeded random stream per named
model, so adding draws in one model never shifts another's). Nothing here knows about
peers, networks or protocols.

Determinism: the heap orders by (time, sequence number); the sequence number is the
order of scheduling, so two events at the same virtual time run in the order they were
scheduled, never in an order that depends on object ids or hashing. Every random draw
comes from a `random.Random` seeded by `derive_rng(seed, name)` (a string seed is hashed
with SHA-512 by `random`, the same on every platform and run). Same seed and scenario ->
same event order -> byte-identical results.

Why a heap and not a library: the simulator needs only "call f(*args) at time t", and a
plain heapq loop is both the fastest and the smallest thing that does it (faster than
simpy and stdlib `sched`; `python -m swarm_sim.core_choice` compares them, figures in
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EventLoop", "derive_rng", "gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside the block (restored after).

    A large run keeps millions of long-lived objects (every peer's admission state) and
    the collector's passes over them cost a fifth of the wall time of 10,000 peers x 360
    virtual s, while the run makes no garbage that only the collector can free (peak RSS
    is the same with and without it). Reference counting frees everything else as
    usual, and nothing simulated depends on when memory is freed.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def derive_rng(seed: int, name: str) -> random.Random:
    """An independent, reproducible random stream for the model called `name`."""
    return random.Random(f"swarm-sim:{seed}:{name}")


class EventLoop:
    """A virtual clock (`now`, seconds from 0) and the callbacks scheduled on it."""

    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0  # callbacks run so far
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` at virtual time `t` (not before `now`)."""
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` `dt` seconds from now."""
        self.at(self.now + dt, fn, *args)

    def run(
        self,
        until: float,
        progress: Callable[[float, int], None] | None = None,
        progress_every_s: float = 1.0,
    ) -> None:
        """Run events with time <= `until`; then the clock reads `until`.

        `progress(now, events)` is called at most every `progress_every_s` wall seconds.
        """
        heap, pop = self._heap, heapq.heappop
        next_report = time.monotonic() + progress_every_s
        n = 0
        while heap and heap[0][0] <= until:
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            n += 1
            if progress is not None and not n & 0x3FFF:
                wall = time.monotonic()
                if wall >= next_report:
                    next_report = wall + progress_every_s
                    self.events += n
                    n = 0
                    progress(t, self.events)
        self.events += n
        self.now = max(self.now, until)
