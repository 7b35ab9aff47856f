"""The peer runtime in one process: admission as the GossipSub validator (a rejected message
is not forwarded), headers forwarded across a hop with bodies pulled, bans that survive a
restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node.peer.peer import open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import Kind
from protocol.identity import Identity
from tests.support.peers import relay_config
from tests.support.polling import until

pytestmark = pytest.mark.network


async def test_rejected_gossip_stops_at_the_first_hop_and_valid_gossip_crosses_it(
    tmp_path: Path,
) -> None:
    manifest = net_manifest("hop")
    async with (
        open_peer(relay_config(tmp_path, "b", manifest)) as b,
        open_peer(
            relay_config(
                tmp_path, "a", manifest, max_peers=1, bootstrap=(b.host.listen_addrs()[0],)
            )
        ) as a,
        open_peer(
            relay_config(
                tmp_path, "c", manifest, max_peers=1, bootstrap=(b.host.listen_addrs()[0],)
            )
        ) as c,
    ):
        await until("chain a - b - c", lambda: len(b.host.connected_peers()) == 2)
        assert a.host.connected_peers() == [b.host.peer_id] and c.host.connected_peers() == [
            b.host.peer_id
        ]
        await a.host.wait_for_topic_peers(a.topics["rollouts"], 1, 10)
        await c.host.wait_for_topic_peers(c.topics["rollouts"], 1, 10)
        for i in range(3):
            await a.host.publish(a.topics["rollouts"], b"\xc1not a header" + bytes([i]))
        rid = await a.produce(synthetic_record(a.identity, manifest, 0, n_completion=64))
        await until("c stores the record's body", lambda: c.counters["stored_rollout_record"] >= 1)
        assert b.rejects["malformed"] == 3
        assert c.rejects.get("malformed", 0) == 0  # never forwarded past b
        assert c.counters["in_rollout_header"] == 1
        row = c.store.get_rollout(rid)
        assert row is not None and row.body is not None and row.source_peer is not None


async def test_a_ban_survives_a_restart(tmp_path: Path) -> None:
    manifest = net_manifest("bans")
    cfg = relay_config(tmp_path, "d", manifest)
    offender = Identity.generate().peer_id_b58
    async with open_peer(cfg) as peer:
        for i in range(30):
            if peer.host.is_banned(offender):
                break
            await peer.admit(offender, Kind.ROLLOUT_HEADER, b"\xc1junk" + bytes([i]))
            await trio.sleep(0)
        await until("the offender is banned", lambda: peer.host.is_banned(offender))
        assert peer.counters["bans"] == 1
    async with open_peer(cfg) as again:
        assert again.host.is_banned(offender)
        assert again.admission.scores.is_banned(offender, time.time())
        rejected = again.store.ledger(direction="in", outcome="rejected", limit=100)
        assert any(e.reason == "malformed" and e.peer == offender for e in rejected)


async def test_body_streams_per_peer_are_capped(tmp_path: Path) -> None:
    from node.exchange import rollouts as rx
    from node.host.host import PeerError

    manifest = net_manifest("cap")
    async with (
        open_peer(relay_config(tmp_path, "s", manifest)) as server,
        open_peer(
            relay_config(tmp_path, "c", manifest, bootstrap=(server.host.listen_addrs()[0],))
        ) as client,
    ):
        await until("connected", lambda: client.host.connected_peers() == [server.host.peer_id])
        streams, refused = [], 0
        for _ in range(rx.MAX_SERVE_STREAMS_PER_PEER + 2):
            try:
                stream = await client.host.open_stream(server.host.peer_id, rx.protocol_id("cap"))
            except PeerError:
                refused += 1  # the server reset it during negotiation
                continue
            streams.append(stream)
            await trio.sleep(0.2)  # let the server's handler start
        await until(
            "extra streams refused", lambda: server.counters["serve_refused"] >= 2, timeout=10
        )
        # the first ones still work
        await streams[0].send(rx.encode_request([bytes(32)]))
        assert await streams[0].receive() == b""  # unknown id: an empty frame
        for late in streams[rx.MAX_SERVE_STREAMS_PER_PEER :]:
            with pytest.raises(PeerError):
                await late.send(rx.encode_request([bytes(32)]))
                await late.receive()
        for s in streams:
            await s.close()
