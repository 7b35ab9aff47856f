"""The weights on disk: signed manifests, verified shards, installed policy versions.

Layout under `<data dir>/weights/`:
    weights.sqlite3           manifests (signed envelope bytes), verified shards, versions
    parts/<manifest hex>.full a full version still being fetched: one file of the
                              checkpoint's size, each verified shard written in place at
                              its offset (the file becomes the version by a rename)
    parts/<manifest hex>/<i>  one verified shard of a delta patch (kept so we can serve
                              it onward)
    versions/<v>.safetensors  an installed version: the canonical checkpoint

Rules: a shard is written only after its digest matched the signed manifest
(`put_shard` checks again) and is on disk (fsync) before it is recorded in SQLite; so
after a crash or restart every recorded shard is a verified one and is never fetched
again (`have(manifest)`). Installing a full version reads its file once to check the
digest against the manifest's `file_digest`, then renames it into place (no second copy
of the checkpoint is written: joining the shards and writing them out again sat on the
broadcast's critical path, see docs/BENCHMARKS.md);
a patch is applied tensor by tensor from its base's file into a temporary file, hashed on
the way, checked and renamed the same way (the base is never read whole into memory).
A version this node makes itself (publish, version 0) is written to a staging file as it
is exported, its digest computed on the way, and installed by rename (`install_file`).
A version that is listed is complete and verified, and a failed install (bad patch,
wrong base, disk full) leaves the previous versions as they were.

Threads: one SQLite connection behind a lock; every method blocks (disk, hashing), so call
them from trio with `trio.to_thread.run_sync`. Errors: `WeightsError` (a
`node.errors.CommandError`) with a one-line message; a full disk says so.

Public API
----------
`WeightsStore.open(data_dir)`, `close()`
Manifests: `put_manifest(manifest_id, manifest, envelope)`, `manifest(id)`,
    `manifests() -> list[(id, WeightManifest)]`, `envelope(id)`
Shards: `have(id) -> set[int]`, `put_shard(id, index, data)`, `read_shard(id, index)`
Versions: `installed() -> dict[version, digest]`, `version_path(v)`, `read_version(v)`,
    `install_full(id)`, `install_delta(id)`, `install_bytes(version, data, digest)`,
    `staging() -> Path`, `install_file(version, path, digest)`,
    `prune(keep)` (drops other versions and manifests of dropped versions)
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from node.errors import CommandError
from protocol.codec import decode, encode
from protocol.content_id import content_id, new_hasher
from protocol.wire import WeightManifest
from trainer.checkpoint import CheckpointError, VersionFile, weights_digest
from trainer.delta import PatchError, apply_stream, read_patch

STAGE_PREFIX = ".stage-"  # a version being written (publish, patch): renamed into versions/

SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (
    id BLOB PRIMARY KEY, version INTEGER NOT NULL, kind TEXT NOT NULL,
    manifest BLOB NOT NULL, envelope BLOB NOT NULL, received_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS shards (
    manifest_id BLOB NOT NULL, idx INTEGER NOT NULL, PRIMARY KEY (manifest_id, idx));
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY, digest BLOB NOT NULL, size INTEGER NOT NULL,
    installed_at REAL NOT NULL);
"""


class WeightsError(CommandError):
    """A weights store failure (disk, database, a bad install); one line."""


class BadShard(ValueError):
    """Bytes offered as a shard that do not match its signed size and digest."""


class ManifestGone(WeightsError):
    """A shard for a manifest the store does not hold (never stored, or pruned meanwhile
    because newer versions arrived)."""


def _fsync_dir(path: Path) -> None:
    """Make a new or renamed entry in `path`'s directory durable."""
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_error(path: Path, exc: OSError) -> WeightsError:
    if exc.errno == errno.ENOSPC:
        return WeightsError(f"disk full while writing {path.name} in {path.parent}")
    return WeightsError(f"cannot write {path}: {exc.strerror or exc}")


def _fsync_write(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # on a read-only disk the cleanup fails as well
            tmp.unlink(missing_ok=True)
        raise _write_error(path, exc) from None


def _fsync_write_at(path: Path, offset: int, data: bytes | memoryview, size: int) -> None:
    """Write `data` at `offset` of the `size`-byte file `path` (created sparse if new) and
    fsync it (and its directory when the file is new)."""
    new = not path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(path)
    except OSError as exc:
        raise _write_error(path, exc) from None


class WeightsStore:
    """See the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            (root / "parts").mkdir(parents=True, exist_ok=True)
            (root / "versions").mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(root / "weights.sqlite3", check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            for left in (root / "parts").glob(f"{STAGE_PREFIX}*"):
                left.unlink(missing_ok=True)
        except (OSError, sqlite3.Error) as exc:
            raise WeightsError(f"cannot open the weights store in {root}: {exc}") from None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, data_dir: Path) -> WeightsStore:
        """The weights store under a node's data directory."""
        return cls(Path(data_dir) / "weights")

    def close(self) -> None:
        """Close the SQLite connection."""
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock, self._db:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise WeightsError(f"weights store: {exc}") from None

    # -- manifests --------------------------------------------------------------------------

    def put_manifest(self, manifest_id: bytes, manifest: WeightManifest, envelope: bytes) -> bool:
        """Remember an admitted, signed manifest; False if it was known."""
        rows = self._exec("SELECT 1 FROM manifests WHERE id=?", (manifest_id,))
        if rows:
            return False
        self._exec(
            "INSERT OR IGNORE INTO manifests VALUES (?,?,?,?,?,?)",
            (manifest_id, manifest.version, manifest.kind, encode(manifest), envelope, time.time()),
        )
        return True

    def manifest(self, manifest_id: bytes) -> WeightManifest | None:
        """The stored manifest `manifest_id`, or None."""
        rows = self._exec("SELECT manifest FROM manifests WHERE id=?", (manifest_id,))
        return decode(WeightManifest, rows[0][0]) if rows else None

    def manifests(self) -> list[tuple[bytes, WeightManifest]]:
        """Every stored manifest with its id, by version."""
        rows = self._exec("SELECT id, manifest FROM manifests ORDER BY version, kind")
        return [(bytes(i), decode(WeightManifest, m)) for i, m in rows]

    def envelope(self, manifest_id: bytes) -> bytes | None:
        """The signed envelope of manifest `manifest_id`, or None."""
        rows = self._exec("SELECT envelope FROM manifests WHERE id=?", (manifest_id,))
        return bytes(rows[0][0]) if rows else None

    # -- shards -----------------------------------------------------------------------------

    def _part(self, manifest_id: bytes, index: int) -> Path:
        return self.root / "parts" / manifest_id.hex() / str(index)

    def _partial(self, manifest_id: bytes) -> Path:
        return self.root / "parts" / f"{manifest_id.hex()}.full"

    def _held(self, manifest_id: bytes, m: WeightManifest, index: int) -> bool:
        if m.kind == "full":
            return self._partial(manifest_id).exists()
        return self._part(manifest_id, index).exists()

    def have(self, manifest_id: bytes) -> set[int]:
        """Indices of verified shards held for a manifest (all of them once installed)."""
        m = self.manifest(manifest_id)
        if m is None:
            return set()
        if m.kind == "full" and self._installed_digest(m.version) == m.file_digest:
            return set(range(len(m.shards)))
        rows = self._exec("SELECT idx FROM shards WHERE manifest_id=?", (manifest_id,))
        return {i for (i,) in rows if self._held(manifest_id, m, i)}

    def put_shard(
        self,
        manifest_id: bytes,
        index: int,
        data: bytes | memoryview,
        *,
        digest_known: bool = False,
    ) -> None:
        """Store a shard that matches its signed digest (`BadShard` if it does not);
        `digest_known`: the caller made the shard and its digest (a publish), so it is not
        hashed again."""
        m = self.manifest(manifest_id)
        if m is None:
            raise ManifestGone("shard of a manifest not held (pruned meanwhile?)")
        if not 0 <= index < len(m.shards):
            raise ValueError("shard index outside its manifest")
        info = m.shards[index]
        if len(data) != info.size or (not digest_known and content_id(data) != info.digest):
            raise BadShard("shard does not match its digest")
        if m.kind == "full":
            if info.offset + info.size > m.total_bytes:
                raise WeightsError(
                    f"version {m.version}: a shard outside its manifest's checkpoint"
                )
            _fsync_write_at(self._partial(manifest_id), info.offset, data, m.total_bytes)
        else:
            path = self._part(manifest_id, index)
            path.parent.mkdir(parents=True, exist_ok=True)
            _fsync_write(path, data)
        self._exec("INSERT OR IGNORE INTO shards VALUES (?,?)", (manifest_id, index))

    def read_shard(self, manifest_id: bytes, index: int) -> bytes | None:
        """A verified shard's bytes, or None if we do not hold it."""
        m = self.manifest(manifest_id)
        if m is None or not 0 <= index < len(m.shards):
            return None
        info = m.shards[index]
        if m.kind == "full" and self._installed_digest(m.version) == m.file_digest:
            try:
                with open(self.version_path(m.version), "rb") as fh:
                    fh.seek(info.offset)
                    return fh.read(info.size)
            except OSError:
                return None
        if index not in self.have(manifest_id):
            return None
        if m.kind == "full":
            try:
                with open(self._partial(manifest_id), "rb") as fh:
                    fh.seek(info.offset)
                    return fh.read(info.size)
            except OSError:
                return None
        try:
            return self._part(manifest_id, index).read_bytes()
        except OSError:
            return None

    def _payload(self, manifest_id: bytes, m: WeightManifest) -> bytes:
        missing = set(range(len(m.shards))) - self.have(manifest_id)
        if missing:
            raise WeightsError(f"manifest of version {m.version}: {len(missing)} shards missing")
        return b"".join(self._part(manifest_id, i).read_bytes() for i in range(len(m.shards)))

    # -- versions ---------------------------------------------------------------------------

    def version_path(self, version: int) -> Path:
        """The file an installed `version` lives in."""
        return self.root / "versions" / f"{version}.safetensors"

    def installed(self) -> dict[int, bytes]:
        """Installed versions and their digests."""
        return {v: bytes(d) for v, d in self._exec("SELECT version, digest FROM versions")}

    def _installed_digest(self, version: int) -> bytes | None:
        rows = self._exec("SELECT digest FROM versions WHERE version=?", (version,))
        return bytes(rows[0][0]) if rows else None

    def read_version(self, version: int) -> bytes:
        """The bytes of an installed version."""
        try:
            return self.version_path(version).read_bytes()
        except OSError as exc:
            raise WeightsError(f"version {version} is not readable: {exc.strerror}") from None

    def install_bytes(self, version: int, data: bytes, digest: bytes) -> None:
        """Install a checkpoint as `version` if its digest is `digest` (atomic)."""
        if weights_digest(data) != digest:
            raise WeightsError(f"version {version}: the weights do not match the signed digest")
        if self._installed_digest(version) == digest:
            return
        _fsync_write(self.version_path(version), data)
        self._exec(
            "INSERT OR REPLACE INTO versions VALUES (?,?,?,?)",
            (version, digest, len(data), time.time()),
        )

    def install_full(self, manifest_id: bytes) -> int:
        """Its shards' file becomes the version: digest checked, then renamed into place."""
        m = self._need(manifest_id, "full")
        if self._installed_digest(m.version) != m.file_digest:
            missing = set(range(len(m.shards))) - self.have(manifest_id)
            if missing:
                raise WeightsError(
                    f"manifest of version {m.version}: {len(missing)} shards missing"
                )
            path = self._partial(manifest_id)
            try:
                hasher = new_hasher()
                with open(path, "rb") as fh:
                    while chunk := fh.read(8 * 2**20):
                        hasher.update(chunk)
                    os.fsync(fh.fileno())
                if hasher.digest() != m.file_digest:
                    raise WeightsError(
                        f"version {m.version}: the weights do not match the signed digest"
                    )
                os.replace(path, self.version_path(m.version))
                _fsync_dir(self.version_path(m.version))
            except OSError as exc:
                raise WeightsError(
                    f"cannot install version {m.version}: {exc.strerror or exc}"
                ) from None
            self._exec(
                "INSERT OR REPLACE INTO versions VALUES (?,?,?,?)",
                (m.version, m.file_digest, m.total_bytes, time.time()),
            )
        self._partial(manifest_id).unlink(missing_ok=True)
        self._exec("DELETE FROM shards WHERE manifest_id=?", (manifest_id,))
        return m.version

    def install_delta(self, manifest_id: bytes) -> int:
        """Apply a delta manifest's patch to its installed base and install the result; returns its
        version. The base is read tensor by tensor (its digest is the one recorded when it
        was installed: not hashed again) and the result written to a temporary file, hashed
        once on the way and checked against the signed digest before it is renamed into
        place."""
        m = self._need(manifest_id, "delta")
        if self._installed_digest(m.base_version) != m.base_digest:
            raise WeightsError(
                f"patch to version {m.version}: base version {m.base_version} not installed"
            )
        try:
            p = read_patch(self._payload(manifest_id, m))
            if p["base"] != m.base_digest or p["target"] != m.file_digest:
                raise PatchError("the patch names other versions than its signed manifest")
            tmp = self.staging()
            try:
                with VersionFile(self.version_path(m.base_version)) as base:
                    hasher = new_hasher()
                    with open(tmp, "wb") as out:

                        def write(piece: Any) -> None:
                            hasher.update(piece)
                            out.write(piece)

                        apply_stream(base.index, base.header, base.read, p, write)
                if hasher.digest() != m.file_digest:
                    raise WeightsError(
                        f"version {m.version}: the weights do not match the signed digest"
                    )
                self.install_file(m.version, tmp, m.file_digest)
            finally:
                tmp.unlink(missing_ok=True)
        except (PatchError, CheckpointError) as exc:
            raise WeightsError(f"patch to version {m.version}: {exc}") from None
        except OSError as exc:
            raise _write_error(self.version_path(m.version), exc) from None
        return m.version

    def staging(self) -> Path:
        """A fresh temporary path in the store (for `install_file`; removed at the next
        `open` if left behind)."""
        return self.root / "parts" / f"{STAGE_PREFIX}{uuid.uuid4().hex}"

    def install_file(self, version: int, path: Path, digest: bytes) -> None:
        """Install the checkpoint file at `path` (written by this process, `digest` computed
        as it was written: not hashed again) as `version`: fsynced, renamed into place."""
        target = self.version_path(version)
        try:
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
                size = os.fstat(fh.fileno()).st_size
            os.replace(path, target)
            _fsync_dir(target)
        except OSError as exc:
            raise _write_error(target, exc) from None
        self._exec(
            "INSERT OR REPLACE INTO versions VALUES (?,?,?,?)",
            (version, digest, size, time.time()),
        )

    def _need(self, manifest_id: bytes, kind: str) -> WeightManifest:
        m = self.manifest(manifest_id)
        if m is None or m.kind != kind:
            raise WeightsError(f"no {kind} manifest {manifest_id.hex()[:16]}")
        return m

    def prune(self, keep: set[int]) -> list[int]:
        """Drop installed versions not in `keep`, and manifests of versions below them."""
        dropped = [v for v in self.installed() if v not in keep]
        for v in dropped:
            self._exec("DELETE FROM versions WHERE version=?", (v,))
            self.version_path(v).unlink(missing_ok=True)
        if keep:
            floor = min(keep)
            for mid, m in self.manifests():
                if m.version < floor:
                    self._exec("DELETE FROM manifests WHERE id=?", (mid,))
                    self._exec("DELETE FROM shards WHERE manifest_id=?", (mid,))
                    shutil.rmtree(self.root / "parts" / mid.hex(), ignore_errors=True)
                    self._partial(mid).unlink(missing_ok=True)
        return dropped
