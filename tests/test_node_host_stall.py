"""`node.host.heartbeat`: a node whose own trio loop stood still (a model loading or a
checkpoint written in the loop's thread, a busy machine) does not drop its peers for the
answers it could not hear meanwhile; a peer that really is silent is still dropped."""

from __future__ import annotations

import os
import time

import pytest
import trio

from node.host.host import HostSettings, open_host
from tests.support.polling import until

pytestmark = [pytest.mark.network, pytest.mark.slow]

SETTINGS = HostSettings(heartbeat_interval_s=0.5, peer_dead_after_s=2.0)


async def test_our_own_stall_is_not_a_peers_silence() -> None:
    events: list[tuple[str, str]] = []
    async with (
        open_host(os.urandom(32), settings=SETTINGS) as a,
        open_host(os.urandom(32), settings=SETTINGS) as b,
    ):
        a.on_peer_event(lambda e: events.append((e.kind, e.peer)))
        b.on_peer_event(lambda e: events.append((e.kind, e.peer)))
        assert (await a.connect(a_addr := b.listen_addrs()[0])).ok, a_addr
        await until(
            "both see each other",
            lambda: a.connected_peers() == [b.peer_id] and b.connected_peers() == [a.peer_id],
        )
        await trio.sleep(1.0)  # pongs flowing
        time.sleep(SETTINGS.peer_dead_after_s + 2)  # noqa: ASYNC251 - the stall under test
        await trio.sleep(3 * SETTINGS.heartbeat_interval_s + 1)
        connected = (a.connected_peers(), b.connected_peers(), b.peer_id, a.peer_id)
        seen = list(events)  # before the hosts close
    # (asserted out here: a failure inside the hosts' nurseries nests too deep to read)
    assert [e for e in seen if e[0] in ("dropped", "disconnected")] == [], seen
    assert connected[:2] == ([connected[2]], [connected[3]]), connected
