"""Discovery: a bootstrap list, peer exchange on a hello stream, and redial with backoff.

Hello protocol `/swarm-rl/<run>/hello/1` (`HELLO`, on `node.exchange.request_response`),
opened by whoever dialed:

    each side sends   frame 1: a sealed `PeerHello` envelope (roles, policy version,
                               listen addrs, agent) signed by the peer's identity key
                      frame 2: msgpack array of up to MAX_SHARED_ADDRS multiaddrs of other
                               peers it is connected to (peer exchange)
    (the dialer writes first, then reads; the other side reads first, then writes)

A hello of another run, a signer that is not the connection's peer, or a malformed frame
ends the connection (and is reported as a failure reason). Learned addresses go into the
`AddressBook`; `redial_loop` dials every known, unconnected, unbanned peer with
exponential backoff (1 s doubling to 30 s), a bounded number at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from node.exchange.request_response import (
    BadMessage,
    ExchangeSpec,
    Frames,
    MsgpackCodec,
    Raw,
    receive_message,
    send_message,
)
from node.host.host import FramedStream, PeerError, SwarmHost
from protocol.envelope import open_envelope
from protocol.errors import RemoteProtocolError
from protocol.identity import peer_id_from_b58, peer_id_to_b58
from protocol.schema import ListOf, Str
from protocol.wire import Envelope, PeerHello

log = logging.getLogger("swarm.discovery")

MAX_SHARED_ADDRS = 32
MAX_HELLO_BYTES = 8 * 1024
MAX_ADDRS_FRAME = MAX_SHARED_ADDRS * 300 + 16
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
FLAP_WINDOW_S = 30.0
EXCHANGE_MAX_S = 60.0


def hello_protocol(run_id: str) -> str:
    """The hello protocol id of run `run_id`."""
    return HELLO.for_run(run_id).protocol


def peer_of_addr(addr: str) -> str | None:
    """The base58 peer id at the end of a `/p2p/<id>` multiaddr, or None."""
    if "/p2p/" not in addr:
        return None
    return addr.rsplit("/p2p/", 1)[1].strip("/") or None


@dataclass
class _Entry:
    addrs: list[str] = field(default_factory=list)
    failures: int = 0
    next_try: float = 0.0  # time.monotonic()
    last_error: str = ""
    hello: PeerHello | None = None
    last_success: float = -1e9
    flaps: int = 0


class AddressBook:
    """Known peers and how to reach them; bounded to `max_peers` entries (when full, a
    new entry replaces one that never worked; peers seen to work are never evicted)."""

    def __init__(self, own_peer: str, max_peers: int = 1000) -> None:
        self.own_peer = own_peer
        self.max_peers = max_peers
        self._peers: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def add(self, addr: str) -> str | None:
        """Remember one `/p2p/` multiaddr; returns its peer id (None if unusable)."""
        peer = peer_of_addr(addr)
        if peer is None or peer == self.own_peer or len(addr) > 256:
            return None
        try:
            peer_id_from_b58(peer)
        except Exception:
            return None
        entry = self._peers.get(peer)
        if entry is None:
            if len(self._peers) >= self.max_peers and not self._evict_one():
                return None
            entry = self._peers[peer] = _Entry()
        if addr not in entry.addrs:
            entry.addrs = [addr, *entry.addrs][:4]
        return peer

    def set_hello(self, peer: str, hello: PeerHello) -> None:
        """Keep `peer`'s hello and learn the listen addresses it announces."""
        for a in hello.listen_addrs:
            if a.endswith(f"/p2p/{peer}"):
                self.add(a)
            elif "/p2p/" not in a:
                self.add(f"{a}/p2p/{peer}")
        if peer in self._peers:
            self._peers[peer].hello = hello

    def _evict_one(self) -> bool:
        """Make room: forget the entry that never worked and failed most (the oldest of
        those first). Peers seen to work are kept, so peer exchange cannot flush them
        with made-up ids; False when every entry has worked."""
        never = [
            (e.failures, i, p)
            for i, (p, e) in enumerate(self._peers.items())
            if e.last_success < 0 and e.hello is None
        ]
        if not never:
            return False
        _, _, victim = max(never, key=lambda t: (t[0], -t[1]))
        del self._peers[victim]
        return True

    def known(self) -> list[str]:
        """Peers we hold an address for."""
        return [p for p, e in self._peers.items() if e.addrs]

    def addrs(self, peer: str) -> list[str]:
        """The addresses known for `peer`, the one to try first first."""
        entry = self._peers.get(peer)
        return list(entry.addrs) if entry else []

    def shareable(self, connected: list[str]) -> list[str]:
        """One address per connected peer, for peer exchange (at most `MAX_SHARED_ADDRS`)."""
        out: list[str] = []
        for peer in connected:
            out.extend(self.addrs(peer)[:1])
        return out[:MAX_SHARED_ADDRS]

    def due(self, connected: set[str], now: float) -> list[tuple[str, str]]:
        """(peer, addr) pairs to dial now: known, not connected, backoff over."""
        return [
            (peer, e.addrs[0])
            for peer, e in self._peers.items()
            if peer not in connected and e.addrs and e.next_try <= now
        ]

    def failed(self, peer: str, error: str, now: float) -> None:
        """A dial failed: back off (doubling) and try its next address next time."""
        e = self._peers.get(peer)
        if e is None:
            return
        e.failures += 1
        e.last_error = error
        e.next_try = now + min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** min(e.failures - 1, 10))
        if len(e.addrs) > 1:  # try the next address next time
            e.addrs = e.addrs[1:] + e.addrs[:1]

    def succeeded(self, peer: str, now: float) -> None:
        """A dial worked. A peer that keeps dropping us right after (a ban on their side)
        still backs off: a success within FLAP_WINDOW_S of the last one counts as a flap."""
        e = self._peers.get(peer)
        if e is None:
            return
        e.flaps = e.flaps + 1 if now - e.last_success < FLAP_WINDOW_S else 0
        e.last_success = now
        e.failures, e.last_error = 0, ""
        e.next_try = now + (
            min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** min(e.flaps, 10)) if e.flaps else 0.0
        )

    def roles(self, peer: str) -> tuple[str, ...]:
        """The roles `peer`'s hello announced (none before a hello)."""
        e = self._peers.get(peer)
        return e.hello.roles if e and e.hello else ()


ADDRS = MsgpackCodec(
    "peer list",
    ListOf(Str(256), MAX_SHARED_ADDRS),
    MAX_ADDRS_FRAME,
    limits={
        "max_str_len": 256,
        "max_array_len": MAX_SHARED_ADDRS,
        "max_bin_len": 0,
        "max_map_len": 0,
        "max_ext_len": 0,
    },
)
HELLO: ExchangeSpec[tuple[bytes, list[str]], tuple[bytes, list[str]]] = ExchangeSpec(
    name="hello",
    protocol="/swarm-rl/{run}/hello/1",
    request=Frames((Raw(MAX_HELLO_BYTES), ADDRS)),
    response=Frames((Raw(MAX_HELLO_BYTES), ADDRS)),
    bad_request="bad hello",
)


def encode_addrs(addrs: list[str]) -> bytes:
    """The peer-list frame: the first MAX_SHARED_ADDRS addresses of at most 256 chars."""
    (frame,) = ADDRS.encode([a for a in addrs if len(a) <= 256][:MAX_SHARED_ADDRS])
    return bytes(frame)


def decode_addrs(data: bytes) -> list[str]:
    """The addresses in a peer-list frame; `ValueError` if it is not one."""
    return list(ADDRS.decode((data,)))


def check_hello(data: bytes, peer: str, run_id: str) -> tuple[Envelope, PeerHello]:
    """Open a hello; raises `RemoteProtocolError` or `ValueError` with the reason."""
    env, hello = open_envelope(data, PeerHello)
    if peer_id_to_b58(env.signer) != peer:
        raise ValueError("hello signed by a different peer than the connection's")
    if env.run_id != run_id:
        raise ValueError(f"peer is in run {env.run_id!r}, not {run_id!r}")
    return env, hello


async def exchange_hello(
    stream: FramedStream, *, initiator: bool, own_hello: bytes, own_addrs: list[str], run_id: str
) -> tuple[PeerHello, list[str]]:
    """Run the hello exchange on `stream`; returns the remote's hello and shared addrs.

    Raises `PeerError` (IO), `RemoteProtocolError` or `ValueError` (bad hello).
    """

    spec = HELLO

    async def send() -> None:
        shared = [a for a in own_addrs if len(a) <= 256][:MAX_SHARED_ADDRS]
        await send_message(stream, spec.request, (own_hello, shared))

    async def receive() -> tuple[PeerHello, list[str]]:
        try:
            hello_bytes, addrs = await receive_message(stream, spec.response, BadMessage)
        except BadMessage as exc:
            raise ValueError(exc.problem) from None
        _, hello = check_hello(hello_bytes, stream.peer, run_id)
        return hello, list(addrs)

    if initiator:
        await send()
        return await receive()
    result = await receive()
    await send()
    return result


class Discovery:
    """Hello + peer exchange + redial for one host (see the module docstring).

    Resource handling: `redial_loop()` runs until cancelled. Error handling: every remote
    failure is caught per peer and recorded in the address book (`last_error`), never
    raised out of the loop.
    """

    def __init__(
        self,
        host: SwarmHost,
        run_id: str,
        make_hello: Callable[[], bytes],
        max_peers: int = 64,
        on_hello: Callable[[str, PeerHello], None] | None = None,
    ) -> None:
        self.host = host
        self.run_id = run_id
        self.book = AddressBook(host.peer_id)
        self._make_hello = make_hello
        self.max_peers = max_peers
        self._on_hello = on_hello
        self._greeted: set[str] = set()
        host.set_stream_handler(hello_protocol(run_id), self._serve_hello)

    async def _serve_hello(self, stream: FramedStream) -> None:
        try:
            hello, addrs = await exchange_hello(
                stream,
                initiator=False,
                own_hello=self._make_hello(),
                own_addrs=self.book.shareable(self.host.connected_peers()),
                run_id=self.run_id,
            )
        except (RemoteProtocolError, ValueError) as exc:
            await self.host.disconnect(stream.peer, f"bad hello: {exc}")
            return
        self._learn(stream.peer, hello, addrs)

    def _learn(self, peer: str, hello: PeerHello, addrs: list[str]) -> None:
        self._greeted.add(peer)
        self.book.set_hello(peer, hello)
        for a in addrs:
            self.book.add(a)
        if self._on_hello is not None:
            self._on_hello(peer, hello)

    async def greet(self, peer: str) -> str | None:
        """Open a hello stream to a connected peer; returns an error text or None."""
        try:
            stream = await self.host.open_stream(peer, hello_protocol(self.run_id))
            try:
                hello, addrs = await exchange_hello(
                    stream,
                    initiator=True,
                    own_hello=self._make_hello(),
                    own_addrs=self.book.shareable(self.host.connected_peers()),
                    run_id=self.run_id,
                )
            finally:
                await stream.close()
        except PeerError as exc:
            return str(exc)
        except (RemoteProtocolError, ValueError) as exc:
            await self.host.disconnect(peer, f"bad hello: {exc}")
            return f"bad hello: {exc}"
        self._learn(peer, hello, addrs)
        return None

    async def dial(self, addrs: list[str]) -> list[tuple[str, bool, str]]:
        """Dial `addrs` concurrently and greet each new peer; returns (addr, ok, error)."""
        for a in addrs:
            self.book.add(a)
        results = await self.host.connect_many(addrs)
        out: list[tuple[str, bool, str]] = []
        now = time.monotonic()
        greet: list[str] = []
        for r in results:
            if r.ok and r.peer:
                self.book.succeeded(r.peer, now)
                greet.append(r.peer)
            elif r.peer:
                self.book.failed(r.peer, r.error or "failed", now)
            out.append((r.addr, r.ok, r.error or ""))
        async with trio.open_nursery() as nursery:
            for peer in set(greet):
                if peer not in self._greeted:
                    nursery.start_soon(self.greet, peer)
        return out

    async def redial_loop(
        self, interval_s: float = 1.0, max_parallel: int = 8, exchange_every_s: float = 5.0
    ) -> None:
        """Forever: greet new inbound peers, re-exchange peer lists while below `max_peers`
        (every `exchange_every_s`; the gap doubles up to EXCHANGE_MAX_S while rounds teach
        us no new peer, and is reset when one does: each round is a stream and a signed
        hello per connected peer; a newcomer is greeted at once anyway, which exchanges
        lists with it, so a peer that keeps reconnecting does not reset the gap), and dial
        due known peers (at most `max_parallel` a round)."""
        last_exchange = time.monotonic()
        gap = exchange_every_s
        while True:
            connected = set(self.host.connected_peers())
            greet = connected - self._greeted
            exchange = len(connected) < self.max_peers and time.monotonic() - last_exchange > gap
            if exchange:
                last_exchange = time.monotonic()
                greet = connected  # ask everyone again: they may know peers we do not
            known = len(self.book)
            if greet:
                async with trio.open_nursery() as nursery:
                    for peer in list(greet)[: max_parallel * 4]:
                        self._greeted.add(peer)
                        nursery.start_soon(self.greet, peer)
            if exchange:
                gap = exchange_every_s if len(self.book) > known else min(2 * gap, EXCHANGE_MAX_S)
            self._greeted &= connected  # a peer that left is greeted again when it returns
            if len(connected) < self.max_peers:
                due = [
                    (p, a)
                    for p, a in self.book.due(connected, time.monotonic())
                    if not self.host.is_banned(p)
                ][:max_parallel]
                if due:
                    await self.dial([a for _, a in due])
            await trio.sleep(interval_s)
