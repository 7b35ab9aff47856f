"""The one content hash of the network: SHA-256, for rollouts, shards and manifests.

Why SHA-256 rather than BLAKE3: it is in the standard library (no extra dependency on the
verification path), runs at several GB/s with the SHA extensions every current x86 and ARM
server CPU has, is what safetensors/Hugging Face tooling and libp2p multihashes (code 0x12)
already use, and hashing is never our bottleneck (a 50 MB shard hashes in tens of ms).
"""

from __future__ import annotations

import hashlib

DIGEST_SIZE = 32


def content_id(data: bytes | bytearray | memoryview) -> bytes:
    """The 32-byte SHA-256 digest of `data`."""
    return hashlib.sha256(data).digest()


def content_id_hex(data: bytes | bytearray | memoryview) -> str:
    """`content_id` as 64 lowercase hex characters (for logs, file names and the CLI)."""
    return hashlib.sha256(data).hexdigest()


def new_hasher() -> hashlib._Hash:
    """An incremental hasher giving the same digest as `content_id`, for streamed files."""
    return hashlib.sha256()
