"""The measurement behind `swarm_sim.core`'s choice of a plain heap (run it to repeat it).

`python -m swarm_sim.core_choice [N]` times N timeout events, each re-scheduling one more
with 1,000 pending, on a plain heapq loop, stdlib `sched`, and simpy when it is installed
(it is not a dependency; `pip install simpy` in a scratch venv to compare).
"""

from __future__ import annotations

import heapq
import importlib.util
import random
import sched
import sys
import time


def heap_core(n: int) -> float:
    """Seconds for `n` events on a plain heapq loop."""
    q: list = []
    rnd = random.Random(1)
    count = 0

    def cb(_: int) -> None:
        nonlocal count
        count += 1

    for i in range(1000):
        heapq.heappush(q, (rnd.random(), i, cb, (i,)))
    seq = 1000
    t = time.perf_counter()
    while count < n:
        now, _, fn, args = heapq.heappop(q)
        fn(*args)
        seq += 1
        heapq.heappush(q, (now + rnd.random(), seq, fn, args))
    return time.perf_counter() - t


def sched_core(n: int) -> float:
    """Seconds for `n` events on stdlib `sched`."""
    clock = [0.0]
    s = sched.scheduler(lambda: clock[0], lambda d: clock.__setitem__(0, clock[0] + d))
    rnd = random.Random(1)
    count = [0]

    def cb() -> None:
        count[0] += 1
        if count[0] < n:
            s.enter(rnd.random(), 0, cb)

    for _ in range(1000):
        s.enter(rnd.random(), 0, cb)
    t = time.perf_counter()
    s.run()
    return time.perf_counter() - t


def simpy_core(n: int) -> float:
    """Seconds for `n` events on simpy (needs simpy installed)."""
    import simpy  # deferred: heavy import  # pyright: ignore[reportMissingImports]

    env = simpy.Environment()
    rnd = random.Random(1)
    count = [0]

    def cb(_: object) -> None:
        count[0] += 1
        if count[0] < n:
            env.timeout(rnd.random()).callbacks.append(cb)

    for _ in range(1000):
        env.timeout(rnd.random()).callbacks.append(cb)
    t = time.perf_counter()
    while count[0] < n:
        env.step()
    return time.perf_counter() - t


def main() -> None:
    """Time each available core and print its cost per event."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    cores = [("heapq", heap_core), ("sched", sched_core)]
    if importlib.util.find_spec("simpy") is not None:
        cores.append(("simpy", simpy_core))
    else:
        print("simpy not installed: skipped")
    for name, fn in cores:
        d = fn(n)
        print(f"{name}: {d / n * 1e6:.2f} us/event ({n / d:,.0f} events/s)")


if __name__ == "__main__":
    main()
