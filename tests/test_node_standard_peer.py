"""A standard libp2p peer stays connected to us: liveness through the
standard ping `/ipfs/ping/1.0.0`, identify names us `swarm-node/<version>`, and GossipSub
offers its newest protocol (`/meshsub/1.2.0`) besides the old ones."""

from __future__ import annotations

import multiaddr
import pytest
import trio

from node.host.host import HostSettings, open_host
from protocol.identity import Identity

pytestmark = pytest.mark.network

FAST = HostSettings(heartbeat_interval_s=0.2, peer_dead_after_s=1.5)


async def _read_identify(plain, peer_id) -> bytes:  # type: ignore[no-untyped-def]
    from libp2p.identity.identify.identify import ID as IDENTIFY

    stream = await plain.new_stream(peer_id, [IDENTIFY])
    data = b""
    with trio.move_on_after(5):
        while True:
            try:
                chunk = await stream.read(65536)
            except Exception:  # the library signals the end of the answer by raising
                break
            if not chunk:
                break
            data += chunk
    return data


async def test_a_standard_libp2p_peer_stays_connected_and_sees_our_agent() -> None:
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr

    plain = new_host(key_pair=create_new_key_pair())  # library defaults: standard protocols
    async with open_host(Identity.generate().private_bytes(), settings=FAST) as ours:
        async with plain.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            info = info_from_p2p_addr(multiaddr.Multiaddr(ours.listen_addrs()[0]))
            with trio.fail_after(15):
                await plain.connect(info)
            with trio.move_on_after(10):
                while plain.get_id().to_base58() not in ours.connected_peers():
                    await trio.sleep(0.05)
            # Several times our dead-peer limit: a peer answering only the standard ping
            # must still be connected.
            await trio.sleep(FAST.peer_dead_after_s * 3)
            assert plain.get_id().to_base58() in ours.connected_peers()
            assert ours.peer_rtt(plain.get_id().to_base58()) == ours.peer_rtt(
                plain.get_id().to_base58()
            )  # measured (not NaN)
            raw = await _read_identify(plain, info.peer_id)
            assert b"swarm-node/" in raw and b"py-libp2p/" not in raw
            # The newest GossipSub we speak is offered, not only /meshsub/1.0.0.
            with trio.fail_after(10):
                stream = await plain.new_stream(info.peer_id, ["/meshsub/1.2.0"])
            await stream.reset()
            await plain.close()


async def test_garbage_gossipsub_rpc_does_not_crash_the_host() -> None:
    """`node.host.gossip_guard.GuardedPubsub`: a GossipSub RPC that is not protobuf does not take
    the host down (unpatched, it raises out of the library's reader and does)."""
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr

    plain = new_host(key_pair=create_new_key_pair())
    async with open_host(Identity.generate().private_bytes(), settings=FAST) as ours:
        topic = "t/garbage"
        await ours.subscribe(topic)
        async with plain.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            info = info_from_p2p_addr(multiaddr.Multiaddr(ours.listen_addrs()[0]))
            with trio.fail_after(15):
                await plain.connect(info)
                stream = await plain.new_stream(info.peer_id, ["/meshsub/1.2.0"])
                await stream.write(b"\x05\xff\xff\xff\xff\xff")  # varint length, not protobuf
            await trio.sleep(1.0)
            await plain.close()
        # Still alive: another peer can connect and talk.
        async with open_host(Identity.generate().private_bytes(), settings=FAST) as other:
            assert (await other.connect(ours.listen_addrs()[0])).ok
