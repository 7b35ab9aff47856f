"""Canonical safetensors checkpoints: one byte layout per set of tensors, so one digest.

A policy version *is* a canonical safetensors file: tensors sorted by name, packed back to
back with no padding between them, the JSON header written with sorted keys and no spaces
(no `__metadata__`), padded with spaces to a multiple of 8 bytes, as the safetensors
format allows. Two exporters holding the same tensors write the same bytes, so the
version's digest (`protocol.content_id` of the file) names the weights themselves: the
trainer signs it in the weight manifest, every receiver checks it after install, and the
run manifest's `model_digest` is this digest of version 0.

Layout reminder (safetensors): 8-byte little-endian header length N, N bytes of JSON
header `{name: {"dtype", "shape", "data_offsets": [begin, end]}}` (offsets relative to the
data section), then the data.

Public API: `Checkpoint` (parsed file: `tensors` in file order with byte ranges, `data`),
`parse(data)`, `canonical_bytes(tensors)` from `{name: (dtype, shape, raw bytes)}`,
`canonicalize(data)` (any safetensors file -> canonical bytes), `from_state_dict(sd, cast=)`
(torch tensors -> canonical bytes, floating ones optionally cast, e.g. to bfloat16),
`cast_checkpoint(data, cast)`, `snapshot_state(sd, cast)` (a copy to publish from while
training goes on), `from_model_dir(path)` (every `*.safetensors` of a
Hugging Face directory), `weights_digest(data)`. Bad input raises `CheckpointError` with a
one-line message.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.content_id import content_id

# dtype name -> bytes per element (the safetensors dtype names)
DTYPE_SIZES: Mapping[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own cap
_LEN = struct.Struct("<Q")


class CheckpointError(ValueError):
    """Bytes that are not a usable safetensors checkpoint; the message is one line."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a parsed file: where its bytes lie in the *whole file*."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        return self.end - self.begin

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (first dimension); the whole tensor for scalars and vectors."""
        if len(self.shape) < 2 or self.shape[0] == 0:
            return self.nbytes
        return self.nbytes // self.shape[0]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A parsed safetensors file: the header size and the tensors in data order."""

    data: bytes
    header_end: int  # offset of the data section
    tensors: tuple[TensorEntry, ...]

    def tensor_bytes(self, entry: TensorEntry) -> bytes:
        """The raw data bytes of one tensor."""
        return self.data[entry.begin : entry.end]

    def by_name(self) -> dict[str, TensorEntry]:
        """The tensor entries by name."""
        return {t.name: t for t in self.tensors}


def parse(data: bytes) -> Checkpoint:
    """Parse and check a safetensors file (header, dtypes, shapes, offsets in bounds)."""
    if len(data) < _LEN.size:
        raise CheckpointError(f"checkpoint of {len(data)} bytes is too short for a header")
    (n,) = _LEN.unpack_from(data, 0)
    if n > MAX_HEADER_BYTES or _LEN.size + n > len(data):
        raise CheckpointError(f"checkpoint header length {n} does not fit in {len(data)} bytes")
    try:
        header = json.loads(data[_LEN.size : _LEN.size + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError("checkpoint header is not a JSON object")
    start = _LEN.size + n
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"tensor {name!r}: bad header entry") from None
        if dtype not in DTYPE_SIZES:
            raise CheckpointError(f"tensor {name!r}: unknown dtype {dtype!r}")
        count = 1
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise CheckpointError(f"tensor {name!r}: bad shape {list(shape)}")
            count *= d
        if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e <= len(data) - start):
            raise CheckpointError(f"tensor {name!r}: data offsets [{b}, {e}] out of bounds")
        if e - b != count * DTYPE_SIZES[dtype]:
            raise CheckpointError(f"tensor {name!r}: {e - b} bytes for shape {list(shape)} {dtype}")
        entries.append(TensorEntry(name, dtype, shape, start + b, start + e))
    entries.sort(key=lambda t: (t.begin, t.name))
    for a, b in zip(entries, entries[1:], strict=False):
        if b.begin < a.end:
            raise CheckpointError(f"tensors {a.name!r} and {b.name!r} overlap")
    return Checkpoint(bytes(data), start, tuple(entries))


def canonical_bytes(tensors: Mapping[str, tuple[str, tuple[int, ...], bytes]]) -> bytes:
    """The canonical file of `{name: (dtype, shape, raw little-endian bytes)}`."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        if dtype not in DTYPE_SIZES:
            raise CheckpointError(f"tensor {name!r}: unknown dtype {dtype!r}")
        count = 1
        for d in shape:
            count *= d
        if len(raw) != count * DTYPE_SIZES[dtype]:
            raise CheckpointError(f"tensor {name!r}: {len(raw)} bytes for {list(shape)} {dtype}")
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([_LEN.pack(len(text)), text, *(bytes(tensors[n][2]) for n in sorted(tensors))])


def canonicalize(data: bytes) -> bytes:
    """Any safetensors file -> its canonical bytes (same tensors, canonical layout)."""
    ck = parse(data)
    return canonical_bytes({t.name: (t.dtype, t.shape, ck.tensor_bytes(t)) for t in ck.tensors})


_TORCH_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


def from_state_dict(
    state: Mapping[str, Any], prefer: Collection[str] = (), cast: str | None = None
) -> bytes:
    """Canonical bytes of a torch state dict (tensors copied to the CPU, contiguous).

    `cast` (a torch dtype name, e.g. "bfloat16"): floating tensors are written cast to it,
    one tensor at a time, rounding to nearest even; the tensors in `state` are untouched
    (a trainer's fp32 master never takes the rounding). None writes them as they are.

    Tied weights (two names over one storage, e.g. embeddings and LM head) are written
    once, under a name in `prefer` if one is (pass the previous version's names so the
    layout stays the same), else the one that sorts last (`model.embed_tokens.weight` over
    `lm_head.weight`, as `save_pretrained` writes them); loading restores the tie
    (`node.roles.policy_versions.load_weights`)."""
    import torch  # deferred: heavy import

    out: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...], str]] = set()
    preferred = set(prefer)
    items = sorted(state.items(), reverse=True)  # last name first: embed_tokens over lm_head
    items.sort(key=lambda kv: kv[0] not in preferred)
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"state dict entry {name!r} is not a tensor")
        if t.numel():  # tied weights (one storage under two names) are written once
            alias = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype))
            if alias in seen:
                continue
            seen.add(alias)
        dtype = _TORCH_DTYPES.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise CheckpointError(f"tensor {name!r}: unsupported dtype {t.dtype}")
        t = t.detach().to("cpu")
        if cast is not None and dtype in FLOAT_DTYPES:
            t = t.to(getattr(torch, cast))  # a new tensor: the caller's stays as it was
            dtype = _TORCH_DTYPES[cast]
        t = t.contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out[name] = (dtype, tuple(t.shape), raw)
    return canonical_bytes(out)


def snapshot_state(state: Mapping[str, Any], cast: str | None = None) -> dict[str, Any]:
    """A copy of a state dict that later training steps cannot change (what a trainer
    publishes from). None: each tensor cloned as it is. With `cast`, floating tensors are
    copied cast to it (half the memory of an fp32 clone for bfloat16) and tied tensors
    (one storage under two names) stay tied, so the version writes them once."""
    import torch  # deferred: heavy import

    if cast is None:
        return {k: v.detach().clone() for k, v in state.items()}
    dtype = getattr(torch, cast)
    copies: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], Any] = {}
    out: dict[str, Any] = {}
    for name, t in state.items():
        alias = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype))
        if alias not in copies or not t.numel():
            t = t.detach()
            copies[alias] = t.to(dtype, copy=True) if t.is_floating_point() else t.clone()
        out[name] = copies[alias]
    return out


def cast_checkpoint(data: bytes, cast: str | None) -> bytes:
    """A canonical checkpoint with its floating tensors cast to `cast` (see
    `from_state_dict`); `data` itself when `cast` is None."""
    if cast is None:
        return data
    return from_state_dict(to_state_dict(data), cast=cast)


def to_state_dict(data: bytes) -> dict[str, Any]:
    """Torch tensors of a checkpoint (what `model.load_state_dict` takes)."""
    from safetensors.torch import load  # deferred: heavy import

    try:
        return load(bytes(data))
    except Exception as exc:  # the library raises its own error types for broken files
        raise CheckpointError(f"checkpoint cannot be loaded: {exc}") from None


def from_model_dir(path: str | Path) -> bytes:
    """Canonical bytes of all `*.safetensors` files of a model directory, merged."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no *.safetensors file")
    merged: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for f in files:
        ck = parse(f.read_bytes())
        for t in ck.tensors:
            if t.name in merged:
                raise CheckpointError(f"tensor {t.name!r} appears in two files of {path}")
            merged[t.name] = (t.dtype, t.shape, ck.tensor_bytes(t))
    return canonical_bytes(merged)


def weights_digest(data: bytes) -> bytes:
    """The digest of a canonical checkpoint (what manifests sign)."""
    return content_id(data)
