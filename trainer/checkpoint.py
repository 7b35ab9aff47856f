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

Streamed (a checkpoint of any size, never whole in memory): `Streamed` (the header and,
per tensor in file order, a function producing its bytes), `stream_state_dict(sd, prefer,
cast)`, `stream_bytes(data)`, `stream_files(paths)`; `Streamed.digest()`,
`Streamed.write_to(fh)`, `Streamed.to_bytes()`. `ModelDirWeights` / `model_dir_weights(path)`:
a model directory's weights by path and digest (read again when needed, never held).
`VersionFile(path)`: an installed version read tensor by tensor (`index`, `read(offset,
size)`). `mapped_state_dict(path)`: torch tensors over a memory map of the file (no copy;
pages come from the page cache as the tensors are read).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import struct
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.content_id import Hasher, content_id, new_hasher

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


def _index(data: Any, total: int) -> tuple[int, tuple[TensorEntry, ...]]:
    """The data offset and tensor entries of a safetensors file of `total` bytes whose
    first bytes (at least the header) are `data` (any buffer, never copied whole)."""
    if total < _LEN.size or len(data) < _LEN.size:
        raise CheckpointError(f"checkpoint of {total} bytes is too short for a header")
    (n,) = _LEN.unpack_from(data, 0)
    if n > MAX_HEADER_BYTES or _LEN.size + n > min(total, len(data)):
        raise CheckpointError(f"checkpoint header length {n} does not fit in {total} bytes")
    try:
        header = json.loads(bytes(data[_LEN.size : _LEN.size + n]))
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
        if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e <= total - start):
            raise CheckpointError(f"tensor {name!r}: data offsets [{b}, {e}] out of bounds")
        if e - b != count * DTYPE_SIZES[dtype]:
            raise CheckpointError(f"tensor {name!r}: {e - b} bytes for shape {list(shape)} {dtype}")
        entries.append(TensorEntry(name, dtype, shape, start + b, start + e))
    entries.sort(key=lambda t: (t.begin, t.name))
    for a, b in zip(entries, entries[1:], strict=False):
        if b.begin < a.end:
            raise CheckpointError(f"tensors {a.name!r} and {b.name!r} overlap")
    return start, tuple(entries)


def parse(data: bytes) -> Checkpoint:
    """Parse and check a safetensors file (header, dtypes, shapes, offsets in bounds)."""
    start, entries = _index(data, len(data))
    return Checkpoint(bytes(data), start, entries)


def _header(specs: Mapping[str, tuple[str, tuple[int, ...]]]) -> tuple[bytes, list[TensorEntry]]:
    """The canonical header (length prefix included) of tensors `{name: (dtype, shape)}`
    and their entries in file order."""
    header: dict[str, Any] = {}
    spans: list[tuple[str, str, tuple[int, ...], int, int]] = []
    offset = 0
    for name in sorted(specs):
        dtype, shape = specs[name]
        if dtype not in DTYPE_SIZES:
            raise CheckpointError(f"tensor {name!r}: unknown dtype {dtype!r}")
        count = 1
        for d in shape:
            count *= d
        nbytes = count * DTYPE_SIZES[dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        spans.append((name, dtype, tuple(shape), offset, offset + nbytes))
        offset += nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = _LEN.pack(len(text)) + text
    return head, [TensorEntry(n, d, sh, len(head) + b, len(head) + e) for n, d, sh, b, e in spans]


def canonical_bytes(tensors: Mapping[str, tuple[str, tuple[int, ...], bytes]]) -> bytes:
    """The canonical file of `{name: (dtype, shape, raw little-endian bytes)}`."""
    head, entries = _header({n: (d, tuple(sh)) for n, (d, sh, _raw) in tensors.items()})
    for t in entries:
        if len(tensors[t.name][2]) != t.nbytes:
            raise CheckpointError(
                f"tensor {t.name!r}: {len(tensors[t.name][2])} bytes for {list(t.shape)} {t.dtype}"
            )
    return b"".join([head, *(bytes(tensors[t.name][2]) for t in entries)])


def canonicalize(data: bytes) -> bytes:
    """Any safetensors file -> its canonical bytes (same tensors, canonical layout)."""
    return stream_bytes(data).to_bytes()


Produce = Callable[[], Any]  # returns one tensor's raw bytes (a buffer), made when called
STREAM_CHUNK = 8 * 2**20  # bytes read or hashed at once when nothing finer is needed


@dataclass(frozen=True, slots=True)
class Streamed:
    """A canonical checkpoint made piece by piece: its header (length prefix included) and,
    per tensor in file order, its entry and a function producing its raw bytes. Only the
    tensor being written is in memory (plus whatever its source already holds)."""

    header: bytes
    parts: tuple[tuple[TensorEntry, Produce], ...]

    @property
    def header_end(self) -> int:
        """Offset of the data section."""
        return len(self.header)

    @property
    def tensors(self) -> tuple[TensorEntry, ...]:
        """The tensor entries in file order."""
        return tuple(t for t, _ in self.parts)

    @property
    def size(self) -> int:
        """Bytes of the whole file."""
        return self.parts[-1][0].end if self.parts else len(self.header)

    def pieces(self) -> Iterator[tuple[TensorEntry | None, memoryview]]:
        """(None, header), then (entry, its bytes) per tensor, in file order."""
        yield None, memoryview(self.header)
        for t, produce in self.parts:
            raw = memoryview(produce()).cast("B")
            if raw.nbytes != t.nbytes:
                raise CheckpointError(f"tensor {t.name!r}: {raw.nbytes} bytes for {t.nbytes}")
            yield t, raw

    def digest(self) -> bytes:
        """`weights_digest` of the file, hashed as it is produced."""
        hasher = new_hasher()
        for _, raw in self.pieces():
            hasher.update(raw)
        return hasher.digest()

    def write_to(self, fh: Any, hasher: Hasher | None = None) -> None:
        """Write the file to the binary file `fh` (fed to `hasher` too, when given)."""
        for _, raw in self.pieces():
            if hasher is not None:
                hasher.update(raw)
            fh.write(raw)

    def to_bytes(self) -> bytes:
        """The whole file in memory (small checkpoints, tests)."""
        return b"".join(bytes(raw) for _, raw in self.pieces())


def _stream(specs: Mapping[str, tuple[str, tuple[int, ...], Produce]]) -> Streamed:
    head, entries = _header({n: (d, sh) for n, (d, sh, _p) in specs.items()})
    return Streamed(head, tuple((t, specs[t.name][2]) for t in entries))


def stream_bytes(data: bytes) -> Streamed:
    """Any safetensors file (a buffer: bytes, a memory map) as its canonical stream; the
    tensors are views of `data`."""
    start, entries = _index(data, len(data))
    view = memoryview(data)
    return _stream(
        {
            t.name: (t.dtype, t.shape, lambda t=t: view[t.begin : t.end])  # type: ignore[misc]
            for t in entries
        }
    )


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
    """Canonical bytes of a torch state dict (`stream_state_dict(...).to_bytes()`)."""
    return stream_state_dict(state, prefer, cast).to_bytes()


def stream_state_dict(
    state: Mapping[str, Any], prefer: Collection[str] = (), cast: str | None = None
) -> Streamed:
    """The canonical stream of a torch state dict: each tensor is copied to the CPU (and
    cast, made contiguous) only when its turn to be written comes.

    `cast` (a torch dtype name, e.g. "bfloat16"): floating tensors are written cast to it,
    one tensor at a time, rounding to nearest even; the tensors in `state` are untouched
    (a trainer's fp32 master never takes the rounding). None writes them as they are.

    Tied weights (two names over one storage, e.g. embeddings and LM head) are written
    once, under a name in `prefer` if one is (pass the previous version's names so the
    layout stays the same), else the one that sorts last (`model.embed_tokens.weight` over
    `lm_head.weight`, as `save_pretrained` writes them); loading restores the tie
    (`node.roles.policy_versions.load_weights`)."""
    import torch  # deferred: heavy import

    specs: dict[str, tuple[str, tuple[int, ...], Produce]] = {}
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
        to = None
        if cast is not None and dtype in FLOAT_DTYPES:
            to, dtype = getattr(torch, cast), _TORCH_DTYPES[cast]
        specs[name] = (dtype, tuple(t.shape), functools.partial(_tensor_bytes, t, to))
    return _stream(specs)


def _tensor_bytes(t: Any, to: Any) -> Any:
    """A tensor's raw bytes on the CPU, cast to `to` when given (a buffer; no copy when the
    tensor already is a contiguous CPU tensor of that dtype)."""
    import torch  # deferred: heavy import

    t = t.detach().to("cpu")
    if to is not None:
        t = t.to(to)  # a new tensor: the caller's stays as it was
    t = t.contiguous()
    return t.view(torch.uint8).numpy() if t.numel() else b""


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
    return stream_model_dir(path).to_bytes()


def stream_model_dir(path: str | Path) -> Streamed:
    """The canonical stream of all `*.safetensors` files of a model directory, merged;
    the files are memory-mapped and each tensor read when its turn comes."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no *.safetensors file")
    return stream_files(files, f"{path}")


def stream_files(files: Collection[Path], where: str = "") -> Streamed:
    """The canonical stream of the tensors of several safetensors files (memory-mapped)."""
    merged: dict[str, tuple[str, tuple[int, ...], Produce]] = {}
    for f in files:
        view = _map(f)
        _start, entries = _index(view, len(view))
        for t in entries:
            if t.name in merged:
                raise CheckpointError(f"tensor {t.name!r} appears in two files of {where or f}")
            merged[t.name] = (t.dtype, t.shape, lambda v=view, t=t: v[t.begin : t.end])
    return _stream(merged)


def _map(path: Path) -> memoryview:
    """A read-only memory map of a whole file (empty files as an empty view)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if not size:
                return memoryview(b"")
            return memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class ModelDirWeights:
    """A model directory's weights (policy version 0) named by path and canonical digest;
    read again from the files whenever needed, never held in memory."""

    path: Path
    digest: bytes

    def stream(self) -> Streamed:
        """The canonical stream of the directory's weights."""
        return stream_model_dir(self.path)


def model_dir_weights(path: str | Path) -> ModelDirWeights:
    """A model directory's weights with their digest (one hash pass, streamed)."""
    return ModelDirWeights(Path(path), stream_model_dir(path).digest())


class VersionFile:
    """A checkpoint file read piece by piece: its `header`, tensor `index` and `read(offset,
    size)`. A context manager (closes the file)."""

    def __init__(self, path: Path) -> None:
        try:
            self._fh = open(path, "rb")  # noqa: SIM115 (closed by close / __exit__)
            self.size = os.fstat(self._fh.fileno()).st_size
            head = self.read(0, min(self.size, _LEN.size)).tobytes()
            n = _LEN.unpack_from(head, 0)[0] if len(head) == _LEN.size else 0
            if n <= MAX_HEADER_BYTES:
                head += self.read(_LEN.size, min(n, max(0, self.size - _LEN.size))).tobytes()
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
        self.header_end, self.index = _index(head, self.size)
        self.header = bytes(head[: self.header_end])

    def read(self, offset: int, size: int) -> Any:
        """`size` bytes at `offset`, a writable uint8 numpy array (`CheckpointError` if the
        file is shorter). Not a `bytearray`: that zero-fills holding the GIL."""
        import numpy as np  # deferred: heavy import

        buf = np.empty(size, dtype=np.uint8)
        got = os.preadv(self._fh.fileno(), [buf.data], offset) if size else 0
        if got != size:
            raise CheckpointError(f"{self._fh.name}: short read at {offset}")
        return buf

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def __enter__(self) -> VersionFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TORCH_OF = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
}


def mapped_state_dict(path: str | Path) -> dict[str, Any]:
    """Torch tensors of a checkpoint file over a private memory map of it: nothing is read
    until a tensor is, and what is read comes from the page cache (a tensor whose offset is
    not aligned to its element size is copied). Writes to the tensors stay in this process;
    the map lives as long as a tensor does."""
    import torch  # deferred: heavy import

    try:
        with open(path, "rb") as fh:
            if not os.fstat(fh.fileno()).st_size:
                raise CheckpointError(f"{path} is empty")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    _start, entries = _index(mm, len(mm))
    out: dict[str, Any] = {}
    for t in entries:
        dtype = getattr(torch, _TORCH_OF[t.dtype])
        size = DTYPE_SIZES[t.dtype]
        if not t.nbytes:
            out[t.name] = torch.empty(t.shape, dtype=dtype)
            continue
        buf: Any = mm if t.begin % size == 0 else bytearray(mm[t.begin : t.end])
        offset = t.begin if buf is mm else 0
        out[t.name] = torch.frombuffer(
            buf, dtype=dtype, count=t.nbytes // size, offset=offset
        ).reshape(t.shape)
    return out


def weights_digest(data: bytes) -> bytes:
    """The digest of a canonical checkpoint (what manifests sign)."""
    return content_id(data)
