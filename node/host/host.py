"""The one adapter over py-libp2p 0.8.1 + trio.

Its parts: `node.host.libp2p_patches` (process-wide patches of library internals, each listed
with the test that guards it), `node.host.framed_stream` (framed streams and the errors,
re-exported here), `node.host.limits`, `node.host.gossip`, `node.host.heartbeat`,
`node.host.listen` (mixins and helpers of `SwarmHost`), `node.host.goodbye` (telling a
refused peer why), `node.host.gossip_guard`, `node.host.relay` (circuit relay v2) and
`node.host.reachability` (AutoNAT, DCUtR).

What this module owns
---------------------
A `SwarmHost` is a running libp2p host (TCP + Noise + Yamux) with GossipSub attached,
an application heartbeat, framed request streams and bans. The rest of `node/` speaks
only bytes, base58 peer ids and text multiaddrs to it; nothing outside this file imports
`libp2p`.

The library defaults that bite, and what we do about each (DESIGN.md section 3); every
item has a test in `tests/test_node_host.py` that fails if the default comes back:

1. Plaintext security is offered unless told otherwise -> `sec_opt` is Noise only.
2. Mplex is slow -> Yamux only.
3. GossipSub spam protection drops > 10 msg/s per peer and topic (our own publishes
   too) -> `spam_protection_enabled=False`; our own per-peer rate rules live in
   `protocol/` admission instead.
4. Adaptive gossip stretches the heartbeat up to 30 s -> disabled, 1 s heartbeat.
5. The per-peer outbound queue holds 32 RPCs and drops when full -> `publish()` paces:
   it waits (bounded) until every live peer's queue is below `outbound_high_water`.
6. The subscription queue holds 32 messages and drops with a warning -> the module
   constant is raised before any subscribe and a reader task drains it at once.
7. A peer receives its own publishes -> filtered on the origin id.
8. Publishing before the remote joined our mesh reaches no one -> `publish()` waits
   (bounded) until every subscribed peer is in the topic mesh.
9. Messages over ~1 MiB are silently dropped -> `publish()` rejects anything over
   `max_gossip_bytes` with `MessageTooLarge`; framed streams cap every frame.
10. A SIGSTOPped peer blocks writes forever -> every dial, read, write and close here
    runs under a deadline, and an application heartbeat drops a peer that has not
    answered for `peer_dead_after_s`.
11. `connect()` takes ~250 ms -> `connect_many()` dials concurrently.
12. Leaving `host.run()` without `close()` leaks the listener; in-flight publishes at
    shutdown raise "Nursery is closed" -> `open_host()` refuses new publishes, drains
    the in-flight ones, then stops pubsub and calls `close()`.
13. A message id is (sender, seqno), the seqno starting at the clock in whole seconds: a
    restarted publisher reused ids receivers saw in the last 120 s (`seen_ttl`), dropped
    as "seen" -> the seqno starts at the clock in nanoseconds (`_seqno_start()`); the id
    function stays (the message cache that answers IWANT is hard-wired to it).
14. A peer restarted on a new port is dialed at its old address: the library dials only
    the first stored address of each transport, and a peer whose dial failed is refused
    for 60 s (negative cache) -> `connect()` replaces the peer's stored addresses with
    the one given and forgets a past failure.
15. A listen address that cannot be bound (port in use, address not on this machine)
    is logged and skipped: the host runs unreachable -> `open_host()` checks that every
    requested address got a listener and raises `ListenFailed` naming it and why.
17. Liveness used a private `/swarm-rl/ping/1`, so a standard peer (js-libp2p, Go) that
    answers only `/ipfs/ping/1.0.0` was dropped after `peer_dead_after_s` -> the
    heartbeat is the standard ping (32 random bytes echoed); identify said
    `py-libp2p/<version>` -> it says `swarm-node/<version>` (`AGENT`); GossipSub offered
    only `/meshsub/1.0.0` -> it offers 1.2, 1.1 and 1.0, the newest both sides speak wins.
18. Garbage GossipSub RPCs and ban races crashed the host; 16. listen sockets got
    SO_REUSEPORT; 19-21, 23, 24. per-frame and per-stream costs of Noise, Yamux and
    multistream-select -> patched in `node.host.libp2p_patches` (each item listed there with
    its test).
22. A reply of known size (a shard) started at Yamux's 256 KiB window and grew it one
    round trip at a time -> the asker grants the window it expects up front
    (`FramedStream.expect`).
25. Inbound slots leaked and the library refused at its cap -> patched (inbound slots), and
    connection limits in `node.host.limits`.

Resource handling: everything is owned by the `open_host()` context; on exit the port
is released and all tasks are gone. Error handling: remote misbehaviour and timeouts
surface as `PeerError` subclasses to the caller of the call that met them; background
tasks (heartbeat, stream handlers) turn them into peer events, never into crashes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p import create_yamux_muxer_option, new_host
from libp2p.abc import INotifee
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as _new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_PROTOCOL_ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from node.host import libp2p_patches
from node.host.framed_stream import (
    FramedStream,
    FrameTooLarge,
    HostClosed,
    HostError,
    ListenFailed,
    MessageTooLarge,
    PeerError,
    PeerTimeout,
    PeerUnreachable,
)
from node.host.goodbye import GOODBYE_PROTOCOL, Goodbyes
from node.host.gossip import GossipMessage, GossipMixin, Later, Validator
from node.host.gossip_guard import (
    ControlLimits,
    GuardedGossipSub,
    GuardedPubsub,
    Misbehaviour,
    new_budget,
)
from node.host.heartbeat import PING_PROTOCOL, HeartbeatMixin, LoopStalls
from node.host.libp2p_patches import AGENT
from node.host.limits import ConnectionLimitsMixin, IpGate, library_cap
from node.host.listen import explain, listen_failures, plain_listen_failed

log = logging.getLogger("swarm.host")

# The library's RPC limit is 1 MiB including protobuf framing, the signature and the key;
# 1,000,000 bytes of payload leaves room for all of it.
MAX_GOSSIP_BYTES = 1_000_000
# A body frame on a request stream: the largest wire object (a 4 MiB rollout body in its
# envelope) plus headroom.
MAX_FRAME_BYTES = 5 * 1024 * 1024
GOSSIPSUB_PROTOCOLS = [  # workaround 17: newest first
    TProtocol("/meshsub/1.2.0"),
    TProtocol("/meshsub/1.1.0"),
    GOSSIPSUB_PROTOCOL_ID,
]


@dataclass(frozen=True)
class HostSettings:
    """Knobs of the adapter; the defaults are what the node runs with."""

    dial_timeout_s: float = 5.0  # one connect(): TCP + Noise + Yamux + multiselect
    io_timeout_s: float = 10.0  # one framed read or write on a stream
    close_timeout_s: float = 2.0  # closing a stream or a connection
    heartbeat_interval_s: float = (
        1.0  # application ping period per peer (as network.heartbeat_interval_s)
    )
    peer_dead_after_s: float = 4.0  # no pong for this long: disconnect the peer
    gossip_degree: int = 6  # GossipSub D, D_low, D_high
    gossip_degree_low: int = 4
    gossip_degree_high: int = 12
    gossip_heartbeat_s: int = 1  # GossipSub heartbeat (the library default is 120 s)
    outbound_high_water: int = 16  # pace publishes while a live peer's queue is longer
    pace_max_wait_s: float = 2.0  # give up pacing on a peer after this (it drops it)
    mesh_wait_s: float = 2.0  # wait this long at most for subscribed peers to join the mesh
    max_gossip_bytes: int = MAX_GOSSIP_BYTES
    max_frame_bytes: int = MAX_FRAME_BYTES
    drain_timeout_s: float = 3.0  # shutdown: wait this long for in-flight publishes
    max_connections: int = 200  # all peers; past it the lowest-scored, least active goes
    max_connections_per_peer: int = 3  # a simultaneous dial needs 2
    max_connections_per_ip: int = 16  # inbound, counted from TCP accept (handshakes included)
    ip_limit_on_loopback: bool = False  # a local devnet runs every node on 127.0.0.1
    gossip_limits: ControlLimits = ControlLimits()  # per-peer GossipSub control budgets


@dataclass(frozen=True)
class DialResult:
    """The outcome of dialing one multiaddr."""

    addr: str
    ok: bool
    peer: str | None = None
    error: str | None = None
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class PeerEvent:
    """A change in the set of peers: connected, dropped (heartbeat), disconnected, banned;
    or "told": the peer said it refuses us (`node.host.goodbye`) until `until`."""

    kind: str
    peer: str
    reason: str = ""
    until: float = 0.0


def _short(peer: str) -> str:
    return peer[:12] + "..." if len(peer) > 12 else peer


StreamHandler = Callable[[FramedStream], Awaitable[None]]


def key_pair_from_private_bytes(private_bytes: bytes) -> KeyPair:
    """The libp2p Ed25519 key pair of our 32-byte identity seed (same peer id)."""
    if len(private_bytes) != 32:
        raise ValueError(f"an Ed25519 private key is 32 bytes, got {len(private_bytes)}")
    private = Ed25519PrivateKey.new(private_bytes)
    return KeyPair(private, private.get_public_key())


def _seqno_start() -> int:
    """The first GossipSub seqno of this process (workaround 13): the clock in nanoseconds,
    so a restarted publisher continues above every seqno it used before."""
    return time.time_ns()


@dataclass
class _PeerState:
    connected_at: float
    last_pong: float
    last_active: float = 0.0  # last application stream or gossip message, time.monotonic()
    rtt_s: float = math.nan
    dropping: bool = False


class _Notifee(INotifee):
    """Forwards connection events from the swarm into the `SwarmHost`."""

    def __init__(self, host: SwarmHost) -> None:
        self._host = host

    async def opened_stream(self, network: Any, stream: Any) -> None:
        return None

    async def closed_stream(self, network: Any, stream: Any) -> None:
        return None

    async def connected(self, network: Any, conn: Any) -> None:
        self._host._on_connected(conn.muxed_conn.peer_id, conn)

    async def disconnected(self, network: Any, conn: Any) -> None:
        self._host._on_disconnected(conn.muxed_conn.peer_id)

    async def listen(self, network: Any, multiaddr: Any) -> None:
        return None

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        return None


class SwarmHost(ConnectionLimitsMixin, GossipMixin, HeartbeatMixin):
    """A running peer: use `open_host()` to get one.

    Public surface: `peer_id`, `listen_addrs()`, `connect()`, `connect_many()`,
    `connected_peers()`, `subscribe()`, `publish()`, `set_stream_handler()`,
    `open_stream()`, `disconnect()`, `ban()`, `unban()`, `on_peer_event()`, `peer_rtt()`.
    """

    def __init__(self, private_bytes: bytes, settings: HostSettings) -> None:
        libp2p_patches.apply()
        self.settings = settings
        key_pair = key_pair_from_private_bytes(private_bytes)
        noise = NoiseTransport(key_pair, noise_privkey=_new_x25519_key_pair().private_key)
        self._lh = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},  # workaround 1: Noise only, no plaintext
            muxer_opt=create_yamux_muxer_option(),  # workaround 2: Yamux only
            negotiate_timeout=int(math.ceil(settings.dial_timeout_s)),
            # min_connections 0: no connection manager floor; its auto-connector (which
            # dials peerstore peers all the same) is switched off below (patch 26).
            # The library refuses at its own max_connections; ours sits below it so a
            # newcomer past our cap gets in and the worst connection makes room
            # (`_enforce_connection_limits`). Its pruner acts only above high_watermark,
            # which the library's cap never lets it reach.
            connection_config=ConnectionConfig(
                min_connections=0,
                low_watermark=0,
                high_watermark=library_cap(settings),
                max_connections=library_cap(settings),
                dial_timeout=settings.dial_timeout_s,
                connection_close_timeout=settings.close_timeout_s,
                inbound_upgrade_timeout=settings.dial_timeout_s,
                outbound_upgrade_timeout=settings.dial_timeout_s,
                outbound_stream_protocol_negotiation_timeout=settings.dial_timeout_s,
                inbound_stream_protocol_negotiation_timeout=settings.dial_timeout_s,
            ),
        )
        self._misbehaviour_listeners: list[Callable[[Misbehaviour], None]] = []
        budget = new_budget(settings.gossip_limits, self._report_misbehaviour)
        self._gossipsub = GuardedGossipSub(
            budget=budget,
            protocols=list(GOSSIPSUB_PROTOCOLS),  # workaround 17
            degree=settings.gossip_degree,
            degree_low=settings.gossip_degree_low,
            degree_high=settings.gossip_degree_high,
            heartbeat_interval=settings.gossip_heartbeat_s,  # workaround 4
            heartbeat_initial_delay=0.1,
            adaptive_gossip_enabled=False,  # workaround 4
            spam_protection_enabled=False,  # workaround 3
            prune_back_off=5,
            unsubscribe_back_off=2,
        )
        self._pubsub = GuardedPubsub(self._lh, self._gossipsub, strict_signing=True, budget=budget)
        self._pubsub.counter = _seqno_start()  # workaround 13
        self.peer_id: str = self._lh.get_id().to_base58()
        self._peers: dict[str, _PeerState] = {}
        self._banned: dict[str, float] = {}  # peer -> unban time (time.time())
        self._listeners: list[Callable[[PeerEvent], None]] = []
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._validators: dict[str, Validator] = {}
        self._pingers: set[str] = set()
        self._stalls = LoopStalls()  # our own loop's stalls do not count as a peer's silence
        self._scorer: Callable[[str], float] | None = None
        self._inbound_gate = IpGate(settings)
        self.goodbyes = Goodbyes(
            self,
            private_bytes,
            lambda peer, g: self._emit(PeerEvent("told", peer, g.reason, g.until)),
        )
        # Dials `/p2p-circuit` addresses (set by `node.host.relay.open_relay`).
        self.circuit_dialer: Callable[[str], Awaitable[DialResult]] | None = None
        libp2p_patches.no_auto_dials(self._lh.get_network())
        self._lh.get_network()._swarm_inbound_gate = self._inbound_gate

    # -- addresses and peers -------------------------------------------------------------

    def listen_addrs(self) -> list[str]:
        """Our dialable multiaddrs, each ending in `/p2p/<peer id>`."""
        return [str(a) for a in self._lh.get_addrs()]

    def connected_peers(self) -> list[str]:
        """Peers with a live connection that the heartbeat has not dropped."""
        return sorted(p for p, st in self._peers.items() if not st.dropping)

    def peer_rtt(self, peer: str) -> float:
        st = self._peers.get(peer)
        return st.rtt_s if st else math.nan

    def on_peer_event(self, callback: Callable[[PeerEvent], None]) -> None:
        """Register a synchronous callback for `PeerEvent`s (it must not block)."""
        self._listeners.append(callback)

    def on_misbehaviour(self, callback: Callable[[Misbehaviour], None]) -> None:
        """Register a synchronous callback for `Misbehaviour` notices: a peer exceeded a
        GossipSub control budget or sent an oversize RPC (`node.host.gossip_guard`). At most
        one per peer, reason and `gossip_limits.window_s`; the excess itself was already
        dropped. It must not block; what to do with the peer is the caller's decision."""
        self._misbehaviour_listeners.append(callback)

    def _report_misbehaviour(self, notice: Misbehaviour) -> None:
        for callback in list(self._misbehaviour_listeners):
            callback(notice)

    def _emit(self, event: PeerEvent) -> None:
        log.info("peer %s %s %s", event.kind, _short(event.peer), event.reason)
        for callback in list(self._listeners):
            callback(event)

    def banned_count(self) -> int:
        """Peers banned now."""
        now = time.time()
        return sum(1 for until in self._banned.values() if until > now)

    def is_banned(self, peer: str) -> bool:
        until = self._banned.get(peer)
        if until is None:
            return False
        if until <= time.time():
            del self._banned[peer]
            self._pubsub.remove_from_blacklist(ID.from_base58(peer))
            return False
        return True

    # -- connection events ---------------------------------------------------------------

    def _on_connected(self, pid: ID, conn: Any = None) -> None:
        if self._closing:
            return  # shutting down: the connection is closed with the network
        peer = pid.to_base58()
        if self.is_banned(peer):
            if self._nursery is not None:
                self._nursery.start_soon(
                    self.goodbyes.refuse, peer, self._banned[peer], self._close_peer
                )
            return
        if not self._enforce_connection_limits(peer, conn):
            return
        if peer in self._peers and not self._peers[peer].dropping:
            return
        now = time.monotonic()
        self._peers[peer] = _PeerState(connected_at=now, last_pong=now, last_active=now)
        if self._nursery is not None and peer not in self._pingers:
            self._nursery.start_soon(self._ping_loop, peer)
        self._emit(PeerEvent("connected", peer))

    def _on_disconnected(self, pid: ID) -> None:
        peer = pid.to_base58()
        if self._lh.get_network().get_connections(pid):
            return  # another connection to the same peer is still up
        state = self._peers.pop(peer, None)
        if state is not None and not state.dropping:
            self._emit(PeerEvent("disconnected", peer, "connection closed"))

    # -- dialing -------------------------------------------------------------------------

    async def connect(self, addr: str) -> DialResult:
        """Dial one `/ip4/.../tcp/.../p2p/<id>` multiaddr under `dial_timeout_s`; never raises
        for a remote failure (the result says what went wrong)."""
        self._check_open()
        if "/p2p-circuit" in addr and self.circuit_dialer is not None:
            return await self.circuit_dialer(addr)
        started = time.monotonic()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            return DialResult(addr, False, error=f"not a dialable /p2p/ multiaddr ({exc})")
        peer = info.peer_id.to_base58()
        if peer == self.peer_id:
            return DialResult(addr, False, peer, error="that is our own peer id")
        if self.is_banned(peer):
            return DialResult(addr, False, peer, error="peer is banned")
        self._forget_old_addrs(info.peer_id)
        try:
            with trio.fail_after(self.settings.dial_timeout_s):
                await self._lh.connect(info)
        except trio.TooSlowError:
            return DialResult(
                addr,
                False,
                peer,
                f"no answer within {self.settings.dial_timeout_s:g} s",
                time.monotonic() - started,
            )
        except trio.Cancelled:
            raise
        except Exception as exc:
            return DialResult(addr, False, peer, explain(exc), time.monotonic() - started)
        self._on_connected(info.peer_id)
        return DialResult(addr, True, peer, None, time.monotonic() - started)

    def _forget_old_addrs(self, pid: ID) -> None:
        """Workaround 14: dial the address given, not a stale one of an earlier run."""
        network = self._lh.get_network()
        if network.get_connections(pid):
            return  # connected: the library reuses the live connection
        with contextlib.suppress(Exception):
            self._lh.get_peerstore().clear_addrs(pid)
        negative = getattr(network, "_negative_peer_cache", None)
        if negative is not None:
            negative.evict(str(pid))

    async def connect_many(self, addrs: Sequence[str]) -> list[DialResult]:
        """Dial all `addrs` concurrently (workaround 11); results in the order given."""
        results: list[DialResult | None] = [None] * len(addrs)

        async def one(i: int, addr: str) -> None:
            results[i] = await self.connect(addr)

        async with trio.open_nursery() as nursery:
            for i, addr in enumerate(addrs):
                nursery.start_soon(one, i, addr)
        return [r for r in results if r is not None]

    async def disconnect(self, peer: str, reason: str = "") -> None:
        """Close every connection to `peer` (bounded by `close_timeout_s`)."""
        self._mark_dropping(peer, reason)
        await self.goodbyes.settled(peer)  # a peer being banned is told before it is closed
        await self._close_peer(peer)

    def _mark_dropping(self, peer: str, reason: str) -> None:
        """From now on `peer` counts as gone (its connections close in the background)."""
        state = self._peers.get(peer)
        if state is not None and not state.dropping:
            state.dropping = True
            self._emit(PeerEvent("dropped", peer, reason))

    async def _close_peer(self, peer: str) -> None:
        pid = ID.from_base58(peer)
        with trio.move_on_after(self.settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await self._lh.disconnect(pid)
        # If the close timed out (a frozen peer never acknowledges), forget it anyway:
        # the pubsub sender task for it is blocked, not us.
        with contextlib.suppress(Exception):
            self._lh.get_network().connections.pop(pid, None)
        self._peers.pop(peer, None)

    async def ban(self, peer: str, seconds: float, reason: str) -> None:
        """Refuse `peer` for `seconds`: disconnect now, reject its connections and messages."""
        self._banned[peer] = time.time() + seconds
        self._pubsub.add_to_blacklist(ID.from_base58(peer))
        self._emit(PeerEvent("banned", peer, reason))
        await self.goodbyes.say(peer, f"banned: {reason}", self._banned[peer])
        await self.disconnect(peer, f"banned: {reason}")

    def unban(self, peer: str) -> None:
        if self._banned.pop(peer, None) is not None:
            self._pubsub.remove_from_blacklist(ID.from_base58(peer))

    # -- streams -------------------------------------------------------------------------

    def set_stream_handler(self, protocol: str, handler: StreamHandler) -> None:
        """Serve `protocol`: `handler(stream)` runs per inbound stream; its `PeerError`s end
        the stream, anything else propagates (a bug of ours must not be swallowed)."""

        async def wrapped(raw: Any) -> None:
            peer = raw.muxed_conn.peer_id.to_base58()
            framed = FramedStream(raw, peer, self.settings)
            if self._closing or self.is_banned(peer):
                await framed.reset()
                return
            self._touch(peer)
            try:
                await handler(framed)
            except PeerError as exc:
                log.info("stream %s from %s ended: %s", protocol, _short(peer), exc)
            finally:
                await framed.close()

        self._lh.set_stream_handler(TProtocol(protocol), wrapped)

    async def open_stream(self, peer: str, protocol: str) -> FramedStream:
        """Open a stream to a connected (or known) peer under `dial_timeout_s`."""
        self._check_open()
        try:
            with trio.fail_after(self.settings.dial_timeout_s):
                raw = await self._lh.new_stream(ID.from_base58(peer), [TProtocol(protocol)])
        except trio.TooSlowError:
            raise PeerTimeout(
                peer, f"opening {protocol} took over {self.settings.dial_timeout_s:g} s"
            ) from None
        except trio.Cancelled:
            raise
        except Exception as exc:
            raise PeerUnreachable(peer, f"cannot open {protocol}: {exc}") from exc
        self._touch(peer)
        return FramedStream(raw, peer, self.settings)

    def _check_open(self) -> None:
        if self._closing:
            raise HostClosed("the host is shutting down")

    async def _drain(self) -> None:
        """Refuse new work, wait (bounded) for in-flight publishes, then let queues flush."""
        self._closing = True
        with trio.move_on_after(self.settings.drain_timeout_s):
            await self._idle.wait()
            # Give the per-peer sender tasks a moment to write what is queued.
            while any(len(q) for q in self._pubsub.peer_queues.values()):
                await trio.sleep(0.02)


@contextlib.asynccontextmanager
async def open_host(
    private_bytes: bytes,
    listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
    settings: HostSettings | None = None,
) -> AsyncIterator[SwarmHost]:
    """Start a host listening on `listen`; on exit drain, stop pubsub, and close the host
    so the port is released (workaround 12)."""
    settings = settings or HostSettings()
    host = SwarmHost(private_bytes, settings)
    try:
        addrs = [multiaddr.Multiaddr(a) for a in listen]
    except Exception as exc:
        raise ValueError(f"bad listen multiaddr in {list(listen)}: {exc}") from exc
    lh = host._lh
    lh.get_network().register_notifee(_Notifee(host))
    lh.set_stream_handler(PING_PROTOCOL, host._handle_ping)
    host.set_stream_handler(GOODBYE_PROTOCOL, host.goodbyes.serve)
    async with plain_listen_failed(), lh.run(addrs):
        try:
            failures = listen_failures(addrs, lh.get_addrs())
            if failures:
                raise ListenFailed("; ".join(failures))
            async with background_trio_service(host._pubsub):
                async with background_trio_service(host._gossipsub):
                    await host._pubsub.wait_until_ready()
                    try:
                        async with trio.open_nursery() as nursery:
                            host._nursery = nursery
                            nursery.start_soon(host._stalls.run)
                            try:
                                yield host
                            finally:
                                with trio.CancelScope(shield=True):
                                    await host._drain()
                                nursery.cancel_scope.cancel()
                    finally:
                        # Close the network while pubsub still runs: a message arriving
                        # after the pubsub service stopped crashes the library's inbound
                        # handler ("Nursery is closed to new arrivals").
                        with trio.CancelScope(shield=True):
                            with trio.move_on_after(settings.close_timeout_s * 2):
                                await lh.close()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(settings.close_timeout_s * 2):
                    await lh.close()  # idempotent; covers a failure before the inner close


__all__ = [
    "AGENT",
    "DialResult",
    "FrameTooLarge",
    "FramedStream",
    "GossipMessage",
    "HostClosed",
    "HostError",
    "HostSettings",
    "Later",
    "ListenFailed",
    "MessageTooLarge",
    "Misbehaviour",
    "PeerError",
    "PeerEvent",
    "PeerTimeout",
    "PeerUnreachable",
    "SwarmHost",
    "Validator",
    "key_pair_from_private_bytes",
    "open_host",
]
