"""Gossip topics and pacing, the body-pull protocol, and discovery's pieces."""

from __future__ import annotations

import secrets
import time

import msgpack
import pytest
import trio
import trio.testing

from node.exchange import rollouts as rx
from node.host.host import FrameTooLarge, HostSettings, open_host
from node.peer.config import SeqCounter
from node.peer.discovery import (
    BACKOFF_MAX_S,
    AddressBook,
    check_hello,
    decode_addrs,
    encode_addrs,
    exchange_hello,
)
from node.peer.gossip import Outbox, run_topics, topic_name
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import Kind
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.wire import PeerHello


def test_topics_are_per_run_and_typed() -> None:
    assert topic_name("a", "rollouts") == "swarm-rl/a/rollouts/1"
    assert topic_name("a", "rollouts") != topic_name("b", "rollouts")
    assert run_topics("r")["swarm-rl/r/verdicts/1"] is Kind.VERDICT
    with pytest.raises(ValueError, match="unknown topic"):
        topic_name("a", "chat")


class _FakeHost:
    settings = HostSettings()

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, bytes]] = []

    async def publish(self, topic: str, data: bytes) -> None:
        self.sent.append((trio.current_time(), topic, data))


def test_outbox_paces_to_its_rate_and_drops_nothing() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def scenario() -> list[tuple[float, str, bytes]]:
        host = _FakeHost()
        box = Outbox(host, rate_per_s=5.0, burst=2, capacity=4)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(box.run)
            for i in range(20):  # more than the capacity: put() waits instead of dropping
                await box.put("t", bytes([i]))
            while len(host.sent) < 20:
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        return host.sent

    sent = trio.run(scenario, clock=clock)
    assert [d for _, _, d in sent] == [bytes([i]) for i in range(20)]
    # burst of 2 at once, then one every 0.2 s: 18 more take 3.6 s
    assert sent[-1][0] - sent[0][0] == pytest.approx(3.6, abs=0.01)
    gaps = [b[0] - a[0] for a, b in zip(sent[2:], sent[3:], strict=False)]
    assert min(gaps) >= 0.2 - 1e-9


def test_outbox_refuses_oversized_messages() -> None:
    box = Outbox(_FakeHost(), rate_per_s=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="over the limit"):
        trio.run(box.put, "t", b"x" * (HostSettings().max_gossip_bytes + 1))


def test_request_codec_round_trip_and_garbage() -> None:
    ids = [secrets.token_bytes(32) for _ in range(5)]
    assert rx.decode_request("p", rx.encode_request(ids)) == ids
    for bad in (
        b"",
        b"\xc1",
        msgpack.packb([b"short"]),
        msgpack.packb([]),
        msgpack.packb({"a": 1}),
        msgpack.packb([secrets.token_bytes(32)] * 33),
        b"\x00" * (rx.MAX_REQUEST_BYTES + 1),
    ):
        with pytest.raises(rx.BadRequest):
            rx.decode_request("p", bad)
    with pytest.raises(ValueError):
        rx.encode_request([])


async def test_pull_over_a_real_stream_and_missing_ids() -> None:
    manifest = net_manifest("pull")
    ident = Identity.generate()
    records = {}
    for i in range(3):
        rec = synthetic_record(ident, manifest, i, n_completion=64)
        from protocol.rollout import open_record

        records[open_record(rec).rollout_id] = rec
    missing = secrets.token_bytes(32)

    async with (
        open_host(secrets.token_bytes(32)) as server,
        open_host(secrets.token_bytes(32)) as client,
    ):

        async def lookup(ids: list[bytes]) -> list[bytes | None]:
            return [records.get(i) for i in ids]

        server.set_stream_handler(
            rx.protocol_id("pull"), rx.server("pull", lookup, lambda _n: None)
        )
        assert (await client.connect(server.listen_addrs()[0])).ok
        ids = [*records, missing]
        got = await rx.pull(client, server.peer_id, "pull", ids)
        assert got[:3] == list(records.values()) and got[3] is None


async def test_pull_refuses_an_oversized_answer() -> None:
    small = HostSettings(max_frame_bytes=rx.MAX_RECORD_BYTES + 10)
    async with (
        open_host(secrets.token_bytes(32), settings=small) as server,
        open_host(secrets.token_bytes(32)) as client,
    ):

        async def handler(stream) -> None:  # type: ignore[no-untyped-def]
            await stream.receive(rx.MAX_REQUEST_BYTES)
            await stream.send(b"\x00" * (rx.MAX_RECORD_BYTES + 1))

        server.set_stream_handler(rx.protocol_id("big"), handler)
        assert (await client.connect(server.listen_addrs()[0])).ok
        with pytest.raises(FrameTooLarge):
            await rx.pull(client, server.peer_id, "big", [secrets.token_bytes(32)])


def test_address_book_backoff_flaps_and_bounds() -> None:
    me = Identity.generate().peer_id_b58
    book = AddressBook(me, max_peers=2)
    peers = [Identity.generate().peer_id_b58 for _ in range(3)]
    addr = [f"/ip4/127.0.0.1/tcp/{4000 + i}/p2p/{p}" for i, p in enumerate(peers)]
    assert book.add(addr[0]) == peers[0]
    assert book.add(f"/ip4/127.0.0.1/tcp/1/p2p/{me}") is None  # ourselves
    assert book.add("/ip4/127.0.0.1/tcp/1") is None  # no peer id
    assert book.add("/ip4/127.0.0.1/tcp/1/p2p/notapeer") is None
    book.add(addr[1])
    book.succeeded(peers[0], 0.0)
    book.succeeded(peers[1], 0.0)
    assert book.add(addr[2]) is None and len(book) == 2  # bounded; working peers are kept
    now = 100.0
    assert {p for p, _ in book.due(set(), now)} == set(peers[:2])
    waits = []
    for _ in range(8):
        book.failed(peers[0], "refused", now)
        waits.append(book._peers[peers[0]].next_try - now)
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and max(waits) == BACKOFF_MAX_S
    assert peers[0] not in {p for p, _ in book.due(set(), now + 1)}
    book.succeeded(peers[1], now)
    book.succeeded(peers[1], now + 1)  # dropped again right after: a flap backs off
    assert book._peers[peers[1]].next_try > now + 1
    assert peers[1] not in {p for p, _ in book.due({peers[1]}, now + 100)}  # connected


def test_peer_list_codec_is_bounded() -> None:
    addrs = [f"/ip4/127.0.0.1/tcp/{i}/p2p/x" for i in range(40)]
    assert decode_addrs(encode_addrs(addrs)) == addrs[:32]
    for bad in (
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb(["a" * 300]),
        msgpack.packb(["a"] * 33),
    ):
        with pytest.raises(ValueError):
            decode_addrs(bad)


def _hello(ident: Identity, run: str) -> bytes:
    return seal(
        ident,
        PeerHello(roles=("relay",), policy_version=0, listen_addrs=(), agent="t"),
        run_id=run,
        policy_version=0,
        seq=1,
        timestamp_ms=int(time.time() * 1000),
    )


def test_hello_must_be_this_run_and_this_peer() -> None:
    a, b = Identity.generate(), Identity.generate()
    _, hello = check_hello(_hello(a, "r1"), a.peer_id_b58, "r1")
    assert hello.roles == ("relay",)
    with pytest.raises(ValueError, match="run"):
        check_hello(_hello(a, "r2"), a.peer_id_b58, "r1")
    with pytest.raises(ValueError, match="different peer"):
        check_hello(_hello(a, "r1"), b.peer_id_b58, "r1")


async def test_hello_exchange_over_a_stream() -> None:
    ka, kb = secrets.token_bytes(32), secrets.token_bytes(32)
    ia, ib = Identity.from_private_bytes(ka), Identity.from_private_bytes(kb)
    got: list[object] = []
    async with open_host(ka) as a, open_host(kb) as b:

        async def handler(stream) -> None:  # type: ignore[no-untyped-def]
            got.append(
                await exchange_hello(
                    stream,
                    initiator=False,
                    own_hello=_hello(ib, "h"),
                    own_addrs=["/ip4/1.2.3.4/tcp/1/p2p/x"],
                    run_id="h",
                )
            )

        b.set_stream_handler("/swarm-rl/h/hello/1", handler)
        assert (await a.connect(b.listen_addrs()[0])).ok
        stream = await a.open_stream(b.peer_id, "/swarm-rl/h/hello/1")
        hello, addrs = await exchange_hello(
            stream, initiator=True, own_hello=_hello(ia, "h"), own_addrs=[], run_id="h"
        )
        assert addrs == ["/ip4/1.2.3.4/tcp/1/p2p/x"] and hello.agent == "t"
        with trio.fail_after(10):
            while not got:
                await trio.sleep(0.05)


def test_sequence_numbers_are_dense_and_increase_across_restarts() -> None:
    a = SeqCounter(start_s=1_000)
    first = [a.next() for _ in range(1000)]
    assert first == list(range(first[0], first[0] + 1000))  # dense: reordering stays in window
    b = SeqCounter(start_s=1_001)  # restarted a second later
    assert b.next() > first[-1]


def test_address_book_evicts_peers_that_never_worked_first() -> None:
    """A full book takes a new entry in place of one that never worked, so peer exchange
    cannot fill it with fake ids for good."""
    me = Identity.generate().peer_id_b58
    book = AddressBook(me, max_peers=3)
    good = Identity.generate().peer_id_b58
    book.add(f"/ip4/127.0.0.1/tcp/4000/p2p/{good}")
    book.succeeded(good, 0.0)
    fakes = [Identity.generate().peer_id_b58 for _ in range(50)]
    for i, f in enumerate(fakes):
        book.add(f"/ip4/10.0.0.1/tcp/{5000 + i}/p2p/{f}")
        book.failed(f, "refused", 1.0)
    fresh = Identity.generate().peer_id_b58
    assert book.add(f"/ip4/127.0.0.1/tcp/4001/p2p/{fresh}") == fresh
    assert len(book) == 3 and book.addrs(good) and book.addrs(fresh)
