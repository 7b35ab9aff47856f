"""Connection limits of the `node.host.host` adapter: total, per peer and per IP.

The library refuses new connections at its own `max_connections`; ours sits below it
(`library_cap`) so a newcomer past our cap still gets in and the worst connection makes
room: the lowest-scored peer (`set_connection_scorer`), then the least recently active,
then the oldest. A newcomer scored below everyone is the one that goes (told so, and to
try again after `CAP_TRY_AGAIN_S`: `node.host.goodbye`). A peer keeps at
most `max_connections_per_peer` connections (its newest go); one IP at most
`max_connections_per_ip` inbound connections, counted from TCP accept to close by the
inbound handler (`node.host.libp2p_patches` patch 25) through `IpGate`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from libp2p.peer.id import ID

if TYPE_CHECKING:
    from node.host.goodbye import Goodbyes
    from node.host.host import HostSettings

log = logging.getLogger("swarm.host")

CAP_TRY_AGAIN_S = 60.0  # what a newcomer refused at the cap is told: try again after this


def _short(peer: str) -> str:
    return peer[:12] + "..." if len(peer) > 12 else peer


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

    def _exempt(self, ip: str | None) -> bool:
        if ip is None:
            return True
        if self._loopback:
            return False
        return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1")

    def admit(self, ip: str | None) -> bool:
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
        if self._exempt(ip):
            return
        assert ip is not None
        left = self.counts.get(ip, 0) - 1
        if left > 0:
            self.counts[ip] = left
        else:
            self.counts.pop(ip, None)


class ConnectionLimitsMixin:
    """The `SwarmHost` side of the limits (the attributes are the host's)."""

    settings: HostSettings
    _lh: Any
    _nursery: trio.Nursery | None
    _peers: dict[str, Any]
    _scorer: Callable[[str], float] | None
    goodbyes: Goodbyes

    async def _close_peer(self, peer: str) -> None: ...  # the host's

    async def disconnect(self, peer: str, reason: str = "") -> None: ...  # the host's

    def _mark_dropping(self, peer: str, reason: str) -> None: ...  # the host's

    def set_connection_scorer(self, scorer: Callable[[str], float] | None) -> None:
        """`scorer(peer) -> float` (higher is better, synchronous, cheap): at the connection
        cap the lowest-scored peer is disconnected first, then the least recently active.
        Without one every peer scores 0."""
        self._scorer = scorer

    def _touch(self, peer: str) -> None:
        state = self._peers.get(peer)
        if state is not None:
            state.last_active = time.monotonic()

    def _score(self, peer: str) -> float:
        if self._scorer is None:
            return 0.0
        try:
            return float(self._scorer(peer))
        except Exception:  # a scorer bug must not take the host down
            log.exception("connection scorer failed for %s", _short(peer))
            return 0.0

    def _enforce_connection_limits(self, peer: str, conn: Any) -> bool:
        """Apply the per-peer and total caps to a connection just opened; False if it was
        the one closed (the newest of a peer over its cap, or the worst-ranked newcomer)."""
        network = self._lh.get_network()
        s = self.settings
        nursery = self._nursery
        if nursery is None:
            return True
        conns = network.get_connections(ID.from_base58(peer))
        if len(conns) > s.max_connections_per_peer:
            conns.sort(key=lambda c: getattr(c, "_created_at", 0.0))
            extra = conns[s.max_connections_per_peer :]
            log.info(
                "closing %d connection(s) of %s: over %d per peer",
                len(extra),
                _short(peer),
                s.max_connections_per_peer,
            )
            for c in extra:
                nursery.start_soon(self._close_conn, c)
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
        ranked = sorted(
            (p for p, st in self._peers.items() if not st.dropping and p != peer),
            key=lambda p: (self._score(p), self._peers[p].last_active, self._peers[p].connected_at),
        )
        if self._score(peer) < min((self._score(p) for p in ranked[:1]), default=math.inf):
            log.info("refusing %s: at the connection cap and scored lowest", _short(peer))
            self._mark_dropping(peer, "connection cap: scored lowest")
            nursery.start_soon(
                self.goodbyes.refuse,
                peer,
                time.time() + CAP_TRY_AGAIN_S,
                self._close_peer,
                "at its connection cap, and we scored lowest",
            )
            return False
        for victim in ranked[:over]:
            self._mark_dropping(victim, f"connection cap ({s.max_connections}): making room")
            nursery.start_soon(self._close_peer, victim)
        return True

    async def _close_conn(self, conn: Any) -> None:
        with trio.move_on_after(self.settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await conn.close()
