"""The devnet's closing evaluation: once every node has stopped, the policy the run started
from and the trainer's last saved version are scored on the same held-out tasks, several
seeded samples each, and compared pairwise. The trainer's own evaluations during the run
(one per published version, one sample on fewer tasks) show the course; this one is
large enough to tell whether the run learned."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.errors import CommandError
from node.paths import resolve_model
from trainer.groups import heldout_items, heldout_shares, paired_gain
from trainer.model_dir import load_model_dir

FINAL_EVAL_TASKS = 512
FINAL_EVAL_SAMPLES = 2  # seeded samples per task: a task's score is its share solved
EVAL_MAX_BATCH = 128


def final_evaluation(
    trainer_dir: Path | None, manifest: Any, tasks: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """The warm-start policy against the last version saved under `trainer_dir` (the
    trainer node's folder) on `tasks` held-out tasks: `trainer.groups.paired_gain` with
    the version, the tasks and the samples per task; `{"skipped": why}` when there is
    nothing to compare or it cannot be loaded."""
    if tasks <= 0:
        return {"skipped": "--eval-tasks 0"}
    ckpt = saved_checkpoint(trainer_dir)
    if ckpt is None:
        return {"skipped": "the trainer saved no version"}
    try:
        base, tok = load_model_dir(resolve_model(None, manifest.model, None))
        trained, version = load_version(ckpt, base)
    except (CommandError, OSError, RuntimeError, KeyError, ValueError) as exc:
        return {"skipped": f"cannot load the policies to compare: {exc}"}
    names = [d.name for d in manifest.datasets for _ in range(d.weight)]
    items = heldout_items(names, tasks)
    say(
        f"devnet: scoring the warm-start policy and version {version} on {len(items)} held-out tasks "
        f"x {FINAL_EVAL_SAMPLES} samples ..."
    )
    before = _shares(base, tok, items, manifest.max_new_tokens)
    after = _shares(trained, tok, items, manifest.max_new_tokens)
    gain = paired_gain(before, after)
    return {
        "version": version,
        "tasks": len(items),
        "samples_per_task": FINAL_EVAL_SAMPLES,
        "warm_start_solve_rate": gain["solve_rate_before"],
        "final_solve_rate": gain["solve_rate_after"],
        "gain": gain["gain"],
        "gain_ci95": gain["gain_ci95"],
    }


def saved_checkpoint(trainer_dir: Path | None) -> Path | None:
    """The trainer's checkpoint under `trainer_dir` (a trainer node's folder, or a folder
    holding one), None when it saved none."""
    from trainer.train_loop import CKPT_FILE  # deferred: heavy import

    ckpts = sorted(trainer_dir.rglob(CKPT_FILE)) if trainer_dir is not None else []
    return ckpts[0] if ckpts else None


def load_version(ckpt: Path, base: Any) -> tuple[Any, int]:
    """(a copy of `base` with the weights of the checkpoint `ckpt`, its version)."""
    import torch  # deferred: heavy import

    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    trained = copy.deepcopy(base)
    trained.load_state_dict(state["model"])
    return trained, int(state["version"])


def _shares(model: Any, tok: Any, items: list[tuple[str, int]], max_new_tokens: int) -> list[float]:
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    engine = HFEngine(model.eval(), tok, max_batch=EVAL_MAX_BATCH)
    return heldout_shares(engine, tok, items, max_new_tokens, FINAL_EVAL_SAMPLES)


def final_text(final: dict[str, Any]) -> str:
    """`final_evaluation` in words."""
    if "gain" not in final:
        return f"final evaluation skipped: {final.get('skipped', 'not run')}"
    low, high = final["gain_ci95"]
    return (
        f"final evaluation ({final['tasks']} held-out tasks x {final['samples_per_task']} samples): "
        f"warm start {final['warm_start_solve_rate']:.3f} -> version {final['version']} "
        f"{final['final_solve_rate']:.3f}, gain {final['gain']:+.3f} (95% interval {low:+.3f} to {high:+.3f})"
    )
