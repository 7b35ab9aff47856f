"""Two real peers on loopback: a node whose peer banned it notices that peer keeps closing
its connections (and what that peer told it), and says so in its status and metrics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node import metrics
from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest
from protocol.identity import Identity

pytestmark = pytest.mark.network


def _cfg(tmp: Path, name: str, manifest, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest, identity=Identity.generate(), data_dir=tmp / name, roles=("relay",), **kw
    )


async def test_a_node_its_peer_banned_reports_it(tmp_path: Path) -> None:
    manifest = net_manifest("dropped")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest)) as a,
    ):
        addr = b.host.listen_addrs()[0]
        await a.host.connect(addr)
        with trio.fail_after(10):
            while a.host.peer_id not in b.host.connected_peers():
                await trio.sleep(0.05)
        await b.host.ban(a.host.peer_id, 3600, "test")
        with trio.fail_after(30):
            while (
                a.stats()["dropped_by"].get(b.host.peer_id, {}).get("closes", 0)
                < a.dropped_by.threshold
            ):  # type: ignore[attr-defined]
                await a.host.connect(addr)
                await trio.sleep(0.3)
        d = a.stats()["dropped_by"][b.host.peer_id]  # type: ignore[index]
        # it was told (node.host.goodbye): the reason and the ban's end, not a reporting window
        assert d["told"] and d["reason"] == "banned: test" and d["until"] > time.time() + 3000, d
        assert "swarm_dropped_by_peers 1" in metrics.render(a.stats())
