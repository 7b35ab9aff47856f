"""Which window statistic catches a window in which only some records are changed.

`python -m swarm_node_bench.parts.window_statistic [N]`: on the built-in policy (fp32 worker and audit,
the run's calibrated limits), N honest records and N records of a worker with a rank-1
change of 0.3% to the middle layer's MLP down projection are audited; then windows of
`PRODUCER_WINDOW` records with m changed ones (m = 0..16, drawn 2,000 times each from the
audited values) are judged by the median and by
`protocol.producer_cases.window_failed`. Prints one JSON line: per m, the share of windows each
statistic flags.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from dataclasses import replace
from typing import Any

from protocol.producer_cases import PRODUCER_WINDOW, window_failed, window_median
from swarm_node_bench.parts.verify_records import audit, make_engine, make_records, open_records
from swarm_node_bench.verify import calibrate, producer_limit, rank1_changed, setup
from verify.producer import STAT


def _values(results: list[Any], stat: str) -> list[float]:
    return [r.metrics[stat] for r in results if stat in r.metrics]


def main(n: int = 64, draws: int = 2000) -> dict[str, Any]:
    """Compare the window statistics on `n` honest and partly changed records over `draws` windows."""

    ctx, model_dir = setup(None, n, quick=False)
    settings, _digest = calibrate(ctx, model_dir)
    settings = replace(settings, precision="fp32")
    ctx = replace(ctx, audit_settings=settings, counter0=7 * 100_000)
    limit = producer_limit(settings, "fp32")
    honest_made = make_records(ctx, make_engine(ctx.model, ctx.tokenizer, max_batch=64))
    worker = rank1_changed(ctx.model, "middle.down_proj", 0.003, seed=0, quick=False)
    changed_made = make_records(ctx, make_engine(worker, ctx.tokenizer, max_batch=64))
    honest = _values(audit(ctx, open_records(honest_made.records))[0], STAT)
    changed_res = audit(ctx, open_records(changed_made.records))[0]
    changed = _values(changed_res, STAT)
    rng = random.Random(0)
    out: dict[str, Any] = {
        "limit": limit,
        "records": n,
        "changed_failed_alone": sum(not r.passed for r in changed_res) / len(changed_res),
        "honest_max": max(honest),
        "changed_median": statistics.median(changed),
        "changed_over_limit": sum(v > limit for v in changed) / len(changed),
        "by_changed": {},
    }
    for m in range(PRODUCER_WINDOW + 1):
        med = cnt = 0
        for _ in range(draws):
            vals = rng.sample(changed, m) + rng.sample(honest, PRODUCER_WINDOW - m)
            med += window_median(vals) > limit
            cnt += window_failed(vals, limit)
        out["by_changed"][m] = {"median": round(med / draws, 4), "standing": round(cnt / draws, 4)}
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)))
