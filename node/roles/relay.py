"""The relay role: no model work; it stores and serves every header and body it admits,
so peers can pull rollouts from it when their producer is gone or far away."""

from __future__ import annotations

import trio

from node.peer.ports import RelayPeer
from node.roles.config import RelayConfig, RoleIO

PULLS_BODIES = True


async def run(peer: RelayPeer, config: RelayConfig, io: RoleIO) -> None:
    """Report what the relay stored and served, every second, until cancelled."""
    while True:
        io.status.update(
            relayed_bodies=peer.counters.get("stored_rollout_record", 0),
            served=peer.counters.get("served", 0),
        )
        await trio.sleep(1.0)
