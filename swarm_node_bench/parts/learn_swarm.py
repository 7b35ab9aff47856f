"""`bench learn`'s `efficiency` and `devnet`: what a swarm learns in T seconds against
what one process learns in the same T on the same machine.

The reference (`trainer.single.SingleLearner`): plain on-policy GRPO in this process with
the devnet's run manifest (same loss, engine, task stream, batch size, learning rate,
groups per step; one torch thread, as every node runs), generating and training in turn
for T seconds. The swarm: a default `swarm-node devnet` for T seconds (its nodes share the
machine's cores; start-up after listening counts in T, the drain after it does not), then
the weights of the last version its trainer published. Both, and the policy they started
from, are scored on the same held-out tasks (`DEVNET_SAMPLES` seeded samples each, a
task's score its share solved); gains are paired differences with 95% intervals. The
swarm's produced rollouts are split by what became of them at its trainer
(`node.roles.rollout_fates`).
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

from node.commands import devnet
from node.commands.devnet import DEFAULT_DURATION_S
from node.commands.devnet_evaluation import load_version, saved_checkpoint
from node.console import say as _say
from node.run_file import manifest_from_table
from trainer import tiny_policy
from trainer.groups import heldout_items, heldout_shares, paired_gain

SINGLE_THREADS = 1  # as each devnet node runs (`--threads`); the swarm's nodes share all cores
DEVNET_SAMPLES = 2  # samples per held-out task (narrows the intervals)
QUICK_T_S = 8.0  # --quick: long enough to run every part, too short to learn
QUICK_TASKS = 64
QUICK_WORKERS = 1  # --quick: a devnet of one worker starts sooner
SWARM_KEYS = (
    "swarm_solve_rate",
    "swarm_gain",
    "swarm_ci95",
    "swarm_over_single",
    "swarm_rollouts_produced",
    "swarm_rollout_counts",
    "trained",
    "stale",
    "unverified",
    "incomplete_group",
    "other",
)
FULL_TASKS = 512


def efficiency(
    base: Any, tok: Any, quick: bool, seconds: float | None, swarm: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(`efficiency`, `devnet`): the comparison, and the swarm's run on its own (None
    without the swarm)."""

    t_s = float(seconds or (QUICK_T_S if quick else DEFAULT_DURATION_S))
    manifest = manifest_from_table(tiny_policy.run_manifest_table("devnet"))
    names = [d.name for d in manifest.datasets for _ in range(d.weight)]
    items = heldout_items(names, QUICK_TASKS if quick else FULL_TASKS)
    before = _solved(base, tok, items, manifest.max_new_tokens)
    single = copy.deepcopy(base)
    run = _single(single, tok, manifest, t_s)
    out: dict[str, Any] = {
        "T_s": t_s,
        "heldout_tasks": len(items),
        "samples_per_task": DEVNET_SAMPLES,
        "single": run,
    }
    out.update(_gain("single", before, _solved(single, tok, items, manifest.max_new_tokens)))
    out.update(dict.fromkeys(SWARM_KEYS))
    devnet = None
    if swarm:
        after, devnet, fates = _swarm(base, tok, t_s, {"inference": QUICK_WORKERS} if quick else {})
        scored = _solved(after, tok, items, manifest.max_new_tokens)
        out.update(_gain("swarm", before, scored))
        devnet["solve_rate_before"], devnet["solve_rate_after"] = (
            out["solve_rate_before"],
            out["swarm_solve_rate"],
        )
        devnet["ci95_low"], devnet["ci95_high"] = out["swarm_ci95"]
        devnet.update(heldout_tasks=len(items), samples_per_task=DEVNET_SAMPLES)
        out["swarm_over_single"] = (
            round(out["swarm_gain"] / out["single_gain"], 3) if out["single_gain"] > 0 else None
        )
        out.update(fates)
    _say(f"efficiency: {out}")
    return out, devnet


def _solved(model: Any, tok: Any, items: list[tuple[str, int]], max_new_tokens: int) -> list[float]:
    """Per held-out task, the share of its `DEVNET_SAMPLES` seeded samples that solved it."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    return heldout_shares(
        HFEngine(model, tok, max_batch=128), tok, items, max_new_tokens, DEVNET_SAMPLES
    )


def _gain(who: str, before: list[float], after: list[float]) -> dict[str, Any]:
    g = paired_gain(before, after)
    return {
        "solve_rate_before": g["solve_rate_before"],
        f"{who}_solve_rate": g["solve_rate_after"],
        f"{who}_gain": g["gain"],
        f"{who}_ci95": g["gain_ci95"],
    }


def _single(model: Any, tok: Any, manifest: Any, t_s: float) -> dict[str, Any]:
    from trainer.single import SingleLearner  # deferred: heavy import

    learner = SingleLearner(model, tok, manifest, threads=SINGLE_THREADS)
    run = {**learner.run_for(t_s), "threads": SINGLE_THREADS, "cores": len(os.sched_getaffinity(0))}
    _say(f"efficiency: single process: {run}")
    return run


def _swarm(
    base: Any, tok: Any, t_s: float, settings: dict[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A devnet for `t_s` seconds, default but for `settings` (`devnet.main`'s keywords):
    (the weights its trainer last published, the `devnet` figures so far, the rollout
    shares)."""

    with tempfile.TemporaryDirectory() as d:
        # the bench scores the trainer's last version itself, beside the single process's
        report = devnet.main(
            out=Path(d) / "report", live=False, duration=t_s, eval_tasks=0, **settings
        )
        ckpt = saved_checkpoint(Path(d))
        after, version = load_version(ckpt, base) if ckpt is not None else (copy.deepcopy(base), 0)
    split = report["fates"]  # `devnet_report.rollout_fates`
    fates: dict[str, Any] = {"swarm_rollouts_produced": split["produced"]}
    if "error" in split:  # a node's last status lagged (one killed at the stop): say so
        fates["swarm_rollout_counts"] = {**split["counts"], "error": split["error"]}
    else:
        fates.update(swarm_rollout_counts=split["counts"], **{k: split[k] for k in split["counts"]})
    figures = {
        "workers": report["parameters"]["inference"],
        "trainer_version": version,
        "duration_s": report.get("elapsed_s"),
        "drain_s": report.get("drain_s"),
    }
    return after, figures, fates
