"""`node.host_heartbeat`: a node whose own trio loop stood still (a model loading or a
checkpoint written in the loop's thread, a busy machine) does not drop its peers for the
answers it could not hear meanwhile; a peer that really is silent is still dropped."""

from __future__ import annotations

import os
import time

import pytest
import trio

from node.host import HostSettings, open_host
from tests.support.polling import until

pytestmark = pytest.mark.network

SETTINGS = HostSettings(heartbeat_interval_s=0.5, peer_dead_after_s=2.0)


async def test_our_own_stall_is_not_a_peers_silence() -> None:
    async with open_host(os.urandom(32), settings=SETTINGS) as a, open_host(os.urandom(32), settings=SETTINGS) as b:
        events: list[tuple[str, str]] = []
        a.on_peer_event(lambda e: events.append((e.kind, e.peer)))
        b.on_peer_event(lambda e: events.append((e.kind, e.peer)))
        assert (await a.connect(a_addr := b.listen_addrs()[0])).ok, a_addr
        await until("both see each other", lambda: a.connected_peers() == [b.peer_id] and b.connected_peers() == [a.peer_id])
        await trio.sleep(1.0)  # pongs flowing
        time.sleep(SETTINGS.peer_dead_after_s + 2)  # noqa: ASYNC251 - the stall under test
        await trio.sleep(3 * SETTINGS.heartbeat_interval_s + 1)
        assert [e for e in events if e[0] in ("dropped", "disconnected")] == [], events
        assert a.connected_peers() == [b.peer_id] and b.connected_peers() == [a.peer_id]
