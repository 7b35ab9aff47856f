"""`bench scale`'s `audit` part: the validator's audit of the `gen` part's honest records.

The records are audited as `swarm-node audit --run` does (`verify.auditor.audit_records`
with the run's settings, the model directory's calibration or the shipped limits, and the
run's judge), in one call, on the validator's fp32 model. Figures:

- `audit_s_per_rollout`: that call's wall time over the records, split into
  `prefill` / `replay` / `proofs` / `other` (cheap checks, judge, drift): measured from
  outside, by timing the verifier's public functions where the auditor calls them
  (`verify.prefill.prefill_shared` / `prefill`, `verify.checks.replay_many` / `replay`,
  `verify.checks.proof_chunks_many` / `judge_proof_chunks` / `check_proofs`); a function the
  auditor no longer calls leaves its share under `other`.
- `verify_speedup`: the gen part's seconds per rollout ÷ the audit's (the parent divides).
- `false_fails`: honest records that failed (each reason counted in `fail_reasons`).
- `audit_peak_gib`: the process's peak resident set (model included).
"""

from __future__ import annotations

import collections
import functools
import importlib
import time
from pathlib import Path
from typing import Any

from swarm_node_bench.parts.scale_model import (
    bench_manifest,
    child_setup,
    gpu_gib,
    load_timed,
    peak_rss_gib,
    sync,
)

# (module, function name, share) of the verifier's functions timed from outside
TIMED = (
    ("verify.auditor", "prefill_shared", "prefill"),
    ("verify.auditor", "prefill", "prefill"),
    ("verify.checks", "replay_many", "replay"),
    ("verify.checks", "replay", "replay"),
    ("verify.checks", "proof_chunks_many", "proofs"),
    ("verify.checks", "judge_proof_chunks", "proofs"),
    ("verify.checks", "check_proofs", "proofs"),
)


class ShareTimer:
    """Adds each wrapped call's seconds to its share; a call made inside another timed
    call counts once, under the outer one's share."""

    def __init__(self, device: str) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.device = device
        self.active = False

    def wrap(self, func: Any, share: str) -> Any:
        """`func`, timed under `share`."""

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                return func(*args, **kwargs)
            self.active = True
            t0 = time.perf_counter()
            try:
                out = func(*args, **kwargs)
                sync(self.device)
                return out
            finally:
                self.seconds[share] += time.perf_counter() - t0
                self.active = False

        return timed

    def install(self) -> list[str]:
        """Wrap every function of `TIMED` that exists; returns the ones found."""
        found = []
        for module_name, name, share in TIMED:
            module = importlib.import_module(module_name)
            func = getattr(module, name, None)
            if callable(func):
                setattr(module, name, self.wrap(func, share))
                found.append(f"{module_name}.{name}")
        return found


def audit_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part (module docstring); `config`: model_dir, tokens, records, device."""
    from node.local_model import load_calibration  # deferred: heavy import
    from protocol.rollout import open_record, read_records  # deferred: heavy import
    from trainer.judge import make_judge  # deferred: heavy import
    from verify.auditor import audit_records, settings_for_run  # deferred: heavy import

    device = child_setup(config)
    model, tok, loaded = load_timed(config, device)
    manifest = bench_manifest(config["model_dir"], config["tokens"], config.get("lr", 1e-6))
    with open(config["records"], "rb") as f:
        rollouts = [open_record(r) for r in read_records(f)]
    if not rollouts:
        raise RuntimeError(f"{config['records']} holds no records")
    settings, note = load_calibration(
        Path(config["model_dir"]), settings_for_run(manifest), manifest
    )
    timer = ShareTimer(device)
    found = timer.install()
    judge = make_judge(manifest, tok)
    t0 = time.perf_counter()
    results = audit_records(rollouts, model, judge=judge, settings=settings)
    sync(device)
    total = time.perf_counter() - t0
    n = len(rollouts)
    split = {k: round(timer.seconds[k] / n, 4) for k in ("prefill", "replay", "proofs")}
    split["other"] = round(max(0.0, total - sum(timer.seconds.values())) / n, 4)
    reasons = collections.Counter(r.reason for r in results if not r.passed)
    return {
        "validator": loaded,
        "audit_s_per_rollout": round(total / n, 4),
        "audit_split_s_per_rollout": split,
        "replay_share": round(timer.seconds["replay"] / total, 4) if total > 0 else None,
        "audited": n,
        "false_fails": sum(reasons.values()),
        "fail_reasons": dict(reasons),
        "audit_precision": settings.precision,
        "limits": note,
        "timed_functions": found,
        "audit_peak_gib": peak_rss_gib(),
        "audit_gpu_gib": gpu_gib(device),
    }
