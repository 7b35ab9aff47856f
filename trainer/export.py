"""Export a policy version as shards and weight manifests (what the trainer signs).

A version is a canonical checkpoint (`trainer.checkpoint`). It ships two ways:

- **full**: the checkpoint file itself, cut into shards of at most `max_shard_bytes`
  (64 MiB by default). Cuts fall on tensor boundaries: the header starts shard 0, tensors
  are packed whole while they fit, and a tensor larger than a shard is cut between rows
  (first dimension); only a single row larger than a shard is cut inside it, on an
  element boundary. A receiver therefore always holds whole rows of whole tensors.
- **delta**: the exact patch from the previous version (`trainer.delta`), cut into shards
  the same way by bytes, anchored on the base version's digest.

Both manifests of version v carry the version, its parent version and the parent's digest
(`base_version`, `base_digest`), every shard's offset, size and digest, the payload's
total size, and `file_digest`: the digest of the *resulting* checkpoint, which every
install checks before use. A full snapshot is marked every `snapshot_every` versions
(`is_snapshot`); peers keep the newest snapshot besides their staleness window so a joiner
can take "snapshot + patches" from many holders.

Public API: `shard_layout(data, max_shard_bytes) -> list[(offset, size)]`,
`shard_infos(data, layout)`, `full_manifest(...)`, `delta_manifest(...)`,
`export_version(version, data, parent=None, max_shard_bytes=..., difference=False)
-> list[Exported]`; streamed (a version written out as it is exported, never whole in
memory): `export_stream(version, src, write, parent, ...) -> (full manifest, delta)`,
`Parent`, `layout_of(header_end, tensors, total, max_shard_bytes)`;
`is_snapshot(version, snapshot_every)`, `DEFAULT_SHARD_BYTES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.content_id import content_id, new_hasher
from protocol.wire import MAX_SHARD_BYTES, ShardInfo, WeightManifest
from trainer.checkpoint import (
    CheckpointError,
    Streamed,
    TensorEntry,
    parse,
    stream_bytes,
    weights_digest,
)
from trainer.delta import pack_patch, patch_entry

DEFAULT_SHARD_BYTES = 64 * 1024 * 1024
MIN_SHARD_BYTES = 4096


class ExportError(ValueError):
    """The checkpoint cannot be exported; one-line message."""


@dataclass(frozen=True, slots=True)
class Exported:
    """One way to ship a version: its manifest and the payload the shards cut."""

    manifest: WeightManifest
    payload: bytes


def _check_shard_size(max_shard_bytes: int) -> None:
    if not MIN_SHARD_BYTES <= max_shard_bytes <= MAX_SHARD_BYTES:
        raise ExportError(
            f"shard size {max_shard_bytes} out of range [{MIN_SHARD_BYTES}, {MAX_SHARD_BYTES}]"
        )


def _cut(begin: int, end: int, step: int) -> list[tuple[int, int]]:
    return [(o, min(step, end - o)) for o in range(begin, end, step)]


def shard_layout(data: bytes, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[tuple[int, int]]:
    """(offset, size) of each shard of a checkpoint, cut on tensor and row boundaries."""
    _check_shard_size(max_shard_bytes)
    try:
        ck = parse(data)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    return layout_of(ck.header_end, ck.tensors, len(data), max_shard_bytes)


def layout_of(
    header_end: int, tensors: tuple[TensorEntry, ...], total: int, max_shard_bytes: int
) -> list[tuple[int, int]]:
    """`shard_layout` from a checkpoint's header size and tensor entries (no data)."""
    _check_shard_size(max_shard_bytes)
    pieces: list[tuple[int, int]] = _cut(0, header_end, max_shard_bytes)
    pos = header_end
    for t in tensors:
        if t.begin != pos:
            raise ExportError(f"tensor {t.name!r} does not follow the previous one: not canonical")
        pos = t.end
        if t.nbytes <= max_shard_bytes:
            if t.nbytes:
                pieces.append((t.begin, t.nbytes))
            continue
        row = t.row_bytes
        if row <= max_shard_bytes:
            step = (max_shard_bytes // row) * row
        else:  # one row alone is too big: cut on element boundaries
            elem = max(1, t.nbytes // max(1, _count(t.shape)))
            step = (max_shard_bytes // elem) * elem
        pieces.extend(_cut(t.begin, t.end, step))
    if pos != total:
        raise ExportError("bytes after the last tensor: not a canonical checkpoint")
    # Pack consecutive pieces into shards while they fit (pieces are never split again).
    shards: list[tuple[int, int]] = []
    for off, size in pieces:
        if shards and shards[-1][1] + size <= max_shard_bytes:
            shards[-1] = (shards[-1][0], shards[-1][1] + size)
        else:
            shards.append((off, size))
    return shards


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shard_infos(data: bytes, layout: list[tuple[int, int]]) -> tuple[ShardInfo, ...]:
    """The manifest's shard entries (index, offset, size, digest) of `data` cut as `layout`."""
    view = memoryview(data)
    return tuple(
        ShardInfo(index=i, offset=off, size=size, digest=content_id(view[off : off + size]))
        for i, (off, size) in enumerate(layout)
    )


class _Digests:
    """The file digest and every shard's digest of a file fed in order, piece by piece:
    each byte is hashed twice (once for the file, once for its shard), never again."""

    def __init__(self, layout: list[tuple[int, int]]) -> None:
        self.layout = layout
        self.file = new_hasher()
        self.shards: list[bytes] = []
        self._shard = new_hasher()
        self._left = layout[0][1] if layout else 0

    def feed(self, piece: memoryview) -> None:
        self.file.update(piece)
        while piece.nbytes:
            take = min(self._left, piece.nbytes)
            self._shard.update(piece[:take])
            piece = piece[take:]
            self._left -= take
            if self._left == 0 and len(self.shards) < len(self.layout):
                self.shards.append(self._shard.digest())
                self._shard = new_hasher()
                if len(self.shards) < len(self.layout):
                    self._left = self.layout[len(self.shards)][1]
                elif piece.nbytes:
                    raise ExportError("bytes beyond the shard layout")

    def infos(self) -> tuple[ShardInfo, ...]:
        if len(self.shards) != len(self.layout):
            raise ExportError("the checkpoint ended before its last shard")
        return tuple(
            ShardInfo(index=i, offset=off, size=size, digest=d)
            for i, ((off, size), d) in enumerate(zip(self.layout, self.shards, strict=True))
        )


def full_manifest(
    version: int,
    data: bytes,
    *,
    parent: tuple[int, bytes] | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> WeightManifest:
    """The full-version manifest; `parent` is (parent version, parent digest) if any."""
    layout = shard_layout(data, max_shard_bytes)
    base_version, base_digest = parent if parent is not None else (version, b"")
    return WeightManifest(
        version=version,
        kind="full",
        base_version=base_version,
        base_digest=base_digest,
        total_bytes=len(data),
        file_digest=weights_digest(data),
        shards=shard_infos(data, layout),
    )


def delta_manifest(
    version: int,
    patch: bytes,
    *,
    base: tuple[int, bytes],
    target_digest: bytes,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> WeightManifest:
    """The manifest of a patch from `base` = (version, digest) to a target digest."""
    _check_shard_size(max_shard_bytes)
    if not patch:
        raise ExportError("empty patch")
    layout = _cut(0, len(patch), max_shard_bytes)
    return WeightManifest(
        version=version,
        kind="delta",
        base_version=base[0],
        base_digest=base[1],
        total_bytes=len(patch),
        file_digest=target_digest,
        shards=shard_infos(patch, layout),
    )


def export_version(
    version: int,
    data: bytes,
    parent: tuple[int, bytes] | None = None,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    difference: bool = False,
) -> list[Exported]:
    """The full manifest of `data` as version `version`, plus a delta from `parent`
    = (parent version, parent canonical bytes) when the layouts match and the patch is
    smaller (a difference patch with `difference`, see `trainer.delta`)."""
    if parent is not None and parent[0] >= version:
        raise ExportError(f"version {version} must be newer than its parent {parent[0]}")
    try:
        src = stream_bytes(data)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    if src.header != bytes(memoryview(data)[: src.header_end]):
        layout_of(*_index_of(data), len(data), max_shard_bytes)  # says why it is not canonical
        raise ExportError("checkpoint header is not canonical")
    base = None
    if parent is not None:
        view = memoryview(parent[1])
        base = Parent(
            parent[0],
            weights_digest(parent[1]),
            bytes(view[: min(len(view), src.header_end)]),
            lambda off, n: bytearray(view[off : off + n]),
        )
    full, delta = export_stream(
        version,
        src,
        lambda _piece: None,
        base,
        max_shard_bytes=max_shard_bytes,
        difference=difference,
    )
    return [Exported(full, data), *([delta] if delta is not None else [])]


def _index_of(data: bytes) -> tuple[int, tuple[TensorEntry, ...]]:
    ck = parse(data)
    return ck.header_end, ck.tensors


@dataclass(frozen=True, slots=True)
class Parent:
    """The version a new one is patched from: its number, digest (as installed, not hashed
    again), header bytes and a reader of its file (`read(offset, size)`)."""

    version: int
    digest: bytes
    header: bytes
    read: Callable[[int, int], Any]


def export_stream(
    version: int,
    src: Streamed,
    write: Callable[[memoryview], object],
    parent: Parent | None = None,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    difference: bool = False,
) -> tuple[WeightManifest, Exported | None]:
    """Export the canonical checkpoint `src` as version `version` while it is written out
    (`write(piece)`, in file order): its full manifest, and the delta from `parent` when the
    layouts match and the patch is smaller than the version. Each byte of the version is
    hashed twice (file digest, shard digest) and the patch once (its shard digests); one
    tensor of the version and of the parent is in memory at a time, besides the patch."""
    if parent is not None and parent.version >= version:
        raise ExportError(f"version {version} must be newer than its parent {parent.version}")
    layout = layout_of(src.header_end, src.tensors, src.size, max_shard_bytes)
    digests = _Digests(layout)
    patching = parent is not None and parent.header == src.header
    entries: list[list[Any]] = []
    try:
        for t, piece in src.pieces():
            write(piece)
            digests.feed(piece)
            if patching and t is not None and parent is not None:
                e = patch_entry(t, parent.read, piece, difference)
                if e is not None:
                    entries.append(e)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    target = digests.file.digest()
    full = WeightManifest(
        version=version,
        kind="full",
        base_version=parent.version if parent is not None else version,
        base_digest=parent.digest if parent is not None else b"",
        total_bytes=src.size,
        file_digest=target,
        shards=digests.infos(),
    )
    if not patching or parent is None:
        return full, None
    patch = pack_patch(parent.digest, target, entries, difference)
    del entries
    if len(patch) >= src.size:
        return full, None
    m = delta_manifest(
        version,
        patch,
        base=(parent.version, parent.digest),
        target_digest=target,
        max_shard_bytes=max_shard_bytes,
    )
    return full, Exported(m, patch)


def is_snapshot(version: int, snapshot_every: int) -> bool:
    """Whether version `version` is a full snapshot peers keep for joiners."""
    return snapshot_every > 0 and version % snapshot_every == 0
