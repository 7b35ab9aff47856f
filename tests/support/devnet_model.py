"""A run file for devnet tests: the tiny policy's tokenizer with a smaller, untrained model
(fast to load and to generate with) saved as a model directory."""

from __future__ import annotations

from pathlib import Path

from node.run_file import manifest_from_table, manifest_to_toml
from trainer.model_dir import save_model_dir
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table


def small_run_file(root: Path, run_id: str, max_new_tokens: int) -> Path:
    """Write `root/model/` and `root/run.toml` (run `run_id`) and return the run file."""
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    table = run_manifest_table(run_id=run_id, seed=3)
    table["run"]["model"] = str(save_model_dir(model, tok, root / "model"))
    table["sampling"]["max_new_tokens"] = max_new_tokens
    run = root / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    return run
