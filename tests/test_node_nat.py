"""Circuit relay v2, AutoNAT and DCUtR (`node.host.relay`, `node.host.reachability`) with
real peer processes (`node.testing.nat_peer`): on loopback for the relay's limits, and on an
emulated network of namespaces behind cone and symmetric NATs (`node.testing.netlab`).

The namespace tests need root, `ip` and `iptables`: they skip with the reason elsewhere,
and fail in CI (SWARM_CI=1), which installs iptables.
"""

from __future__ import annotations

import os
import socket

import multiaddr
import pytest
import trio

from node.host.host import open_host
from node.testing.nat_peer import start_in
from node.testing.netlab import PUBLIC_IP, NetLab, unavailable

IN_CI = os.environ.get("SWARM_CI") == "1"


def _need_netlab() -> None:
    reason = unavailable()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"the emulated-network tests must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def netlab():  # type: ignore[no-untyped-def]
    _need_netlab()
    lab = NetLab()
    try:
        yield lab
    finally:
        lab.close()


async def _start_all(*specs: tuple[str, ...]) -> list:  # type: ignore[type-arg]
    """`start_in(ns, listen, *extra)` for each spec (ns "" is this namespace), all at once;
    the peers in the specs' order. If one fails to start, the others are stopped."""
    started: list = [None] * len(specs)  # type: ignore[type-arg]

    async def one(i: int, ns: str, listen: str, *extra: str) -> None:
        started[i] = await start_in(ns or None, listen, *extra)

    try:
        async with trio.open_nursery() as nursery:
            for i, spec in enumerate(specs):
                nursery.start_soon(one, i, *spec)
    except BaseException:
        with trio.CancelScope(shield=True):
            for p in started:
                if p is not None:
                    await p.stop()
        raise
    return started


@pytest.mark.slow
async def test_a_relay_at_its_limits_refuses_new_reservations_and_keeps_existing_ones() -> None:
    peers = await _start_all(
        ("", "/ip4/127.0.0.1/tcp/0", "--serve-relay", "--max-reservations", "2"),
        *[("", "/ip4/127.0.0.1/tcp/0")] * 4,
    )
    relay, a, b, flooder, dialer = peers
    try:
        addr = relay.addrs[0]
        held = [await p.ask({"cmd": "reserve", "addr": addr}) for p in (a, b)]
        assert all(r["ok"] for r in held), held
        refused = await flooder.ask({"cmd": "reserve", "addr": addr})
        assert not refused["ok"] and "refused" in refused["error"], refused
        again = await a.ask({"cmd": "reserve", "addr": addr})  # a refresh keeps its slot
        assert again["ok"], again
        stats = await relay.ask({"cmd": "stats"})
        assert stats["relay_reservations"] == 2
        # The existing slots still carry circuits: reach both through the relay.
        for holder, answer in zip((a, b), held, strict=True):
            dialed = await dialer.ask({"cmd": "connect", "addr": answer["addr"]})
            assert dialed["ok"] and dialed["peer"] == holder.peer_id, dialed
            sent = await dialer.ask({"cmd": "send", "peer": holder.peer_id, "n": 2, "size": 1000})
            assert sent["sent"] == 2, sent
        assert (await relay.ask({"cmd": "stats"}))["relay_bytes"] > 2 * 2 * 1000
    finally:
        for p in peers:
            await p.stop()


async def test_hole_punch_dials_can_leave_from_our_listen_port() -> None:
    """DCUtR's TCP hole punch binds its dial to our listen port: that needs SO_REUSEPORT
    on the listener (`node.host.libp2p_patches.exclusive_listen_port` keeps it, and claims the port
    first so two nodes still cannot share one)."""
    async with open_host(os.urandom(32), ["/ip4/127.0.0.1/tcp/0"]) as host:
        port = int(host.listen_addrs()[0].split("/tcp/")[1].split("/")[0])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", port))
        finally:
            sock.close()


@pytest.mark.slow
async def test_natted_workers_are_private_reserve_a_relay_and_deliver_through_it(
    netlab: NetLab,
) -> None:
    cone1, cone2, symmetric = (
        netlab.add_nat("cone"),
        netlab.add_nat("cone"),
        netlab.add_nat("symmetric"),
    )
    peers = await _start_all(
        (netlab.wan, f"/ip4/{PUBLIC_IP}/tcp/4001", "--serve-relay"),
        (netlab.wan, f"/ip4/{PUBLIC_IP}/tcp/4002"),
        *[(ns, f"/ip4/{netlab.host_ip(ns)}/tcp/4100") for ns in (cone1, cone2, symmetric)],
    )
    relay, trainer, *workers = peers
    try:
        relayed: dict[str, str] = {}
        for w in (trainer, *workers):
            assert (await w.ask({"cmd": "connect", "addr": relay.addrs[0]}))["ok"]

        # AutoNAT: the relay dials each one back; only the trainer answers (asked at once:
        # a dial-back into a NAT waits out its timeout).
        async def private_then_reserve(w) -> None:  # type: ignore[no-untyped-def]
            assert (await w.ask({"cmd": "reach", "servers": [relay.peer_id]}, timeout=40)) == {
                "reachability": "private"
            }
            answer = await w.ask({"cmd": "reserve", "addr": relay.addrs[0]})
            assert answer["ok"], answer
            relayed[w.peer_id] = answer["addr"]

        async with trio.open_nursery() as nursery:
            for w in workers:
                nursery.start_soon(private_then_reserve, w)
            assert (
                await trainer.ask({"cmd": "reach", "servers": [relay.peer_id]}, timeout=40)
            ) == {"reachability": "public"}
        # The trainer reaches every worker through the relay, and their payloads arrive.
        for w in workers:
            dialed = await trainer.ask({"cmd": "connect", "addr": relayed[w.peer_id]})
            assert dialed["ok"] and dialed["peer"] == w.peer_id, dialed
            sent = await w.ask(
                {"cmd": "send", "peer": trainer.peer_id, "n": 5, "size": 20_000}, timeout=60
            )
            assert sent["sent"] == 5, sent
        got = await trainer.ask({"cmd": "stats"})
        assert got["received"] == {"count": 15, "bytes": 15 * 20_000}
        assert got["reachability"] == "public"
        # Worker to worker, both NATed: connected through the relay, then DCUtR punches a
        # hole through the two cone NATs; the symmetric NAT's new port per destination
        # defeats it and the pair stays relayed. The payloads arrive either way.
        # A punch that works makes the pair direct at once; the one the symmetric NAT
        # defeats is given a few seconds before the pair counts as relayed.
        for src, dst, direct, punch_s in (
            (workers[0], workers[1], True, 15),
            (workers[0], workers[2], False, 6),
        ):
            assert (await src.ask({"cmd": "connect", "addr": relayed[dst.peer_id]}))["ok"]
            punch = await src.ask(
                {"cmd": "punch", "peer": dst.peer_id, "timeout": punch_s}, timeout=30
            )
            assert punch == {"direct": direct}
            sent = await src.ask(
                {"cmd": "send", "peer": dst.peer_id, "n": 3, "size": 20_000}, timeout=60
            )
            assert sent["sent"] == 3, sent
        stats = await workers[0].ask({"cmd": "stats"})
        assert stats["reachability"] == "private" and stats["relayed_peers"] >= 1
        assert (await relay.ask({"cmd": "stats"}))["relay_bytes"] > 18 * 20_000
    finally:
        with trio.CancelScope(shield=True):
            for p in peers:
                await p.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_library_autonat_says_reachable_without_dialing_and_ours_dials_back(
    monkeypatch,
) -> None:
    """py-libp2p 0.8.1's AutoNAT server answers with `host.connect()`, a no-op for the
    (always connected) asker: an address nobody listens on is reported reachable.
    `DialBackAutoNAT` dials afresh. If the first assertion fails, the library is fixed."""
    from libp2p.host.autonat import AutoNATService
    from libp2p.peer.id import ID

    from node.host import reachability as host_reachability
    from node.host.reachability import DialBackAutoNAT

    monkeypatch.setattr(host_reachability, "DIAL_BACK_EVERY_S", 0.0)  # one asker, two questions

    closed = f"/ip4/127.0.0.1/tcp/{_closed_port()}"
    async with open_host(os.urandom(32)) as server, open_host(os.urandom(32)) as asker:
        assert (await asker.connect(server.listen_addrs()[0])).ok
        client = AutoNATService(asker._lh, serve=False)
        server_id = ID.from_base58(server.peer_id)
        advertised = [multiaddr.Multiaddr(closed).to_bytes()]
        AutoNATService(server._lh, serve=True)
        status, _ = await client.query_server(server_id, advertised)
        assert status == 0  # OK: "reachable" at a closed port (the library's behaviour)
        DialBackAutoNAT(server._lh, serve=True)  # replaces the handler
        status, _ = await client.query_server(server_id, advertised)
        assert status != 0  # E_DIAL_ERROR: our server really dialed, and failed
        status, _ = await client.query_server(
            server_id, [multiaddr.Multiaddr(asker.listen_addrs()[0].split("/p2p/")[0]).to_bytes()]
        )
        assert status == 0  # and a real listener is reachable


async def test_three_liars_cannot_flip_a_reachable_node_and_pay_for_lying() -> None:
    """Three peers answer every dial-back request "dial failed"; one honest peer dials us
    back. The honest dial-back is seen to arrive (a new connection from it), so the node
    stays public and each liar is reported to the host's misbehaviour listeners."""
    from node.host.gossip_guard import Misbehaviour
    from node.host.reachability import DialBackAutoNAT, Reachability

    async def never_dials(peer_id: object, addrs: object) -> None:
        return None

    async with (
        open_host(os.urandom(32)) as node,
        open_host(os.urandom(32)) as liar1,
        open_host(os.urandom(32)) as liar2,
        open_host(os.urandom(32)) as liar3,
        open_host(os.urandom(32)) as honest,
    ):
        liars = (liar1, liar2, liar3)
        for liar in liars:
            lying = DialBackAutoNAT(liar._lh, serve=True)
            lying._try_dial = never_dials  # type: ignore[method-assign]
        DialBackAutoNAT(honest._lh, serve=True)
        charged: list[Misbehaviour] = []
        node.on_misbehaviour(charged.append)
        reach = Reachability(node)
        for peer in (*liars, honest):
            assert (await node.connect(peer.listen_addrs()[0])).ok
        with trio.fail_after(30):
            verdict = await reach.check([p.peer_id for p in (*liars, honest)], 10.0)
        assert verdict == "public"
        assert reach.last is not None and reach.last.proven == 1 and reach.last.answered == 4
        assert sorted(m.peer for m in charged) == sorted(p.peer_id for p in liars)
        assert all(m.reason == "misbehaved" and m.penalty < 0 for m in charged)


async def test_a_relay_announces_itself_through_identify_and_a_public_node_reserves_nothing() -> (
    None
):
    from node.host.reachability import open_reachability
    from node.host.relay import RelayLimitsConfig, open_relay
    from node.peer.nat_upkeep import NatUpkeep

    async with (
        open_host(os.urandom(32)) as relay_host,
        open_host(os.urandom(32)) as node,
        open_relay(relay_host, RelayLimitsConfig()),
        open_reachability(relay_host),
        open_relay(node) as relay,
        open_reachability(node) as reach,
    ):
        upkeep = NatUpkeep(node, relay, reach, [relay_host.listen_addrs()[0]])
        assert (await node.connect(relay_host.listen_addrs()[0])).ok
        with trio.fail_after(5):
            while upkeep.relays_known() != [relay_host.peer_id]:
                await trio.sleep(0.05)
        assert await upkeep.check_once() == "public"  # loopback: the relay dialed us back
        assert relay.reservations == {}
        assert upkeep.stats()["reachability"] == "public"


async def test_a_reservation_is_for_the_connected_peer_and_ends_when_it_leaves() -> None:
    """The library reserved for whatever id the request named, and kept the slot after
    the peer left; `node.host.relay.CountingRelay` closes both."""
    from libp2p.peer.id import ID
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
    from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

    from node.host.relay import RELAY_HOP_PROTOCOL, RelayLimitsConfig, open_relay

    async with (
        open_host(os.urandom(32)) as relay_host,
        open_relay(relay_host, RelayLimitsConfig()) as relay,
    ):
        async with open_host(os.urandom(32)) as client:
            assert (await client.connect(relay_host.listen_addrs()[0])).ok
            made_up = ID.from_base58("12D3KooWRza5dJzJTwK4Qzy55XnGe7aAzNJjbqydFdvj4vmaitaD")
            stream = await client._lh.new_stream(
                ID.from_base58(relay_host.peer_id), [RELAY_HOP_PROTOCOL]
            )
            with trio.fail_after(5):
                await write_delimited_msg(
                    stream,
                    HopMessage(type=HopMessage.RESERVE, peer=CircuitPeerId(id=made_up.to_bytes())),
                )
                answer = await read_delimited_msg(stream, HopMessage)
            assert answer.status == 100  # OK
            held = relay.protocol.resource_manager._reservations
            assert set(held) == {ID.from_base58(client.peer_id)}
            assert relay.stats()["relay_reservations"] == 1
        with trio.fail_after(5):
            while relay.stats()["relay_reservations"]:
                await trio.sleep(0.05)
        assert relay.protocol.resource_manager.can_accept_reservation(made_up)
        assert held == {}


@pytest.mark.slow
async def test_full_nodes_behind_nat_go_private_reserve_on_the_relay_role_deliver_and_meet(
    netlab: NetLab, tmp_path
) -> None:
    """Full peers (`node.testing.net_peer`: `node.peer.peer.open_peer`): a `relay`-role bootstrap and a
    trainer on the public side, workers behind NATs that know only the bootstrap."""
    from node.testing.peer_process import PeerProcess

    async def spawn(ns: str, name: str, listen: str, *extra: str) -> PeerProcess:
        import subprocess
        import sys

        log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115
        try:
            proc = await trio.lowlevel.open_process(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "node.testing.net_peer",
                    "--data-dir",
                    str(tmp_path / name),
                    "--listen",
                    listen,
                    "--dead-after",
                    "8",
                    "--max-life",
                    "120",
                    *extra,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        finally:
            log.close()
        peer = PeerProcess(proc)
        peers.append(peer)
        hello = await peer.read(90)
        peer.peer_id, peer.addrs = hello["peer_id"], hello["addrs"]
        return peer

    async def until(what: str, check, timeout: float = 40):  # type: ignore[no-untyped-def]
        last = None
        with trio.move_on_after(timeout):
            while not (last := await check()):
                await trio.sleep(0.5)
            return last
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")

    peers: list[PeerProcess] = []
    worker_ns = netlab.add_nat("cone")
    try:
        boot = await spawn(netlab.wan, "boot", f"/ip4/{PUBLIC_IP}/tcp/4001", "--role", "relay")
        started: dict[str, PeerProcess] = {}

        async def spawn_as(name: str, *args: str) -> None:
            started[name] = await spawn(*args)

        async with trio.open_nursery() as nursery:  # both know only the bootstrap: start at once
            nursery.start_soon(
                spawn_as,
                "trainer",
                netlab.wan,
                "trainer",
                f"/ip4/{PUBLIC_IP}/tcp/4002",
                "--role",
                "trainer",
                "--bootstrap",
                boot.addrs[0],
            )
            nursery.start_soon(
                spawn_as,
                "worker",
                worker_ns,
                "worker",
                f"/ip4/{netlab.host_ip(worker_ns)}/tcp/4100",
                "--bootstrap",
                boot.addrs[0],
            )
        trainer, worker = started["trainer"], started["worker"]

        async def relayed() -> dict | None:  # type: ignore[type-arg]
            st = await worker.ask({"cmd": "stats"})
            return st if st["reachability"] == "private" and st["relayed_addrs"] else None

        st = await until("the worker to find itself private and hold a relay slot", relayed)
        assert st["relayed_addrs"][0].startswith(
            f"{boot.addrs[0]}/p2p-circuit/p2p/{worker.peer_id}"
        )
        boot_stats = await boot.ask({"cmd": "stats"})
        assert boot_stats["relay_serving"] and boot_stats["relay_reservations"] == 1
        assert (await trainer.ask({"cmd": "stats"}))["relay_serving"] is False
        await worker.ask({"cmd": "produce", "n": 10, "rate": 5})

        async def delivered() -> set[str] | None:
            own = set((await worker.ask({"cmd": "ids", "own": True}))["ids"])
            got = set((await trainer.ask({"cmd": "ids"}))["ids"])
            return own if len(own) == 10 and own <= got else None

        await until("the trainer to hold the worker's 10 rollouts", delivered, 60)
        # A second NATed worker, told only the bootstrap, learns the first one's relayed
        # address through peer exchange and reaches it through the relay.
        other_ns = netlab.add_nat("symmetric")
        other = await spawn(
            other_ns,
            "other",
            f"/ip4/{netlab.host_ip(other_ns)}/tcp/4100",
            "--bootstrap",
            boot.addrs[0],
        )

        async def met() -> bool:
            return worker.peer_id in (await other.ask({"cmd": "stats"}))["connected"]

        await until("the second NATed worker to reach the first", met, 60)
    finally:
        with trio.CancelScope(shield=True):
            for p in peers:
                await p.stop()


def test_reachability_and_relay_fields_become_prometheus_series() -> None:
    from node import metrics

    text = metrics.render(
        {
            "reachability": "private",
            "direct_peers": 2,
            "relayed_peers": 1,
            "relay_bytes": 4096,
            "relay_reservations": 3,
        }
    )
    assert "swarm_reachable 0" in text
    assert 'swarm_connected_peers{path="direct"} 2' in text
    assert 'swarm_connected_peers{path="relayed"} 1' in text
    assert "swarm_relay_bytes_total 4096" in text and "swarm_relay_reservations 3" in text
    assert "swarm_reachable" not in metrics.render({"reachability": "unknown"})


async def test_one_ip_address_cannot_take_every_relay_slot_with_fresh_identities() -> None:
    from node.host.relay import RelayLimitsConfig, RelayRefused, open_relay

    limits = RelayLimitsConfig(max_reservations=10, max_reservations_per_ip=2)
    async with open_host(os.urandom(32)) as relay_host, open_relay(relay_host, limits) as relay:
        addr = relay_host.listen_addrs()[0]
        async with (
            open_host(os.urandom(32)) as a,
            open_host(os.urandom(32)) as b,
            open_host(os.urandom(32)) as c,
            open_relay(a) as ra,
            open_relay(b) as rb,
            open_relay(c) as rc,
        ):
            await ra.reserve(addr)
            await rb.reserve(addr)
            with pytest.raises(RelayRefused):
                await rc.reserve(addr)  # a third identity from 127.0.0.1
            assert await ra.reserve(addr)  # a refresh from the same IP is still granted
            assert relay.stats()["relay_reservations"] == 2
        with trio.fail_after(5):  # the slots end with their connections: room again
            while relay.stats()["relay_reservations"]:
                await trio.sleep(0.05)
        async with open_host(os.urandom(32)) as d, open_relay(d) as rd:
            assert await rd.reserve(addr)


async def test_a_dial_back_request_costs_a_bounded_number_of_dials_per_asker() -> None:
    """An asker cannot make us dial without bound: at most `DIAL_BACK_ADDRS` of the
    addresses it advertises are dialed, and a second request within `DIAL_BACK_EVERY_S`
    is answered without dialing (raw listeners that accept and hang up count the addresses
    dialed; the library retries each dial, so connections are counted apart)."""
    from libp2p.host.autonat import AutoNATService
    from libp2p.host.autonat.pb.autonat_pb2 import Message
    from libp2p.peer.id import ID

    from node.host.reachability import DIAL_BACK_ADDRS, DialBackAutoNAT

    accepted = 0
    hit: set[int] = set()
    listeners = [trio.socket.socket() for _ in range(3 * DIAL_BACK_ADDRS)]

    async def hang_up(k: int, sock) -> None:  # type: ignore[no-untyped-def]
        nonlocal accepted
        while True:
            conn, _ = await sock.accept()
            accepted += 1
            hit.add(k)
            conn.close()

    async with trio.open_nursery() as nursery:
        for k, s in enumerate(listeners):
            await s.bind(("127.0.0.1", 0))
            s.listen(8)
            nursery.start_soon(hang_up, k, s)
        addrs = [
            multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}").to_bytes()
            for s in listeners
        ]
        async with open_host(os.urandom(32)) as server, open_host(os.urandom(32)) as asker:
            assert (await asker.connect(server.listen_addrs()[0])).ok
            DialBackAutoNAT(server._lh, serve=True)
            client = AutoNATService(asker._lh, serve=False)
            server_id = ID.from_base58(server.peer_id)
            seen = []  # (status, addresses dialed, connections) after each request
            for _ in range(2):
                with trio.fail_after(30):
                    status, _ = await client.query_server(server_id, addrs)
                seen.append((status, len(hit), accepted))
        nursery.cancel_scope.cancel()
    for s in listeners:
        s.close()
    assert seen[0][0] == Message.E_DIAL_ERROR and seen[0][1] == DIAL_BACK_ADDRS, seen
    # asked again too soon: refused (no verdict) and not one more connection
    assert seen[1][0] == Message.E_DIAL_REFUSED and seen[1][1:] == seen[0][1:], seen
