"""A Hugging Face model directory of a real Qwen2 shape with random weights, built here.

Nothing is downloaded. The shapes are those of the published Qwen2 checkpoints (the table
in docs/MODELS.md: 0.5B and 1.5B tie their embeddings, 7B does not and has a vocabulary of
152,064), plus `qwen2-test`, a tiny one for tests that keeps the real
vocabulary. The tokenizer is a real Qwen `tokenizer.json` given by the caller.

Build, one tensor at a time, so no second copy of the model is ever held:
1. the config (`transformers.Qwen2Config`); the parameter names and shapes come from a
   `Qwen2ForCausalLM` made on the meta device (no memory), the tied `lm_head.weight` left
   out as `save_pretrained` does;
2. each tensor drawn as transformers initialises a Qwen2 (`initializer_range` normal for
   matrices, ones for RMSNorm weights, zeros for biases) from its own generator, seeded by
   the build seed and the tensor's name, so the bytes do not depend on the sharding;
3. tensors packed into safetensors shards of at most `max_shard_bytes` (one
   `model.safetensors` when it fits, else `model-0000k-of-0000n.safetensors` and
   `model.safetensors.index.json`); only the shard being filled is in memory.

Peak memory is about one shard plus the largest tensor in float32; `estimate` gives that and
the bytes on disk before anything is built.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------- settings
DTYPES = {"bfloat16": 2, "float32": 4}  # dtype name -> bytes per value
DEFAULT_DTYPE = "bfloat16"  # as the published checkpoints
MAX_SHARD_BYTES = 2 * 2**30
INITIALIZER_RANGE = 0.02  # Qwen2Config's default
# Special tokens of the Qwen tokenizer (ids 151643 and 151645 in the real one): a completion
# ends at either, as with the published Qwen2 instruct models.
END_OF_TEXT, IM_END = "<|endoftext|>", "<|im_end|>"


@dataclass(frozen=True)
class Shape:
    """The dimensions of one Qwen2 model (the fields of `Qwen2Config` that size it)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int = 32768
    rope_theta: float = 1_000_000.0


# docs/MODELS.md, "Shapes": the published configs of Qwen/Qwen2-{0.5B,1.5B,7B}.
SHAPES: dict[str, Shape] = {
    "qwen2-0.5b": Shape(896, 24, 14, 2, 4864, 151_936, tied=True),
    "qwen2-1.5b": Shape(1536, 28, 12, 2, 8960, 151_936, tied=True),
    "qwen2-7b": Shape(3584, 28, 28, 4, 18944, 152_064, tied=False, max_positions=131072),
    "qwen2-test": Shape(64, 2, 4, 2, 128, 151_936, tied=True, max_positions=4096),
}


class ShapedModelError(ValueError):
    """A shape or tokenizer that cannot be built from; the message is one line."""


def shape_of(name: str) -> Shape:
    """The shape called `name`, or a one-line error listing the known ones."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ShapedModelError(
            f"unknown shape {name!r}: one of {', '.join(sorted(SHAPES))}"
        ) from None


def param_count(shape: Shape) -> int:
    """Parameters of a Qwen2 of this shape, from its dimensions alone.

    Embedding V*H; per layer: q, k, v projections with biases (H*(nh*d) + nh*d, twice
    H*(kv*d) + kv*d), o projection (nh*d)*H, the gated MLP 3*H*I, two RMSNorms 2*H; the
    final norm H; the LM head V*H unless tied (d = H / nh)."""
    h, d = shape.hidden, shape.hidden // shape.heads
    q, kv = shape.heads * d, shape.kv_heads * d
    layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * shape.intermediate + 2 * h
    head = 0 if shape.tied else shape.vocab * h
    return shape.vocab * h + shape.layers * layer + h + head


@dataclass(frozen=True)
class Estimate:
    """What building a shape takes: bytes on disk and peak bytes of memory."""

    params: int
    disk_bytes: int
    peak_memory_bytes: int


def estimate(
    shape: Shape, dtype: str = DEFAULT_DTYPE, max_shard_bytes: int = MAX_SHARD_BYTES
) -> Estimate:
    """Disk and memory needed to build `shape` at `dtype` (see the module docstring)."""
    size = DTYPES[dtype]
    n = param_count(shape)
    largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
    shard = min(n * size, max_shard_bytes)
    # the shard being filled + the largest tensor drawn in float32 + the safetensors buffer
    return Estimate(n, n * size, 2 * shard + largest * 4)


def qwen2_config(shape: Shape, tokenizer: Any, dtype: str = DEFAULT_DTYPE) -> Any:
    """The `Qwen2Config` of `shape`, its special token ids those of `tokenizer`."""
    from transformers import Qwen2Config  # deferred: heavy import

    return Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tied,
        initializer_range=INITIALIZER_RANGE,
        bos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        dtype=dtype,
    )


# ---------------------------------------------------------------------------- tokenizer
def load_tokenizer(tokenizer_json: Path, chat_template: str | None = None) -> Any:
    """A `PreTrainedTokenizerFast` over a Qwen `tokenizer.json`: EOS `<|im_end|>`, padding
    `<|endoftext|>` on the left (a model directory's tokenizer as the engines expect)."""
    from tokenizers import Tokenizer  # deferred: heavy import
    from transformers import PreTrainedTokenizerFast  # deferred: heavy import

    try:
        raw = Tokenizer.from_file(str(tokenizer_json))
    except Exception as exc:  # tokenizers raises its own exception types for bad files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ShapedModelError(f"{tokenizer_json} is not a tokenizer.json ({first})") from None
    missing = [t for t in (END_OF_TEXT, IM_END) if raw.token_to_id(t) is None]
    if missing:
        raise ShapedModelError(
            f"{tokenizer_json} has no {' or '.join(missing)} token: not a Qwen tokenizer"
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        padding_side="left",
        model_max_length=131072,
    )
    if chat_template:
        tok.chat_template = chat_template
    return tok


# -------------------------------------------------------------------------------- build
def _tensor_specs(config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor a saved directory holds, in state-dict order."""
    import torch  # deferred: heavy import
    from transformers import Qwen2ForCausalLM  # deferred: heavy import

    with torch.device("meta"):
        meta = Qwen2ForCausalLM(config)
    skip = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return [(k, tuple(v.shape)) for k, v in meta.state_dict().items() if k not in skip]


def _draw(name: str, shape: tuple[int, ...], seed: int, dtype: Any) -> Any:
    """One tensor as transformers initialises a Qwen2, from a generator of its own."""
    import torch  # deferred: heavy import

    if len(shape) == 1:  # RMSNorm weights are ones, biases zeros
        fill = 1.0 if name.endswith("norm.weight") else 0.0
        return torch.full(shape, fill, dtype=dtype)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    out = torch.empty(shape, dtype=torch.float32).normal_(0.0, INITIALIZER_RANGE, generator=gen)
    return out.to(dtype)


def _shards(
    specs: list[tuple[str, tuple[int, ...]]], size: int, max_shard_bytes: int
) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Tensors grouped in order into shards of at most `max_shard_bytes` (a larger tensor
    alone)."""
    out: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in specs:
        nbytes = size * math.prod(shape)
        if out[-1] and used + nbytes > max_shard_bytes:
            out.append([])
            used = 0
        out[-1].append((name, shape))
        used += nbytes
    return out


def _shard_names(count: int) -> Iterator[str]:
    if count == 1:
        yield "model.safetensors"
        return
    for k in range(count):
        yield f"model-{k + 1:05d}-of-{count:05d}.safetensors"


def build_model_dir(
    shape: Shape,
    tokenizer_json: Path,
    out: Path,
    *,
    seed: int = 0,
    dtype: str = DEFAULT_DTYPE,
    chat_template: str | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write a complete model directory of `shape` to `out` (through a temporary directory
    renamed at the end); returns a report (params, bytes, seconds, shards)."""
    import torch  # deferred: heavy import
    from safetensors.torch import save_file  # deferred: heavy import
    from transformers import GenerationConfig  # deferred: heavy import

    say = progress or (lambda _m: None)
    if dtype not in DTYPES:
        raise ShapedModelError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer_json, chat_template)
    if len(tok) > shape.vocab:
        raise ShapedModelError(
            f"{tokenizer_json} has {len(tok)} tokens, more than the shape's vocabulary {shape.vocab}"
        )
    config = qwen2_config(shape, tok, dtype)
    specs = _tensor_specs(config)
    size = DTYPES[dtype]
    total = sum(size * math.prod(s) for _, s in specs)
    groups = _shards(specs, size, max_shard_bytes)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch_dtype = getattr(torch, dtype)
    weight_map: dict[str, str] = {}
    written = 0
    for k, (file, group) in enumerate(zip(_shard_names(len(groups)), groups, strict=True)):
        tensors = {}
        for name, tshape in group:
            tensors[name] = _draw(name, tshape, seed, torch_dtype)
            weight_map[name] = file
        save_file(tensors, str(tmp / file), metadata={"format": "pt"})
        written += sum(size * t.numel() for t in tensors.values())
        del tensors
        say(
            f"init-model: shard {k + 1}/{len(groups)} written ({written / 1e9:.2f} of "
            f"{total / 1e9:.2f} GB, {time.perf_counter() - t0:.0f}s)"
        )
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config.save_pretrained(str(tmp))
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    n_params = sum(math.prod(s) for _, s in specs)
    report = {
        "shape": {k: v for k, v in shape.__dict__.items()},
        "seed": seed,
        "dtype": dtype,
        "n_params": n_params,
        "weight_bytes": total,
        "shards": len(groups),
        "vocab_size": shape.vocab,
        "tokenizer_tokens": len(tok),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (tmp / "shaped_model.json").write_text(json.dumps(report, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return report
