"""The one content hash of the network: SHA-256, for rollouts, shards and manifests.

Why SHA-256 rather than BLAKE3: it is in the standard library (no extra dependency on the
verification path), is hardware-accelerated on current x86 and ARM server CPUs, is what
safetensors/Hugging Face tooling and libp2p multihashes (code 0x12) already use, and
hashing is not our bottleneck (docs/BENCHMARKS.md has the figures).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

DIGEST_SIZE = 32


class Hasher(Protocol):
    """An incremental hash: feed bytes with `update`, read the result with `digest`."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        """Hash `data` after what was fed before."""
        ...

    def digest(self) -> bytes:
        """The digest of everything fed so far."""
        ...

    def hexdigest(self) -> str:
        """`digest` as lowercase hex."""
        ...


def content_id(data: bytes | bytearray | memoryview) -> bytes:
    """The 32-byte SHA-256 digest of `data`."""
    return hashlib.sha256(data).digest()


def content_id_hex(data: bytes | bytearray | memoryview) -> str:
    """`content_id` as 64 lowercase hex characters (for logs, file names and the CLI)."""
    return hashlib.sha256(data).hexdigest()


def new_hasher() -> Hasher:
    """An incremental hasher giving the same digest as `content_id`, for streamed files."""
    return hashlib.sha256()
