"""A run file for devnet tests: the tiny policy's tokenizer with a smaller, untrained model
(fast to load and to generate with) saved as a model directory."""

from __future__ import annotations

from pathlib import Path

from node.testing.reach_join import small_run


def small_run_file(root: Path, run_id: str, max_new_tokens: int) -> Path:
    """Write `root/model/` and `root/run.toml` (run `run_id`) and return the run file."""
    return small_run(root, run_id, max_new_tokens)
