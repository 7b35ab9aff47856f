"""Connection slots and limits of `node.host.host`: an inbound slot is released when its
connection closes (py-libp2p 0.8.1 held it until the swarm stopped, so a node refused
every peer after `max_connections` connections had come and gone), per-peer and per-IP
caps, and at the total cap the lowest-scored / least active connection makes room."""

from __future__ import annotations

import secrets
import time

import multiaddr
import pytest
import trio
from libp2p import create_yamux_muxer_option
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader

from node.host.host import HostSettings, PeerEvent, open_host
from tests.support.polling import until

pytestmark = pytest.mark.network


def _key() -> bytes:
    return secrets.token_bytes(32)


async def _visit(
    addr: str, stay_s: float = 0.0, timeout_s: float = 10.0, key_pair: object = None
) -> bool:
    """Connect to `addr` as a fresh identity (TCP, Noise, Yamux), wait until the host
    shows it registered the connection (its first Yamux frame: the heartbeat opening a
    stream), stay `stay_s`, then close. True if the whole handshake succeeded."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    key_pair = key_pair or create_new_key_pair()
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519().private_key)
    upgrader = TransportUpgrader({NOISE_PROTOCOL_ID: noise}, create_yamux_muxer_option())
    tcp_addr = multiaddr.Multiaddr(addr).decapsulate(multiaddr.Multiaddr(f"/p2p/{info.peer_id}"))
    raw = None
    try:
        with trio.fail_after(timeout_s):
            raw = await TCP().dial(tcp_addr)
            secured = await upgrader.upgrade_security(raw, True, info.peer_id)
            muxed = await upgrader.upgrade_connection(secured, info.peer_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(muxed.start)
                await muxed.accept_stream()  # the host registered us and opened a stream
                if stay_s:
                    await trio.sleep(stay_s)
                nursery.cancel_scope.cancel()  # the socket is closed below
        return True
    except trio.TooSlowError:
        return False
    except Exception:
        return False
    finally:
        if raw is not None:
            with trio.move_on_after(2):
                try:
                    await raw.close()
                except Exception:
                    pass


async def _honest_peer_connects(addr: str) -> bool:
    async with open_host(_key()) as honest:
        result = await honest.connect(addr)
        return result.ok


@pytest.mark.slow
async def test_closed_connections_give_their_inbound_slot_back() -> None:
    """500 serial (at least twice the library's inbound slots) and 300 concurrent
    connections from fresh identities, each closed after the handshake; then an honest
    peer still connects."""
    started = time.monotonic()
    async with open_host(_key()) as host:
        addr = host.listen_addrs()[0]
        assert 2 * host.libp2p.get_network()._inbound_limiter.total_tokens <= 500
        for i in range(500):
            ok = await _visit(addr)
            assert ok, f"connection {i + 1} from a fresh identity was refused"
        ok_count = 0

        async def one() -> None:
            nonlocal ok_count
            got_in = await _visit(addr, stay_s=0.2, timeout_s=30)
            ok_count += got_in

        async with trio.open_nursery() as nursery:
            for _ in range(300):
                nursery.start_soon(one)
        assert ok_count >= 150, f"only {ok_count} of 300 concurrent connections got in"
        network = host.libp2p.get_network()
        with trio.fail_after(20):
            while host.connected_peers() or network.get_connections():
                await trio.sleep(0.05)
        # Every slot is back and the library's own cleanup ran (connections unregistered).
        assert network._inbound_limiter.borrowed_tokens == 0
        assert await _honest_peer_connects(addr)
    assert time.monotonic() - started < 120


async def test_inbound_connections_per_ip_are_capped_and_released() -> None:
    settings = HostSettings(max_connections_per_ip=3, ip_limit_on_loopback=True)
    async with open_host(_key(), settings=settings) as host:
        addr = host.listen_addrs()[0]
        results: list[bool] = []

        async def one() -> None:
            results.append(await _visit(addr, stay_s=1.5, timeout_s=15))

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        assert sum(results) == 3, results
        assert host.inbound_gate.refused == 3
        with trio.fail_after(10):
            while host.inbound_gate.counts:
                await trio.sleep(0.05)
        assert await _visit(addr)


async def test_connections_per_peer_are_capped() -> None:
    settings = HostSettings(max_connections_per_peer=1)
    async with open_host(_key(), settings=settings) as host:
        addr = host.listen_addrs()[0]
        key_pair = create_new_key_pair()
        peer = ID.from_pubkey(key_pair.public_key)
        network = host.libp2p.get_network()
        settled: list[int] = []
        async with trio.open_nursery() as visits:
            for _ in range(3):
                visits.start_soon(_visit, addr, 2.0, 10.0, key_pair)
            await trio.sleep(1.2)  # all three handshakes done, the extra ones closed
            settled.append(len(network.get_connections(peer)))
        assert settled == [1]


async def test_at_the_cap_the_lowest_scored_peer_makes_room() -> None:
    settings = HostSettings(max_connections=3)
    async with open_host(_key(), settings=settings) as host:
        addr = host.listen_addrs()[0]
        async with open_host(_key()) as a, open_host(_key()) as b, open_host(_key()) as c:
            for h in (a, b, c):
                assert (await h.connect(addr)).ok
            scores = {a.peer_id: 1.0, b.peer_id: -5.0, c.peer_id: 2.0}
            host.set_connection_scorer(lambda p: scores.get(p, 0.0))
            async with open_host(_key()) as d:
                assert (await d.connect(addr)).ok
                with trio.fail_after(10):
                    while b.peer_id in host.connected_peers():
                        await trio.sleep(0.05)
                await trio.sleep(0.5)
                assert sorted(host.connected_peers()) == sorted([a.peer_id, c.peer_id, d.peer_id])
                # A newcomer scored below everyone is the one that goes.
                scores["low"] = -10.0
                async with open_host(_key()) as e:
                    told: list[PeerEvent] = []
                    e.on_peer_event(lambda ev: told.append(ev) if ev.kind == "told" else None)
                    scores[e.peer_id] = -10.0
                    await e.connect(addr)
                    await trio.sleep(1.0)
                    assert e.peer_id not in host.connected_peers()
                    assert d.peer_id in host.connected_peers()
                    # and it was told why, and when to try again
                    await until("the refused newcomer told", lambda: told)
                    assert told[0].peer == host.peer_id and "connection cap" in told[0].reason
                    assert told[0].until > time.time() + 30


@pytest.mark.slow
async def test_a_flood_at_the_cap_evicts_only_the_excess() -> None:
    """60 connections at once against a cap of 20: the host ends near its cap, not far
    below it (an eviction still closing must not count again for the next newcomer)."""
    settings = HostSettings(max_connections=20)
    async with open_host(_key(), settings=settings) as host:
        addr = host.listen_addrs()[0]
        async with trio.open_nursery() as nursery:
            for _ in range(60):
                nursery.start_soon(_visit, addr, 4.0)
            await trio.sleep(3.0)  # every visitor connected and stays 4 s
            held = len(host.connected_peers())
        assert 15 <= held <= 20, held
        assert await _honest_peer_connects(addr)


async def test_at_the_cap_the_least_active_peer_makes_room() -> None:
    settings = HostSettings(max_connections=2)
    async with open_host(_key(), settings=settings) as host:
        addr = host.listen_addrs()[0]

        async def echo(stream) -> None:  # type: ignore[no-untyped-def]
            await stream.send(await stream.receive())

        host.set_stream_handler("/t/echo/1", echo)
        async with open_host(_key()) as a, open_host(_key()) as b:
            assert (await a.connect(addr)).ok
            assert (await b.connect(addr)).ok
            stream = await a.open_stream(host.peer_id, "/t/echo/1")  # a is active, b idle
            await stream.send(b"x")
            assert await stream.receive() == b"x"
            await stream.close()
            async with open_host(_key()) as c:
                assert (await c.connect(addr)).ok
                with trio.fail_after(10):
                    while b.peer_id in host.connected_peers():
                        await trio.sleep(0.05)
                assert sorted(host.connected_peers()) == sorted([a.peer_id, c.peer_id])


async def test_the_library_never_dials_peers_on_its_own() -> None:
    """The library's auto-connector dials peerstore peers (learned from identify, PX or a
    past connection, after a 60 s backoff) up to half its high watermark: an evicted or
    banned peer came back, and dials went out that nothing of ours asked for."""
    async with open_host(_key()) as host, open_host(_key()) as other:
        info = info_from_p2p_addr(multiaddr.Multiaddr(other.listen_addrs()[0]))
        host.libp2p.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
        network = host.libp2p.get_network()
        await network.auto_connector.maybe_connect()
        await trio.sleep(2.0)
        assert network.get_connections(info.peer_id) == []
        assert other.peer_id not in host.connected_peers()
