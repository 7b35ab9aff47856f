"""Directories that cannot be written to: a read-only one and a tiny one that fills up.

As root (CI) they are real tmpfs mounts (`ro`; `size=`), so the file system itself answers
EROFS or ENOSPC, as on a broken machine; as another user the read-only one is a directory
without write permission, and the tiny one is not available (the test skips, and fails
in CI, where `SWARM_CI` is set).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(where: Path, options: str) -> bool:
    """Mount a tmpfs with `options` at `where`; False where this process may not."""
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        timeout=30,
    )
    return done.returncode == 0


def _unavailable(why: str) -> None:
    if os.environ.get("SWARM_CI"):
        pytest.fail(f"{why} (CI runs as root and must be able to mount a tmpfs)")
    pytest.skip(why)


@contextlib.contextmanager
def read_only_dir(parent: Path) -> Iterator[Path]:
    """A directory nothing can be written in (a read-only tmpfs, or mode 0555)."""
    where = parent / "read-only"
    where.mkdir()
    if _mount(where, "ro,size=1m"):
        try:
            yield where
        finally:
            subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
        return
    if os.geteuid() == 0:
        _unavailable("cannot mount a read-only tmpfs")
    where.chmod(0o555)
    try:
        yield where
    finally:
        where.chmod(0o755)


@contextlib.contextmanager
def tiny_disk(parent: Path, size: str = "64k") -> Iterator[Path]:
    """A directory on a tmpfs of `size` bytes: writes past it fail with ENOSPC."""
    where = parent / "tiny-disk"
    where.mkdir()
    if not _mount(where, f"size={size}"):
        _unavailable("a size-limited tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
