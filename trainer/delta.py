"""Exact delta patches between two canonical checkpoints of the same layout.

RL steps change few values of a bf16 policy (docs/DESIGN.md §5: 1-3 % per step), so a version is
cheaper to ship as "what changed since the previous one". A patch here is an *overwrite*
patch, bit-exact by construction:

- per tensor, compare the two versions' raw elements as unsigned integers of the element
  size (a bf16 or fp32 value is changed iff its bit pattern is; NaN payloads and -0.0
  included);
- store the changed element indices, delta-encoded as little-endian uint32 (first index
  absolute, then gaps), and the new elements' bytes, each zlib-compressed;
- anchor the patch on the base file's digest and name the target file's digest.

Applying checks the base digest first (`PatchError`: patch on the wrong base), rebuilds
the target and checks its digest (the result is the full version, byte for byte, or an
error). Tensors absent from the patch are unchanged. Both files must have the same header
(same names, dtypes, shapes): a layout change is shipped as a full version.

Patch file (msgpack map):
    {"format": "swarm-rl-patch/1", "base": <32 bytes>, "target": <32 bytes>,
     "tensors": [[name, element size, changed count, zlib(gap indices), zlib(values)], ...]}

A *difference* patch (`make_patch(..., difference=True)`, what a bf16 run publishes) suits
a step that nudges nearly every value by a few units in the last place: per changed tensor
it stores every element's `(new - old) mod 2**bits` of the raw bit patterns, the bytes
split into planes (all low bytes, then the next, ...) and zlib-compressed. Most differences
are small, so the high planes are nearly constant and compress to almost nothing; applying
adds them back (wrapping), which is exact whatever the values:
    {"format": "swarm-rl-diff/1", "base": ..., "target": ...,
     "tensors": [[name, element size, element count, changed count, zlib(planes)], ...]}

Public API: `make_patch(base, target, difference=False) -> bytes`, `apply_patch(base, patch) -> bytes`,
`patch_stats(patch)`, `PatchError`; streamed, for checkpoints never whole in memory:
`patch_entry(tensor, old, new, difference)` and `pack_patch(base, target, entries,
difference)` (what `make_patch` does tensor by tensor), `read_patch(patch)` and
`apply_stream(tensors, header, read, patch, write)` (the result piece by piece). Decompression is bounded by the sizes the patch
declares and the base tensor's size (no zip bomb gets past it).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import msgpack
import numpy as np

from trainer.checkpoint import (
    STREAM_CHUNK,
    Checkpoint,
    CheckpointError,
    TensorEntry,
    parse,
    weights_digest,
)

FORMAT = "swarm-rl-patch/1"
DIFF_FORMAT = "swarm-rl-diff/1"
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
ZLIB_LEVEL = 6
MAX_PATCH_TENSORS = 1_000_000
INFLATE_PIECE = 64 * 1024
PATCH_CHUNK = 4 * 2**20  # bytes of a tensor compared or applied at once


class PatchError(ValueError):
    """A patch that cannot be made or applied; the message is one line."""


def _same_layout(a: Checkpoint, b: Checkpoint) -> bool:
    return a.header_end == b.header_end and a.data[: a.header_end] == b.data[: b.header_end]


def make_patch(base: bytes, target: bytes, difference: bool = False) -> bytes:
    """The exact patch turning canonical checkpoint `base` into `target` (an overwrite
    patch, or a difference patch with `difference`; see the module docstring)."""
    try:
        a, b = parse(base), parse(target)
    except CheckpointError as exc:
        raise PatchError(f"cannot diff: {exc}") from None
    if not _same_layout(a, b):
        raise PatchError("the two checkpoints differ in layout (names, dtypes or shapes)")
    entries = [
        e
        for t in a.tensors
        if (
            e := patch_entry(
                t, lambda off, n: a.data[off : off + n], b.data[t.begin : t.end], difference
            )
        )
    ]
    return pack_patch(weights_digest(base), weights_digest(target), entries, difference)


def patch_entry(
    t: TensorEntry, old: Callable[[int, int], Any], new: Any, difference: bool
) -> list[Any] | None:
    """The patch entry of one tensor from its new raw bytes `new` (a buffer) and a reader of
    the old file (`old(offset, size)`, file offsets), None when nothing changed. The old
    tensor is read in `PATCH_CHUNK` pieces; besides them, a difference entry holds only
    its compressed planes, an overwrite entry the changed indices and values."""
    size = _element_size(t.dtype, t.nbytes, t.shape)
    if t.nbytes == 0:
        return None
    uint = _UINT[size]
    count = t.nbytes // size
    new_v = np.frombuffer(new, dtype=uint, count=count)
    step = max(1, PATCH_CHUNK // size)
    if difference:
        nonzero, planes = _planes_deflated(t, old, new_v, size, step)
        return [t.name, size, count, nonzero, planes] if nonzero else None
    parts = []
    for i in range(0, count, step):
        j = min(count, i + step)
        old_v = np.frombuffer(old(t.begin + i * size, (j - i) * size), dtype=uint)
        parts.append(np.flatnonzero(old_v != new_v[i:j]) + i)
    changed = np.concatenate(parts)
    if changed.size == 0:
        return None
    gaps = np.diff(changed, prepend=0).astype("<u4")
    values = new_v[changed].astype(new_v.dtype.newbyteorder("<"), copy=False)
    return [
        t.name,
        size,
        int(changed.size),
        zlib.compress(np.ascontiguousarray(gaps).data, ZLIB_LEVEL),
        zlib.compress(np.ascontiguousarray(values).data, ZLIB_LEVEL),
    ]


def _planes_deflated(
    t: TensorEntry, old: Callable[[int, int], Any], new_v: Any, size: int, step: int
) -> tuple[int, bytes]:
    """(changed count, zlib of the little-endian bytes of `new - old` split into planes:
    all low bytes, then the next, ...). The differences are recomputed per plane from
    `step`-element pieces of the old tensor (read again for each plane) rather than held
    for the whole tensor."""
    co = zlib.compressobj(ZLIB_LEVEL)
    out: list[bytes] = []
    count = len(new_v)
    nonzero = 0
    buf = np.empty(min(step, count), dtype=np.uint8)
    le = np.dtype(new_v.dtype).newbyteorder("<")
    for k in range(size):
        for i in range(0, count, step):
            j = min(count, i + step)
            old_v = np.frombuffer(old(t.begin + i * size, (j - i) * size), dtype=new_v.dtype)
            d = np.subtract(new_v[i:j], old_v).astype(le, copy=False)  # wraps mod 2**bits
            if k == 0:
                nonzero += int(np.count_nonzero(d))
            piece = buf[: j - i]
            # an assignment, not `.T.tobytes()`: numpy copies a transposed array to bytes
            # holding the GIL, which would stall the event loop for seconds at real sizes
            piece[:] = d.view(np.uint8).reshape(-1, size)[:, k]
            out.append(co.compress(piece.data))
        if nonzero == 0:
            return 0, b""
    out.append(co.flush())
    return nonzero, b"".join(out)


def pack_patch(base: bytes, target: bytes, entries: list[list[Any]], difference: bool) -> bytes:
    """The patch file from the base and target digests and the tensors' entries."""
    patch = {
        "format": DIFF_FORMAT if difference else FORMAT,
        "base": base,
        "target": target,
        "tensors": entries,
    }
    # packb returns bytes when it is given no stream; pyright reads its fallback's None
    return cast(bytes, msgpack.packb(patch, use_bin_type=True))


def _element_size(dtype: str, nbytes: int, shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return nbytes // count if count else 1


def read_patch(patch: bytes) -> dict[str, Any]:
    """Decode and shape-check a patch (not applied); `PatchError` if malformed."""
    try:
        p = msgpack.unpackb(
            patch, raw=False, max_array_len=MAX_PATCH_TENSORS, max_map_len=8, strict_map_key=True
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise PatchError(f"patch is not msgpack: {exc}") from None
    if not isinstance(p, dict) or p.get("format") not in (FORMAT, DIFF_FORMAT):
        raise PatchError(f"not a {FORMAT} or {DIFF_FORMAT} patch")
    for key in ("base", "target"):
        if not (isinstance(p.get(key), bytes) and len(p[key]) == 32):
            raise PatchError(f"patch field {key!r} is not a 32-byte digest")
    tensors = p.get("tensors")
    if not isinstance(tensors, list):
        raise PatchError("patch field 'tensors' is not a list")
    for e in tensors:
        if p["format"] == DIFF_FORMAT:
            if not (
                isinstance(e, list)
                and len(e) == 5
                and isinstance(e[0], str)
                and e[1] in _UINT
                and isinstance(e[2], int)
                and isinstance(e[3], int)
                and 0 < e[3] <= e[2]
                and isinstance(e[4], bytes)
            ):
                raise PatchError("patch holds a malformed tensor entry")
            continue
        if not (
            isinstance(e, list)
            and len(e) == 5
            and isinstance(e[0], str)
            and e[1] in _UINT
            and isinstance(e[2], int)
            and e[2] > 0
            and isinstance(e[3], bytes)
            and isinstance(e[4], bytes)
        ):
            raise PatchError("patch holds a malformed tensor entry")
    return p


def _inflate(data: bytes, size: int, what: str) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size)
    except zlib.error as exc:
        raise PatchError(f"{what}: corrupt compressed data ({exc})") from None
    if len(out) != size or d.unconsumed_tail or not d.eof:
        raise PatchError(f"{what}: expected {size} bytes after decompression")
    return out


def _inflate_pieces(data: bytes, size: int, what: str) -> Iterator[bytes]:
    """`_inflate` in pieces of at most `INFLATE_PIECE` bytes, fed `INFLATE_PIECE` bytes of
    input at a time (zlib builds each output piece in blocks and joins them, and returns
    the input it has not used as a new object: small pieces keep both copies small)."""
    d = zlib.decompressobj()
    view = memoryview(data)
    left, pos, pending = size, 0, b""
    try:
        while left:
            if not pending:
                if pos >= len(view):
                    break
                pending = view[pos : pos + INFLATE_PIECE]
                pos += len(pending)
            out = d.decompress(pending, min(left, INFLATE_PIECE))
            pending = d.unconsumed_tail
            if out:
                left -= len(out)
                yield out
            elif d.eof:
                break
        if not d.eof and not left:  # the declared size is reached: the stream must end
            if d.decompress(bytes(pending) + bytes(view[pos:]), 1):
                left = 1
            pending, pos = d.unconsumed_tail, len(view)
    except zlib.error as exc:
        raise PatchError(f"{what}: corrupt compressed data ({exc})") from None
    if left or pending or pos < len(view) or not d.eof:
        raise PatchError(f"{what}: expected {size} bytes after decompression")


def apply_patch(base: bytes, patch: bytes) -> bytes:
    """`target` from `base` and a patch; checks both digests (`PatchError` otherwise)."""
    p = read_patch(patch)
    if weights_digest(base) != p["base"]:
        raise PatchError(
            f"patch on the wrong base: it expects {p['base'].hex()[:16]}, "
            f"the base is {weights_digest(base).hex()[:16]}"
        )
    ck = parse(base)
    view = memoryview(ck.data)
    pieces: list[bytes] = []
    apply_stream(
        ck.tensors,
        view[: ck.header_end],
        lambda off, n: bytearray(view[off : off + n]),
        p,
        lambda piece: pieces.append(bytes(piece)),
    )
    result = b"".join(pieces)
    if weights_digest(result) != p["target"]:
        raise PatchError("patched weights do not match the target digest")
    return result


def apply_stream(
    tensors: tuple[TensorEntry, ...],
    header: Any,
    read: Callable[[int, int], Any],
    p: dict[str, Any],
    write: Callable[[Any], object],
) -> None:
    """Write the patched checkpoint in file order (`write(piece)`: the header, then each
    tensor, patched or read unchanged in chunks) from the base's `tensors` and `header` and
    a decoded patch `p` (`read_patch`); `read(offset, size)` reads the base. One patched
    tensor is in memory at a time. The caller checks the result's digest."""
    by_name = {t.name: t for t in tensors}
    entries: dict[str, list[Any]] = {}
    for e in p["tensors"]:
        t = by_name.get(e[0])
        if t is None or e[0] in entries:
            raise PatchError(f"patch names tensor {e[0]!r} absent from the base (or twice)")
        size, n = e[1], e[2]
        count = t.nbytes // size if t.nbytes else 0
        if _element_size(t.dtype, t.nbytes, t.shape) != size or n > count:
            raise PatchError(f"patch entry {e[0]!r} does not fit the base tensor")
        if p["format"] == DIFF_FORMAT and n != count:
            raise PatchError(f"patch entry {e[0]!r} does not fit the base tensor")
        entries[e[0]] = e
    write(header)
    for t in tensors:
        e = entries.get(t.name)
        if e is None:
            for off in range(t.begin, t.end, STREAM_CHUNK):
                write(read(off, min(STREAM_CHUNK, t.end - off)))
            continue
        if p["format"] == DIFF_FORMAT:
            diff = _differences(e)
            step = max(1, PATCH_CHUNK // e[1])
            for i in range(0, len(diff), step):
                piece = read(t.begin + i * e[1], min(step, len(diff) - i) * e[1])
                view = np.frombuffer(piece, dtype=_UINT[e[1]])
                view += diff[i : i + len(view)]  # wraps mod 2**bits
                write(piece)
                del piece, view
            del diff
            continue
        out = read(t.begin, t.nbytes)
        _overwrite(out, e)
        write(out)
        del out


def _differences(e: list[Any]) -> Any:
    """The element differences of a checked difference entry, as native unsigned ints
    (the planes inflated piece by piece into the columns of one tensor-sized array)."""
    name, size, n, changed, planes = e
    diff = np.empty((n, size), dtype=np.uint8)
    pos = 0
    for piece in _inflate_pieces(planes, size * n, name):
        got = np.frombuffer(piece, dtype=np.uint8)
        while got.size:
            k, j = divmod(pos, n)
            take = min(got.size, n - j)
            diff[j : j + take, k] = got[:take]
            got, pos = got[take:], pos + take
    le = diff.view(np.dtype(_UINT[size]).newbyteorder("<")).reshape(n)
    if np.count_nonzero(le) != changed:
        raise PatchError(f"patch entry {name!r}: changed count does not match")
    return le.astype(_UINT[size], copy=False)


def _overwrite(out: Any, e: list[Any]) -> None:
    """Apply one checked overwrite entry to a tensor's bytes (a writable buffer) in place."""
    name, size, n, zgaps, zvalues = e
    count = memoryview(out).nbytes // size
    view = np.frombuffer(out, dtype=_UINT[size], count=count)
    gaps = np.frombuffer(_inflate(zgaps, 4 * n, name), dtype="<u4").astype(np.int64)
    idx = np.cumsum(gaps)
    if idx[-1] >= count or (n > 1 and not np.all(gaps[1:] > 0)):
        raise PatchError(f"patch entry {name!r}: indices out of range or not increasing")
    view[idx] = np.frombuffer(_inflate(zvalues, size * n, name), dtype=_UINT[size])


def patch_stats(patch: bytes) -> dict[str, int]:
    """Counts of a (well-formed) patch: tensors touched, elements changed, bytes."""
    p = read_patch(patch)
    return {
        "tensors": len(p["tensors"]),
        "changed": sum(e[3] if p["format"] == DIFF_FORMAT else e[2] for e in p["tensors"]),
        "bytes": len(patch),
    }
