"""An equivocating trainer key between real peers: one side of version 2 installed here,
the other there (used by `tests/test_node_equivocation.py` and `bench adversary`'s
`equivocation` section)."""

from __future__ import annotations

import time
from typing import Any

import trio

from protocol.admission import Kind
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity
from trainer.export import full_manifest


async def install_side(
    peer: Any, signer: Identity, version: int, data: bytes, shard_bytes: int
) -> bytes:
    """`peer` installs `data` as `version` under a manifest `signer` signed (what a peer
    that downloaded it holds) and serves it; returns the envelope, admitted here, not yet
    announced (`peer.outbox.put(peer.topics["weights"], envelope)` does that)."""
    m = full_manifest(version, data, max_shard_bytes=shard_bytes)
    env = seal(
        signer,
        m,
        run_id=peer.run_id,
        policy_version=version,
        seq=version,
        timestamp_ms=int(time.time() * 1000),
    )

    def write() -> None:
        peer.weights.store.put_manifest(content_id(env), m, env)
        peer.weights.store.install_bytes(version, data, m.file_digest)

    await trio.to_thread.run_sync(write)
    peer.weights.note_installed(version, m.file_digest)
    handled = await peer.admit(signer.peer_id_b58, Kind.WEIGHT_ANNOUNCE, env)
    if not handled.admitted:
        raise RuntimeError(f"the side of version {version} was not admitted: {handled.actions}")
    peer.weights.server.published.add(content_id(env))
    return env
