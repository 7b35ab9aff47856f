"""The one adapter over py-libp2p 0.8.1 + trio: `SwarmHost` and `open_host()`.

What this module owns
---------------------
A `SwarmHost` is a running libp2p host (TCP + Noise + Yamux) with GossipSub attached,
an application heartbeat, framed request streams and bans. The rest of `node/` speaks
only bytes, base58 peer ids and text multiaddrs to it; nothing outside `node.host`
imports `libp2p`. The host owns its parts and passes each the collaborators it needs:
a `PeerTable` (`node.host.peers`), `Gossip` (`node.host.gossip`), `Heartbeat`
(`node.host.heartbeat`), `ConnectionLimits` and `IpGate` (`node.host.limits`) and
`Goodbyes` (`node.host.goodbye`).

The library defaults that bite, and what we do about each (DESIGN.md section 3); each
has a test in `tests/test_node_host.py` that fails if the default comes back:

- Plaintext security is offered unless told otherwise -> `sec_opt` is Noise only.
- Mplex is slow -> Yamux only.
- GossipSub spam protection drops > 10 msg/s per peer and topic (our own publishes
  too) -> `spam_protection_enabled=False`; our own per-peer rate rules live in
  `protocol/` admission instead.
- Adaptive gossip stretches the heartbeat up to 30 s -> disabled, 1 s heartbeat.
- Queues, self-delivery, publishing before the mesh formed, and oversize messages ->
  `node.host.gossip` (paced, filtered, mesh-waited, size-checked publishing).
- A SIGSTOPped peer blocks writes forever -> every dial, read, write and close here
  runs under a deadline, and the heartbeat (`node.host.heartbeat`) drops a peer that has
  not answered for `peer_dead_after_s`.
- A dial takes several round trips (TCP, Noise, Yamux, multistream-select) ->
  `connect_many()` dials concurrently.
- Leaving `host.run()` without `close()` leaks the listener; in-flight publishes at
  shutdown raise "Nursery is closed" -> `open_host()` refuses new publishes, drains
  the in-flight ones, then stops pubsub and calls `close()`.
- A message id is (sender, seqno), the seqno starting at the clock in whole seconds: a
  restarted publisher reused ids receivers saw in the last 120 s (`seen_ttl`), dropped
  as "seen" -> the seqno starts at the clock in nanoseconds (`seqno_start()`); the id
  function stays (the message cache that answers IWANT is hard-wired to it).
- A peer restarted on a new port is dialed at its old address: the library dials only
  the first stored address of each transport, and a peer whose dial failed is refused
  for 60 s (negative cache) -> `connect()` replaces the peer's stored addresses with
  the one given and forgets a past failure.
- A listen address that cannot be bound (port in use, address not on this machine)
  is logged and skipped: the host runs unreachable -> `open_host()` checks that every
  requested address got a listener and raises `ListenFailed` naming it and why.
- GossipSub offered only `/meshsub/1.0.0` -> it offers 1.2, 1.1 and 1.0
  (`GOSSIPSUB_PROTOCOLS`), the newest both sides speak wins.
- Garbage GossipSub RPCs and ban races crash the library's pubsub -> `GuardedPubsub`
  (`node.host.gossip_guard`).
- A reply of known size (a shard) started at Yamux's 256 KiB window and grew it one
  round trip at a time -> the asker grants the window it expects up front
  (`FramedStream.expect`).
- The rest (listen ports, identify's agent, per-frame and per-stream costs of Noise,
  Yamux and multistream-select, inbound slots, the auto-connector, oversize RPC
  reports) -> the named patches of `node.host.libp2p_patches`.

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
from node.host.gossip import Gossip, GossipMessage, Later, Validator
from node.host.gossip_guard import (
    GuardedGossipSub,
    GuardedPubsub,
    Misbehaviour,
    new_budget,
)
from node.host.heartbeat import PING_PROTOCOL, Heartbeat
from node.host.libp2p_patches import AGENT, no_auto_dials, set_inbound_gate
from node.host.libp2p_patches import apply as apply_patches
from node.host.limits import ConnectionLimits, IpGate, library_cap
from node.host.listen import explain, listen_failures, plain_listen_failed
from node.host.peers import PeerTable, short
from node.host.settings import MAX_FRAME_BYTES, MAX_GOSSIP_BYTES, HostSettings

MAX_OPENED_REMEMBERED = 4096  # peers whose newest connection time is kept
log = logging.getLogger("swarm.host")

GOSSIPSUB_PROTOCOLS = [  # newest first: the newest both sides speak wins
    TProtocol("/meshsub/1.2.0"),
    TProtocol("/meshsub/1.1.0"),
    GOSSIPSUB_PROTOCOL_ID,
]


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


StreamHandler = Callable[[FramedStream], Awaitable[None]]


def key_pair_from_private_bytes(private_bytes: bytes) -> KeyPair:
    """The libp2p Ed25519 key pair of our 32-byte identity seed (same peer id)."""
    if len(private_bytes) != 32:
        raise ValueError(f"an Ed25519 private key is 32 bytes, got {len(private_bytes)}")
    private = Ed25519PrivateKey.new(private_bytes)
    return KeyPair(private, private.get_public_key())


def seqno_start() -> int:
    """The first GossipSub seqno of this process: the clock in nanoseconds, so a restarted
    publisher continues above every seqno it used before (message ids stay unique)."""
    return time.time_ns()


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


class SwarmHost:
    """A running peer: use `open_host()` to get one.

    Public surface: `peer_id`, `listen_addrs()`, `connect()`, `connect_many()`,
    `connected_peers()`, `subscribe()`, `publish()`, `topic_peers()`,
    `set_stream_handler()`, `open_stream()`, `disconnect()`, `ban()`, `unban()`,
    `on_peer_event()`, `on_misbehaviour()`, `peer_rtt()`, `peer_protocols()`,
    `peer_addrs()`, `connection_count()`, `set_connection_scorer()`.

    Its parts, each given only what it needs: `peers` (the `PeerTable`), `gossip`,
    `heartbeat`, `limits` (connection caps), `inbound_gate` (per-IP cap) and `goodbyes`.
    """

    def __init__(self, private_bytes: bytes, settings: HostSettings) -> None:
        apply_patches()
        self.settings = settings
        key_pair = key_pair_from_private_bytes(private_bytes)
        noise = NoiseTransport(key_pair, noise_privkey=_new_x25519_key_pair().private_key)
        self._lh = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only, no plaintext
            muxer_opt=create_yamux_muxer_option(),  # Yamux only
            negotiate_timeout=int(math.ceil(settings.dial_timeout_s)),
            # min_connections 0: no connection manager floor; its auto-connector (which
            # dials peerstore peers all the same) is switched off below (`no_auto_dials`).
            # The library refuses at its own max_connections; ours sits below it so a
            # newcomer past our cap gets in and the worst connection makes room
            # (`ConnectionLimits.enforce`). Its pruner acts only above high_watermark,
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
        budget = new_budget(settings.gossip_limits, self.report_misbehaviour)
        self._gossipsub = GuardedGossipSub(
            budget=budget,
            protocols=list(GOSSIPSUB_PROTOCOLS),
            degree=settings.gossip_degree,
            degree_low=settings.gossip_degree_low,
            degree_high=settings.gossip_degree_high,
            heartbeat_interval=settings.gossip_heartbeat_s,
            heartbeat_initial_delay=0.1,
            adaptive_gossip_enabled=False,
            spam_protection_enabled=False,
            prune_back_off=5,
            unsubscribe_back_off=2,
        )
        self._pubsub = GuardedPubsub(self._lh, self._gossipsub, strict_signing=True, budget=budget)
        self._pubsub.counter = seqno_start()
        self.peer_id: str = self._lh.get_id().to_base58()
        self._banned: dict[str, float] = {}  # peer -> unban time (time.time())
        self._listeners: list[Callable[[PeerEvent], None]] = []
        self._nursery: trio.Nursery | None = None
        self._closing = False
        # peer -> trio time its newest connection opened (bounded: the oldest forgotten)
        self._opened: dict[str, float] = {}
        network = self._lh.get_network()
        self.peers = PeerTable()
        self.inbound_gate = IpGate(settings)
        self.goodbyes = Goodbyes(
            self,
            private_bytes,
            lambda peer, g: self._emit(PeerEvent("told", peer, g.reason, g.until)),
        )
        self.gossip = Gossip(
            settings, self._lh.get_id(), self._pubsub, self._gossipsub, self.peers, self
        )
        self.heartbeat = Heartbeat(settings, self._lh, self.peers, self)
        self.limits = ConnectionLimits(settings, network, self.peers, self, self.goodbyes)
        # Dials `/p2p-circuit` addresses (set by `node.host.relay.open_relay`).
        self.circuit_dialer: Callable[[str], Awaitable[DialResult]] | None = None
        no_auto_dials(network)
        set_inbound_gate(network, self.inbound_gate)

    # -- state shared with the parts -----------------------------------------------------

    @property
    def libp2p(self) -> Any:
        """The py-libp2p host underneath, for the adapter's own modules (relay,
        reachability, identify); nothing outside `node.host` uses it."""
        return self._lh

    @property
    def closing(self) -> bool:
        """True once shutdown began: no new publishes, dials or streams."""
        return self._closing

    @property
    def running(self) -> bool:
        """True once `open_host()` started the host's tasks."""
        return self._nursery is not None

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start `fn(*args)` in the host's nursery (the host must be running)."""
        assert self._nursery is not None, "the host is not running"
        self._nursery.start_soon(fn, *args)

    def check_open(self) -> None:
        """Raise `HostClosed` once shutdown began."""
        if self._closing:
            raise HostClosed("the host is shutting down")

    # -- addresses and peers -------------------------------------------------------------

    def listen_addrs(self) -> list[str]:
        """Our dialable multiaddrs, each ending in `/p2p/<peer id>`."""
        return [str(a) for a in self._lh.get_addrs()]

    def connected_peers(self) -> list[str]:
        """Peers with a live connection that the heartbeat has not dropped."""
        return self.peers.live()

    def peer_rtt(self, peer: str) -> float:
        """The last heartbeat round trip to `peer` in seconds, NaN when none."""
        return self.peers.rtt(peer)

    def peer_protocols(self, peer: str) -> list[str]:
        """The protocols `peer` announced (identify), empty when it told us none."""
        try:
            return [str(p) for p in self._lh.get_peerstore().get_protocols(ID.from_base58(peer))]
        except Exception:  # an unknown or malformed peer id: nothing announced
            return []

    def peer_addrs(self, peer: str) -> list[str]:
        """The addresses stored for `peer` (without its `/p2p/` part), empty when none."""
        try:
            return [str(a) for a in self._lh.get_peerstore().addrs(ID.from_base58(peer))]
        except Exception:  # an unknown or malformed peer id: no addresses
            return []

    def connection_count(self) -> int:
        """Open connections, all peers together (a peer may hold several)."""
        return len(self._lh.get_network().get_connections())

    def on_peer_event(self, callback: Callable[[PeerEvent], None]) -> None:
        """Register a synchronous callback for `PeerEvent`s (it must not block)."""
        self._listeners.append(callback)

    def on_misbehaviour(self, callback: Callable[[Misbehaviour], None]) -> None:
        """Register a synchronous callback for `Misbehaviour` notices: a peer exceeded a
        GossipSub control budget or sent an oversize RPC (`node.host.gossip_guard`). At most
        one per peer, reason and `gossip_limits.window_s`; the excess itself was already
        dropped. It must not block; what to do with the peer is the caller's decision."""
        self._misbehaviour_listeners.append(callback)

    def set_connection_scorer(self, scorer: Callable[[str], float] | None) -> None:
        """`scorer(peer) -> float` (higher is better, synchronous, cheap): at the connection
        cap the lowest-scored peer is disconnected first, then the least recently active.
        Without one every peer scores 0."""
        self.limits.set_scorer(scorer)

    def report_misbehaviour(self, notice: Misbehaviour) -> None:
        """Hand `notice` to every `on_misbehaviour` callback (the host's own guards, and
        its protocols such as DCUtR, report through here)."""
        for callback in list(self._misbehaviour_listeners):
            callback(notice)

    def _emit(self, event: PeerEvent) -> None:
        log.info("peer %s %s %s", event.kind, short(event.peer), event.reason)
        for callback in list(self._listeners):
            callback(event)

    def banned_count(self) -> int:
        """Peers banned now."""
        now = time.time()
        return sum(1 for until in self._banned.values() if until > now)

    def is_banned(self, peer: str) -> bool:
        """Whether `peer` is banned now (an expired ban is lifted here)."""
        until = self._banned.get(peer)
        if until is None:
            return False
        if until <= time.time():
            del self._banned[peer]
            self._pubsub.remove_from_blacklist(ID.from_base58(peer))
            return False
        return True

    # -- gossip --------------------------------------------------------------------------

    async def subscribe(
        self, topic: str, validator: Validator | None = None
    ) -> trio.MemoryReceiveChannel[GossipMessage]:
        """Join `topic`; returns a channel of other peers' messages (`Gossip.subscribe`)."""
        return await self.gossip.subscribe(topic, validator)

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish `data` on `topic`, size-checked, mesh-waited and paced (`Gossip.publish`)."""
        await self.gossip.publish(topic, data)

    def topic_peers(self, topic: str) -> list[str]:
        """Live peers that told us they subscribe to `topic`."""
        return self.gossip.topic_peers(topic)

    async def wait_for_topic_peers(self, topic: str, n: int, timeout_s: float) -> int:
        """Wait (bounded) until at least `n` live peers subscribe to `topic`; returns the count."""
        return await self.gossip.wait_for_topic_peers(topic, n, timeout_s)

    # -- connection events ---------------------------------------------------------------

    def adopt_connection(self, peer: str) -> None:
        """A connection to `peer` opened outside `connect()` (a relayed dial): count it
        as connected, as the swarm's own notice would."""
        self._on_connected(ID.from_base58(peer))

    def connection_opened_at(self, peer: str) -> float | None:
        """When (trio time) the newest connection with `peer` opened, None when unknown:
        a connection it opened while we were not dialling it proves it reached us
        (AutoNAT's dial-back, `node.host.reachability`)."""
        return self._opened.get(peer)

    def _on_connected(self, pid: ID, conn: Any = None) -> None:
        if self._closing:
            return  # shutting down: the connection is closed with the network
        peer = pid.to_base58()
        self._opened.pop(peer, None)
        self._opened[peer] = trio.current_time()
        while len(self._opened) > MAX_OPENED_REMEMBERED:
            del self._opened[next(iter(self._opened))]
        if self.is_banned(peer):
            if self._nursery is not None:
                self._nursery.start_soon(
                    self.goodbyes.refuse, peer, self._banned[peer], self.close_peer
                )
            return
        if not self.limits.enforce(peer, conn):
            return
        state = self.peers.get(peer)
        if state is not None and not state.dropping:
            return
        self.peers.add(peer)
        if self._nursery is not None and not self.heartbeat.pinging(peer):
            self._nursery.start_soon(self.heartbeat.ping_loop, peer)
        self._emit(PeerEvent("connected", peer))

    def _on_disconnected(self, pid: ID) -> None:
        peer = pid.to_base58()
        if self._lh.get_network().get_connections(pid):
            return  # another connection to the same peer is still up
        state = self.peers.pop(peer)
        if state is not None and not state.dropping:
            self._emit(PeerEvent("disconnected", peer, "connection closed"))

    # -- dialing -------------------------------------------------------------------------

    async def connect(self, addr: str) -> DialResult:
        """Dial one `/ip4/.../tcp/.../p2p/<id>` multiaddr under `dial_timeout_s`; never raises
        for a remote failure (the result says what went wrong)."""
        self.check_open()
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
        """Dial the address given, not a stale one of an earlier run: drop the peer's
        stored addresses and its negative-cache entry unless it is connected."""
        network = self._lh.get_network()
        if network.get_connections(pid):
            return  # connected: the library reuses the live connection
        with contextlib.suppress(Exception):
            self._lh.get_peerstore().clear_addrs(pid)
        negative = getattr(network, "_negative_peer_cache", None)
        if negative is not None:
            negative.evict(str(pid))

    async def connect_many(self, addrs: Sequence[str]) -> list[DialResult]:
        """Dial all `addrs` concurrently; results in the order given."""
        results: list[DialResult | None] = [None] * len(addrs)

        async def one(i: int, addr: str) -> None:
            results[i] = await self.connect(addr)

        async with trio.open_nursery() as nursery:
            for i, addr in enumerate(addrs):
                nursery.start_soon(one, i, addr)
        return [r for r in results if r is not None]

    async def disconnect(self, peer: str, reason: str = "") -> None:
        """Close every connection to `peer` (bounded by `close_timeout_s`)."""
        self.mark_dropping(peer, reason)
        await self.goodbyes.settled(peer)  # a peer being banned is told before it is closed
        await self.close_peer(peer)

    def mark_dropping(self, peer: str, reason: str) -> None:
        """From now on `peer` counts as gone (its connections close in the background)."""
        if self.peers.mark_dropping(peer):
            self._emit(PeerEvent("dropped", peer, reason))

    async def close_peer(self, peer: str) -> None:
        """Close `peer`'s connections now (bounded) and forget it, without a goodbye."""
        pid = ID.from_base58(peer)
        with trio.move_on_after(self.settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await self._lh.disconnect(pid)
        # If the close timed out (a frozen peer never acknowledges), forget it anyway:
        # the pubsub sender task for it is blocked, not us.
        with contextlib.suppress(Exception):
            self._lh.get_network().connections.pop(pid, None)
        self.peers.pop(peer)

    async def ban(self, peer: str, seconds: float, reason: str) -> None:
        """Refuse `peer` for `seconds`: disconnect now, reject its connections and messages."""
        self._banned[peer] = time.time() + seconds
        self._pubsub.add_to_blacklist(ID.from_base58(peer))
        self._emit(PeerEvent("banned", peer, reason))
        await self.goodbyes.say(peer, f"banned: {reason}", self._banned[peer])
        await self.disconnect(peer, f"banned: {reason}")

    def unban(self, peer: str) -> None:
        """Lift a ban on `peer` now (nothing happens when it is not banned)."""
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
            self.peers.touch(peer)
            try:
                await handler(framed)
            except PeerError as exc:
                log.info("stream %s from %s ended: %s", protocol, short(peer), exc)
            finally:
                await framed.close()

        self._lh.set_stream_handler(TProtocol(protocol), wrapped)

    async def open_stream(self, peer: str, protocol: str) -> FramedStream:
        """Open a stream to a connected (or known) peer under `dial_timeout_s`."""
        self.check_open()
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
        self.peers.touch(peer)
        return FramedStream(raw, peer, self.settings)

    async def _drain(self) -> None:
        """Refuse new work, wait (bounded) for in-flight publishes, then let queues flush."""
        self._closing = True
        with trio.move_on_after(self.settings.drain_timeout_s):
            await self.gossip.wait_idle()


def _shielded(seconds: float) -> trio.CancelScope:
    """A cancel scope that outer cancellation cannot reach, ending after `seconds`."""
    scope = trio.move_on_after(seconds)
    scope.shield = True
    return scope


@contextlib.asynccontextmanager
async def open_host(
    private_bytes: bytes,
    listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
    settings: HostSettings | None = None,
) -> AsyncIterator[SwarmHost]:
    """Start a host listening on `listen`; on exit drain, stop pubsub, and close the host
    so the port is released."""
    settings = settings or HostSettings()
    host = SwarmHost(private_bytes, settings)
    try:
        addrs = [multiaddr.Multiaddr(a) for a in listen]
    except Exception as exc:
        raise ValueError(f"bad listen multiaddr in {list(listen)}: {exc}") from exc
    lh = host._lh
    lh.get_network().register_notifee(_Notifee(host))
    lh.set_stream_handler(PING_PROTOCOL, host.heartbeat.handle_ping)
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
                            nursery.start_soon(host.heartbeat.stalls.run)
                            try:
                                yield host
                            finally:
                                with _shielded(math.inf):
                                    await host._drain()
                                nursery.cancel_scope.cancel()
                    finally:
                        # Close the network while pubsub still runs: a message arriving
                        # after the pubsub service stopped crashes the library's inbound
                        # handler ("Nursery is closed to new arrivals").
                        with _shielded(settings.close_timeout_s * 2):
                            await lh.close()
        finally:
            with _shielded(settings.close_timeout_s * 2):
                await lh.close()  # idempotent; covers a failure before the inner close


__all__ = [
    "AGENT",
    "MAX_FRAME_BYTES",
    "MAX_GOSSIP_BYTES",
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
