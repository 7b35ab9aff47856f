"""The relay role: no model work; it stores and serves every header and body it admits,
so peers can pull rollouts from it when their producer is gone or far away."""

from __future__ import annotations

from typing import Any

import trio

from node.roles import RoleContext

PULLS_BODIES = True


async def run(peer: Any, ctx: RoleContext) -> None:
    while True:
        ctx.status.update(
            relayed_bodies=peer.counters.get("stored_rollout_record", 0),
            served=peer.counters.get("served", 0),
        )
        await trio.sleep(1.0)
