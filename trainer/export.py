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
-> list[Exported]`,
`is_snapshot(version, snapshot_every)`, `DEFAULT_SHARD_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.content_id import content_id
from protocol.wire import MAX_SHARD_BYTES, ShardInfo, WeightManifest
from trainer.checkpoint import CheckpointError, parse, weights_digest
from trainer.delta import PatchError, make_patch

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
    pieces: list[tuple[int, int]] = _cut(0, ck.header_end, max_shard_bytes)
    pos = ck.header_end
    for t in ck.tensors:
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
    if pos != len(data):
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
    return tuple(
        ShardInfo(index=i, offset=off, size=size, digest=content_id(data[off : off + size]))
        for i, (off, size) in enumerate(layout)
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
    parent_ref = (parent[0], weights_digest(parent[1])) if parent is not None else None
    out = [
        Exported(
            full_manifest(version, data, parent=parent_ref, max_shard_bytes=max_shard_bytes), data
        )
    ]
    if parent is not None:
        try:
            patch = make_patch(parent[1], data, difference=difference)
        except PatchError:
            return out  # a layout change ships as a full version only
        if len(patch) < len(data):
            assert parent_ref is not None
            m = delta_manifest(
                version,
                patch,
                base=parent_ref,
                target_digest=weights_digest(data),
                max_shard_bytes=max_shard_bytes,
            )
            out.append(Exported(m, patch))
    return out


def is_snapshot(version: int, snapshot_every: int) -> bool:
    """Whether version `version` is a full snapshot peers keep for joiners."""
    return snapshot_every > 0 and version % snapshot_every == 0
