"""Load (and save) an ordinary Hugging Face causal-LM directory from disk, never a hub.

A usable directory holds `config.json`, weights (`*.safetensors`, or the older
`pytorch_model*.bin`) and a tokenizer (`tokenizer.json` or `tokenizer_config.json`).
Every problem becomes a `ModelDirError` with a one-line message naming the path and what
is wrong; callers in `node/` turn it into a `CommandError`.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any


class ModelDirError(ValueError):
    """A model directory that cannot be used; the message is one line."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def check_model_dir(path: str | os.PathLike[str]) -> Path:
    """Cheap checks before loading: existence, config, weights, tokenizer files."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelDirError(f"model directory {p} does not exist")
    if not p.is_dir():
        raise ModelDirError(f"model path {p} is not a directory")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"model directory {p} has no config.json")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{cfg} is not readable JSON ({_one_line(exc)})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ModelDirError(f"{cfg} has no model_type: not a transformers config")
    weights = list(p.glob("*.safetensors")) + list(p.glob("pytorch_model*.bin"))
    if not weights:
        raise ModelDirError(f"model directory {p} has no weights (*.safetensors)")
    if not ((p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file()):
        raise ModelDirError(f"model directory {p} has no tokenizer (tokenizer.json)")
    return p


def load_model_dir(path: str | os.PathLike[str], dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a directory, model in eval mode on the CPU (float32 default)."""
    import torch  # deferred: heavy import
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy import
    from transformers.utils import logging as hf_logging  # deferred: heavy import

    p = check_model_dir(path)
    dtype = dtype or torch.float32
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars would break one-line output
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            except Exception as exc:  # transformers raises many types for broken files
                raise ModelDirError(
                    f"tokenizer in {p} cannot be loaded ({_one_line(exc)})"
                ) from None
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    str(p), local_files_only=True, dtype=dtype
                )
            except Exception as exc:
                raise ModelDirError(f"model in {p} cannot be loaded ({_one_line(exc)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    head = model.get_output_embeddings()
    if head is None:
        raise ModelDirError(f"model in {p} has no LM head: not a causal LM")
    vocab = head.weight.shape[0]
    if len(tokenizer) > vocab:
        raise ModelDirError(
            f"tokenizer in {p} has {len(tokenizer)} tokens but the model only {vocab} outputs"
        )
    return model, tokenizer


def save_model_dir(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """Write an ordinary HF directory (config.json, model.safetensors, tokenizer files)."""
    from transformers.utils import logging as hf_logging  # deferred: heavy import

    hf_logging.disable_progress_bar()
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(p), safe_serialization=True)
    tokenizer.save_pretrained(str(p))
    return p
