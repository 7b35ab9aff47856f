"""Connection limits of the `node.host.host` adapter: total, per peer and per IP.

The library refuses new connections at its own `max_connections`; ours sits below it
(`library_cap`) so a newcomer past our cap still gets in and the worst connection makes
room: the lowest-scored peer (`set_connection_scorer`), then the least recently active,
then the oldest. A newcomer scored below everyone is the one that goes (told so, and to
try again after `CAP_TRY_AGAIN_S`: `node.host.goodbye`). A peer keeps at
most `max_connections_per_peer` connections (its newest go); one IP at most
`max_connections_per_ip` inbound connections, counted from TCP accept to close by the
inbound handler (`node.host.libp2p_patches.release_inbound_slots_on_close`) through
`IpGate`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio
from libp2p.peer.id import ID

from node.host.peers import PeerTable, short
from node.host.settings import HostSettings

log = logging.getLogger("swarm.host")

CAP_TRY_AGAIN_S = 60.0  # what a newcomer refused at the cap is told: try again after this


def library_cap(settings: HostSettings) -> int:
    """The library's own connection cap (and inbound slots): ours plus room for the
    newcomers that make the worst connection go and for handshakes under way."""
    return settings.max_connections + max(8, settings.max_connections // 4)


class IpGate:
    """Inbound connections per remote IP, counted from TCP accept to close (the
    inbound handler's lifetime, `node.host.libp2p_patches`); over the cap the socket is
    closed before any handshake."""

    def __init__(self, settings: HostSettings) -> None:
        self._cap = settings.max_connections_per_ip
        self._loopback = settings.ip_limit_on_loopback
        self.counts: dict[str, int] = {}
        self.refused = 0

    def _exempt(self, ip: str | None) -> bool:  # loopback, unless counted on purpose
        if ip is None:
            return True
        if self._loopback:
            return False
        return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1")

    def admit(self, ip: str | None) -> bool:
        """Count one more inbound connection from `ip`; False (counted as refused) at the cap."""
        if self._exempt(ip):
            return True
        assert ip is not None
        if self.counts.get(ip, 0) >= self._cap:
            self.refused += 1
            log.info("refusing an inbound connection from %s: %d open from it", ip, self._cap)
            return False
        self.counts[ip] = self.counts.get(ip, 0) + 1
        return True

    def release(self, ip: str | None) -> None:
        """An inbound connection from `ip` ended."""
        if self._exempt(ip):
            return
        assert ip is not None
        left = self.counts.get(ip, 0) - 1
        if left > 0:
            self.counts[ip] = left
        else:
            self.counts.pop(ip, None)


class LimitsHost(Protocol):
    """What the connection limits call back on the host."""

    @property
    def running(self) -> bool: ...

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...

    def mark_dropping(self, peer: str, reason: str) -> None: ...

    async def close_peer(self, peer: str) -> None: ...


class Refuser(Protocol):
    """Tells a refused peer why, then closes it (`node.host.goodbye.Goodbyes`)."""

    async def refuse(
        self, peer: str, until: float, close: Callable[[str], Awaitable[None]], reason: str = ""
    ) -> None: ...


class ConnectionLimits:
    """The per-peer and total connection caps of one host, applied to each connection
    just opened (`enforce`); the IP cap is `IpGate`'s. `network` is the py-libp2p swarm."""

    def __init__(
        self,
        settings: HostSettings,
        network: Any,
        peers: PeerTable,
        host: LimitsHost,
        refuser: Refuser,
    ) -> None:
        self.settings = settings
        self._network = network
        self._peers = peers
        self._host = host
        self._refuser = refuser
        self._scorer: Callable[[str], float] | None = None

    def set_scorer(self, scorer: Callable[[str], float] | None) -> None:
        """`scorer(peer) -> float` (higher is better, synchronous, cheap): at the connection
        cap the lowest-scored peer is disconnected first, then the least recently active.
        Without one every peer scores 0."""
        self._scorer = scorer

    def _score(self, peer: str) -> float:
        if self._scorer is None:
            return 0.0
        try:
            return float(self._scorer(peer))
        except Exception:  # a scorer bug must not take the host down
            log.exception("connection scorer failed for %s", short(peer))
            return 0.0

    def enforce(self, peer: str, conn: Any) -> bool:
        """Apply the per-peer and total caps to a connection just opened; False if it was
        the one closed (the newest of a peer over its cap, or the worst-ranked newcomer).
        Does nothing before the host runs (no task can be started yet)."""
        host = self._host
        if not host.running:
            return True
        network = self._network
        s = self.settings
        conns = network.get_connections(ID.from_base58(peer))
        if len(conns) > s.max_connections_per_peer:
            conns.sort(key=lambda c: getattr(c, "_created_at", 0.0))
            extra = conns[s.max_connections_per_peer :]
            log.info(
                "closing %d connection(s) of %s: over %d per peer",
                len(extra),
                short(peer),
                s.max_connections_per_peer,
            )
            for c in extra:
                host.spawn(self._close_conn, c)
            if conn is not None and any(c is conn for c in extra):
                return False
        # Connections of peers already on their way out do not count: otherwise every
        # newcomer arriving while earlier evictions are still closing evicts again.
        closing = sum(
            len(network.get_connections(ID.from_base58(p)))
            for p, st in self._peers.items()
            if st.dropping
        )
        over = len(network.get_connections()) - closing - s.max_connections
        if over <= 0:
            return True
        states = dict(self._peers.items())
        ranked = sorted(
            (p for p, st in states.items() if not st.dropping and p != peer),
            key=lambda p: (self._score(p), states[p].last_active, states[p].connected_at),
        )
        if self._score(peer) < min((self._score(p) for p in ranked[:1]), default=math.inf):
            log.info("refusing %s: at the connection cap and scored lowest", short(peer))
            host.mark_dropping(peer, "connection cap: scored lowest")
            host.spawn(
                self._refuser.refuse,
                peer,
                time.time() + CAP_TRY_AGAIN_S,
                host.close_peer,
                "at its connection cap, and we scored lowest",
            )
            return False
        for victim in ranked[:over]:
            host.mark_dropping(victim, f"connection cap ({s.max_connections}): making room")
            host.spawn(host.close_peer, victim)
        return True

    async def _close_conn(self, conn: Any) -> None:
        with trio.move_on_after(self.settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await conn.close()
