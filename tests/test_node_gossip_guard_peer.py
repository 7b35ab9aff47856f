"""A GossipSub control flood costs its sender in the peer's own score table and ledger,
with the reason, like any other offence (`Peer._on_misbehaviour` -> admission)."""

from __future__ import annotations

import time
from pathlib import Path

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_uvarint

from node.host.gossip_guard import ControlLimits
from node.host.host import HostSettings
from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest
from protocol import penalties
from protocol.identity import Identity

pytestmark = pytest.mark.network


async def test_a_topic_flood_is_charged_to_its_sender_with_its_reason(tmp_path: Path) -> None:
    settings = HostSettings(gossip_limits=ControlLimits(window_s=10.0, max_topics=10))
    cfg = PeerConfig(
        manifest=net_manifest("guard"),
        identity=Identity.generate(),
        data_dir=tmp_path / "p",
        roles=("relay",),
        host=settings,
    )
    rpc = rpc_pb2.RPC()
    for i in range(50):
        sub = rpc.subscriptions.add()
        sub.subscribe, sub.topicid = True, f"junk-{i}"
    data = rpc.SerializeToString()
    plain = new_host(key_pair=create_new_key_pair())
    async with open_peer(cfg) as peer, plain.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        info = info_from_p2p_addr(multiaddr.Multiaddr(peer.host.listen_addrs()[0]))
        attacker = plain.get_id().to_base58()
        with trio.fail_after(15):
            await plain.connect(info)
            stream = await plain.new_stream(info.peer_id, ["/meshsub/1.1.0"])
            await stream.write(encode_uvarint(len(data)) + data)
            while peer.admission.scores.score(attacker, time.time()) >= 0:
                await trio.sleep(0.05)
        assert peer.admission.scores.score(attacker, time.time()) == pytest.approx(
            penalties.TOO_MANY_TOPICS.cost, abs=0.05
        )
        with trio.fail_after(5):
            while not peer.store.ledger(direction="in", outcome="rejected", limit=10):
                await trio.sleep(0.05)
        (line,) = peer.store.ledger(direction="in", outcome="rejected", limit=10)
        assert penalties.TOO_MANY_TOPICS.name in str(line)
        await plain.close()
