"""GossipSub control budgets per peer (`node.host.gossip_guard`): a peer flooding GRAFT/PRUNE,
IHAVE or IWANT, subscribing to too many topics, or sending an RPC over the size limit is
reported once through `SwarmHost.on_misbehaviour`, and the excess is dropped; an honest
peer's gossip is never reported."""

from __future__ import annotations

import secrets

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_uvarint

from node.host.gossip_guard import ControlLimits
from node.host.host import HostSettings, Misbehaviour, open_host

pytestmark = pytest.mark.network

LIMITS = HostSettings(
    gossip_limits=ControlLimits(
        window_s=10.0, max_graft_prune=20, max_ihave_ids=100, max_iwant_ids=100, max_topics=10
    )
)


async def _send_rpcs(rpcs: list[bytes], raw_prefix: bytes = b"") -> list[Misbehaviour]:
    """Open a GossipSub stream from a plain libp2p host to ours, write `rpcs` (each
    varint-prefixed) and return what our host reported about the sender."""
    notices: list[Misbehaviour] = []
    plain = new_host(key_pair=create_new_key_pair())
    async with open_host(secrets.token_bytes(32), settings=LIMITS) as ours:
        ours.on_misbehaviour(notices.append)
        await ours.subscribe("t")
        async with plain.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            info = info_from_p2p_addr(multiaddr.Multiaddr(ours.listen_addrs()[0]))
            with trio.fail_after(15):
                await plain.connect(info)
                stream = await plain.new_stream(info.peer_id, ["/meshsub/1.1.0"])
                for rpc in rpcs:
                    await stream.write(encode_uvarint(len(rpc)) + rpc)
                if raw_prefix:
                    await stream.write(raw_prefix)
            with trio.move_on_after(3):
                while not notices:
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            assert all(n.peer == plain.get_id().to_base58() for n in notices)
            await plain.close()
    return notices


def _rpc(build) -> bytes:  # type: ignore[no-untyped-def]
    rpc = rpc_pb2.RPC()
    build(rpc)
    return rpc.SerializeToString()


async def test_a_graft_flood_is_reported_once() -> None:
    def grafts(rpc) -> None:  # type: ignore[no-untyped-def]
        for i in range(30):
            rpc.control.graft.add().topicID = f"t{i}"

    notices = await _send_rpcs([_rpc(grafts), _rpc(grafts)])
    assert [n.reason for n in notices] == ["graft_prune_flood"]
    assert notices[0].penalty < 0 and "limit 20" in notices[0].detail


async def test_ihave_and_iwant_floods_are_reported() -> None:
    def ihave(rpc) -> None:  # type: ignore[no-untyped-def]
        entry = rpc.control.ihave.add()
        entry.topicID = "t"
        entry.messageIDs.extend(f"id{i}".encode() for i in range(150))

    def iwant(rpc) -> None:  # type: ignore[no-untyped-def]
        rpc.control.iwant.add().messageIDs.extend(f"id{i}".encode() for i in range(150))

    notices = await _send_rpcs([_rpc(ihave), _rpc(iwant)])
    assert sorted(n.reason for n in notices) == ["ihave_flood", "iwant_flood"]


async def test_subscribing_to_too_many_topics_is_reported() -> None:
    def subs(rpc) -> None:  # type: ignore[no-untyped-def]
        for i in range(15):
            sub = rpc.subscriptions.add()
            sub.subscribe = True
            sub.topicid = f"topic-{i}"

    notices = await _send_rpcs([_rpc(subs)])
    assert [n.reason for n in notices] == ["too_many_topics"]


async def test_an_oversize_rpc_is_reported() -> None:
    notices = await _send_rpcs([], raw_prefix=encode_uvarint(2 * 1024 * 1024) + b"x" * 1024)
    assert [n.reason for n in notices] == ["oversize_rpc"]


async def test_honest_gossip_is_not_reported() -> None:
    notices: list[Misbehaviour] = []
    async with (
        open_host(secrets.token_bytes(32), settings=LIMITS) as a,
        open_host(secrets.token_bytes(32), settings=LIMITS) as b,
    ):
        a.on_misbehaviour(notices.append)
        b.on_misbehaviour(notices.append)
        for i in range(5):
            await a.subscribe(f"t{i}")
            await b.subscribe(f"t{i}")
        received = await b.subscribe("big")
        await a.subscribe("big")
        assert (await a.connect(b.listen_addrs()[0])).ok
        for i in range(20):
            await a.publish(f"t{i % 5}", b"x" * 1000)
        await a.publish("big", b"y" * 900_000)
        with trio.fail_after(10):
            msg = await received.receive()
        assert len(msg.data) == 900_000
        await trio.sleep(2.5)  # a few heartbeats of GRAFT/IHAVE
    assert notices == []
