"""The sequential rule's false positives and power, simulated (no model, no network).

`python -m swarm_node_bench.parts.sequential_power [N]`: N producers per cell (default
2,000). A producer's records are over the producer limit independently, at rate c * f (c
the share of its records a changed model made, f the share a validator audits; the gaps
between records over the limit are geometric) and fed to
`protocol.producer_cases.SequentialTest`; printed as one JSON line: per (c, f) the share
caught within 64 .. 1,024 records and the median records until caught, and how many honest
producers (rate `SEQ_P0` and twice it) of 100,000 records each were ever caught.
docs/DESIGN.md section 7 quotes it.
"""

from __future__ import annotations

import json
import math
import random
import sys
from typing import Any

from protocol.producer_cases import SEQ_P0, SequentialTest

WITHIN = (64, 128, 256, 512, 1024)


def caught_after(rate: float, n: int, rng: random.Random) -> int | None:
    """Records until a producer over the limit at `rate` is caught, None if not in `n`."""
    test, c = SequentialTest(), -1
    while True:
        c += 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - rate))
        if c >= n:
            return None
        if test.add(c):
            return c + 1


def main(n: int = 2000) -> dict[str, Any]:
    """The figures (module docstring) for `n` producers per cell."""
    rng = random.Random(1)
    cells = {}
    for c in (1 / 16, 2 / 16, 3 / 16):
        for f in (1.0, 0.5):
            found = sorted(
                x or math.inf for x in (caught_after(c * f, 1024, rng) for _ in range(n))
            )
            cells[f"c={c:.4f},f={f}"] = {
                **{f"within_{w}": round(sum(x <= w for x in found) / n, 3) for w in WITHIN},
                "median": found[n // 2] if found[n // 2] < math.inf else None,
            }
    honest = {
        f"rate={k}*P0": sum(caught_after(k * SEQ_P0, 100_000, rng) is not None for _ in range(n))
        for k in (1, 2)
    }
    return {"producers_per_cell": n, "changed": cells, "honest_caught_of_100k_records": honest}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)))
