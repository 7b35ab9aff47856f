"""What `bench scale`'s parts share: the model directory, the bench's run manifest, each
part's memory estimate, and the child-side helpers (threads, device, peak memory).

The model directory is `swarm-node init-model --shape` (`node.commands.init_model.main_shape`),
built once under the data directory (`~/.cache/swarm-node/models/<shape>-bfloat16-seed0`)
and found there by later runs. The run manifest is the built-in run's
(`trainer.tiny_policy.run_manifest_table`: task mix, group size 4, proofs) with the model
directory, the completion length, the bench's learning rate and bf16 versions.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from node.run_file import manifest_from_table
from trainer import shaped_model, tiny_policy

GIB = 2**30
# A learning rate of the order used for RL on Qwen2 0.5B–7B policies (what one step of the
# bench's run moves; the patch size of a bf16 version depends on it).
DEFAULT_LR = 1e-6
RUNTIME_BYTES = 1.2 * GIB  # interpreter, torch, transformers, tokenizer


def bench_manifest(model_dir: str, tokens: int, lr: float = DEFAULT_LR) -> Any:
    """The bench's run manifest (module docstring)."""
    table = tiny_policy.run_manifest_table(run_id="bench-scale", seed=1)
    table["run"]["model"] = str(model_dir)
    table["sampling"]["max_new_tokens"] = int(tokens)
    table["rl"]["lr"] = float(lr)
    table["weights"] = {"dtype": "bfloat16"}
    return manifest_from_table(table, source="bench scale manifest")


def params_of(shape: str) -> int:
    """Parameters of a `--shape` name (`trainer.shaped_model`)."""
    return shaped_model.param_count(shaped_model.shape_of(shape))


def need_bytes(part: str, shape: str, tokens: int, batch: int, micro_batch: int) -> float:
    """Resident memory a part needs at this shape (a rough upper estimate, used to skip a
    part that cannot fit before it starts): fp32 weights are 4 bytes a parameter."""
    spec = shaped_model.shape_of(shape)
    p = shaped_model.param_count(spec)
    v, h = spec.vocab, spec.hidden
    if part == "build":
        return shaped_model.estimate(spec).peak_memory_bytes + RUNTIME_BYTES
    if part == "load":
        return 4 * p + RUNTIME_BYTES
    if part == "gen":  # weights, one batch's fp32 logits and the sampler's copies, KV cache
        kv = 2 * spec.layers * batch * (tokens + 128) * spec.kv_heads * (h // spec.heads) * 4
        return 4 * p + 4 * batch * v * 4 + kv + RUNTIME_BYTES
    if part == "audit":  # weights, a prefill batch's hidden rows and fp32 logits
        rows = min(batch * (tokens + 128), 16_384)
        return 4 * p + rows * (v + h) * 4 * 2 + RUNTIME_BYTES
    if part == "train":  # weights, gradients, two AdamW moments, checkpointed activations
        seq = tokens + 128
        act = (
            spec.layers * micro_batch * seq * h * 4
            + micro_batch * seq * (10 * h + 3 * spec.intermediate) * 4
        )
        head = 3 * min(micro_batch * tokens, 1024) * v * 4
        return 16 * p + act + head + RUNTIME_BYTES
    if part == "weights":  # fp32 model, bf16 state copies, checkpoint bytes and a patch
        return 4 * p + 8 * p + RUNTIME_BYTES
    if part == "e2e":  # trainer + 2 workers + validator, each its own process
        return (16 * p + RUNTIME_BYTES) + 3 * (4 * p + RUNTIME_BYTES)
    raise ValueError(f"unknown part {part!r}")


# ----------------------------------------------------------------------- child side


def child_setup(config: dict[str, Any]) -> str:
    """Set torch's CPU threads (`config["threads"]`, else every core) and return the
    device to run on ("cpu" or "cuda"); raises when CUDA is asked for and absent."""
    import torch  # deferred: heavy import

    torch.set_num_threads(int(config.get("threads") or os.cpu_count() or 1))
    device = config.get("device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device here")
    return device


def peak_rss_gib() -> float:
    """This process's peak resident set in GiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def gpu_gib(device: str) -> float | None:
    """Peak CUDA memory allocated by this process in GiB (None on the CPU)."""
    if device != "cuda":
        return None
    import torch  # deferred: heavy import

    return round(torch.cuda.max_memory_allocated() / GIB, 3)


def sync(device: str) -> None:
    """Wait for queued device work (timings on CUDA)."""
    if device == "cuda":
        import torch  # deferred: heavy import

        torch.cuda.synchronize()


def load_timed(config: dict[str, Any], device: str) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, figures) of the bench's model directory, loaded as the roles load
    it (`trainer.model_dir.load_model_dir`, fp32) and moved to `device`; figures: `load_s`,
    `rss_gib`, `gpu_gib` right after the load."""
    import transformers  # deferred: heavy import; imported before the clock starts

    from trainer.model_dir import load_model_dir  # deferred: heavy import

    assert transformers.AutoModelForCausalLM is not None  # resolve the lazy module now
    t0 = time.perf_counter()
    model, tok = load_model_dir(config["model_dir"])
    if device != "cpu":
        model = model.to(device)
    sync(device)
    figures = {
        "load_s": round(time.perf_counter() - t0, 2),
        "rss_gib": peak_rss_gib(),
        "gpu_gib": gpu_gib(device),
    }
    return model, tok, figures


def load_part(config: dict[str, Any]) -> dict[str, Any]:
    """The `load` part: the model directory loaded once, timed, and its parameters."""
    device = child_setup(config)
    model, _tok, figures = load_timed(config, device)
    return {**figures, "params": sum(p.numel() for p in model.parameters())}


def build_part(config: dict[str, Any]) -> dict[str, Any]:
    """Build (or find) the model directory of `config["shape"]`: `init-model --shape`."""
    from node.commands.init_model import main_shape  # deferred: heavy import

    t0 = time.perf_counter()
    report = main_shape(
        config["shape"],
        data_dir=config.get("data_dir"),
        tokenizer=config.get("tokenizer"),
        quiet=True,
    )
    return {
        "model_dir": report["model_dir"],
        "built": report["built"],
        "seconds": round(time.perf_counter() - t0, 2),
    }
