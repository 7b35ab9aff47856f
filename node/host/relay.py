"""Circuit relay v2 on a `SwarmHost`: the relay service (hop) with limits, and the client
side (reserve a slot, dial through a relay, accept relayed connections).

Both sides run py-libp2p 0.8.1's `CircuitV2Protocol` and `CircuitV2Transport`; what we
add and why:

- `CountingRelay`: the library keeps no count of the bytes it relays (its per-reservation
  `data_used` is not updated when a circuit-wide budget is set), so the hop service
  counts what it forwards for status and metrics (`relayed_bytes`).
- The library's swarm drops `/p2p-circuit` addresses from `connect()` (it assumes no relay
  transport), so a relayed dial goes through `CircuitV2Transport.dial` directly
  (`dial_relayed`); the connection it returns is registered with the swarm like any other.
- Limits (`RelayLimitsConfig`) map onto the library's `RelayLimits`: reservations (all
  peers; one per peer id, a refresh keeps the same one), circuits per reserved peer,
  bytes and seconds per circuit. At its reservation cap the library answers
  RESOURCE_LIMIT_EXCEEDED and keeps every existing reservation
  (`tests/test_node_nat.py` pins it). Library gaps closed in `CountingRelay`: a
  reservation request could name any peer id, a slot outlived its peer's connection, and
  one IP address could take every slot with fresh identities (now at most
  `max_reservations_per_ip`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
from libp2p.relay.circuit_v2.resources import RelayLimits, RelayResourceManager
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.tools.anyio_service import background_trio_service

from node.host.framed_stream import PeerError, PeerUnreachable
from node.host.host import DialResult

if TYPE_CHECKING:
    from node.host.host import SwarmHost

log = logging.getLogger("swarm.relay")

RELAY_HOP_PROTOCOL = str(HOP_PROTOCOL)


@dataclass(frozen=True)
class RelayLimitsConfig:
    """What one relay grants; the defaults are what `--role relay` runs with."""

    max_reservations: int = 128  # peers holding a slot at once (one slot per peer id)
    max_reservations_per_ip: int = 8  # of those, from one IP address
    max_circuits_per_peer: int = 8  # live circuits to one reserved peer
    max_circuit_bytes: int = 256 * 1024 * 1024  # both directions of one circuit
    max_circuit_s: int = 1800  # one circuit's lifetime
    reservation_ttl_s: int = 3600  # a slot lasts this long unless refreshed

    def check(self) -> None:
        """Raise `ValueError` naming the first limit below 1."""
        for name in (
            "max_reservations",
            "max_reservations_per_ip",
            "max_circuits_per_peer",
            "max_circuit_bytes",
            "max_circuit_s",
            "reservation_ttl_s",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"relay limit {name} must be at least 1, got {getattr(self, name)}"
                )

    def library_limits(self) -> RelayLimits:
        """These limits as py-libp2p's `RelayLimits`."""
        return RelayLimits(
            duration=self.max_circuit_s,
            data=self.max_circuit_bytes,
            max_circuit_conns=self.max_circuits_per_peer,
            max_reservations=self.max_reservations,
            reservation_ttl=self.reservation_ttl_s,
        )


class _ConnectedOnlyReservations(RelayResourceManager):
    """The library counts a reservation against the cap until its TTL even after its peer
    left (identities that connect, reserve and leave would fill the relay for an hour);
    the spec holds a reservation valid only while its peer stays connected."""

    def _clean_expired(self) -> None:
        super()._clean_expired()
        for peer_id in [p for p in self._reservations if not self._is_peer_connected(p)]:
            del self._reservations[peer_id]


class CountingRelay(CircuitV2Protocol):
    """The library's relay protocol, counting the bytes it forwards between circuit ends,
    with reservations only for the peer on the connection and only while it is connected."""

    relayed_bytes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resource_manager = _ConnectedOnlyReservations(self.limits, self.host)
        self._ips: dict[ID, str] = {}  # reserved peer -> the IP it reserved from
        self._pending: dict[str, int] = {}  # IP -> its requests the library is answering

    max_per_ip = 8  # set by RelayEndpoint from RelayLimitsConfig

    async def _handle_reserve(self, stream: Any, msg: Any) -> None:
        # The library reserves for the id in the request's optional `peer` field: one
        # connection could take slots for any number of made-up ids.
        msg.ClearField("peer")
        peer = stream.muxed_conn.peer_id
        ip = _remote_ip(stream)
        manager = self.resource_manager
        manager._clean_expired()
        counted = ip is not None and peer not in manager._reservations
        if ip is not None and counted:
            # Requests still being answered count too: checked and recorded before the
            # library's await, so concurrent requests from one IP cannot pass the cap together.
            from_ip = sum(1 for p in manager._reservations if self._ips.get(p) == ip)
            if from_ip + self._pending.get(ip, 0) >= self.max_per_ip:
                await write_delimited_msg(
                    stream,
                    HopMessage(
                        type=HopMessage.STATUS,
                        status=to_proto_status(StatusCode.RESOURCE_LIMIT_EXCEEDED),
                    ),
                )
                return
            self._pending[ip] = self._pending.get(ip, 0) + 1
        try:
            await super()._handle_reserve(stream, msg)
        finally:
            if ip is not None and counted:
                left = self._pending.get(ip, 1) - 1
                if left > 0:
                    self._pending[ip] = left
                else:
                    self._pending.pop(ip, None)
            if peer in manager._reservations and ip is not None:
                self._ips[peer] = ip
            for gone in [p for p in self._ips if p not in manager._reservations]:
                del self._ips[gone]

    async def _read_stream_with_retry(self, stream: Any, *args: Any, **kwargs: Any) -> bytes | None:
        data = await super()._read_stream_with_retry(stream, *args, **kwargs)
        if data:
            self.relayed_bytes += len(data)
        return data


class RelayEndpoint:
    """Circuit relay v2 on one host: always the client side (reserve, dial, accept);
    the hop service too when `serve` limits are given."""

    def __init__(self, host: SwarmHost, serve: RelayLimitsConfig | None) -> None:
        if serve is not None:
            serve.check()
        self._host = host
        limits = (serve or RelayLimitsConfig()).library_limits()
        self.protocol = CountingRelay(host.libp2p, limits=limits, allow_hop=serve is not None)
        self.protocol.max_per_ip = (serve or RelayLimitsConfig()).max_reservations_per_ip
        roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if serve else RelayRole(0))
        self.transport = CircuitV2Transport(
            host.libp2p, self.protocol, RelayConfig(roles=roles, limits=limits)
        )
        self.serving = serve is not None
        self.reservations: dict[str, str] = {}  # relay peer id -> our relayed address there
        self._nursery: trio.Nursery | None = None

    # -- the hop service -------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Status and metrics fields: what this host relays for others and where it is
        reachable through relays."""
        manager = self.protocol.resource_manager
        live = [r for pid, r in list(manager._reservations.items()) if manager.get_reservation(pid)]
        return {
            "relay_serving": self.serving,
            "relay_reservations": len(live) if self.serving else 0,
            "relay_circuits": sum(r.active_connections for r in live) if self.serving else 0,
            "relay_bytes": self.protocol.relayed_bytes,
            "relayed_addrs": sorted(self.reservations.values()),
        }

    # -- the client side -------------------------------------------------------------------

    async def reserve(self, relay_addr: str, timeout_s: float = 10.0) -> str:
        """Connect to the relay at `relay_addr` (`.../p2p/<id>`), take a slot, and return our
        relayed address through it. Raises `RelayRefused` with the relay's answer."""
        result = await self._host.connect(relay_addr)
        if not result.ok or result.peer is None:
            raise PeerUnreachable(result.peer or relay_addr, f"relay not reachable: {result.error}")
        relay = ID.from_base58(result.peer)
        try:
            with trio.fail_after(timeout_s):
                stream = await self._host.libp2p.new_stream(relay, [TProtocol(RELAY_HOP_PROTOCOL)])
                try:
                    assert self._nursery is not None, "RelayEndpoint not started"
                    ok = await self.transport.reserve(stream, relay, self._nursery)
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()
        except trio.TooSlowError:
            raise RelayRefused(
                result.peer, f"no reservation answer within {timeout_s:g} s"
            ) from None
        except RelayRefused:
            raise
        except Exception as exc:
            raise RelayRefused(result.peer, f"reservation failed: {exc}") from exc
        if not ok:
            raise RelayRefused(
                result.peer, "the relay refused the reservation (at its limits or not a relay)"
            )
        base = relay_addr.split("/p2p/")[0]
        addr = f"{base}/p2p/{result.peer}/p2p-circuit/p2p/{self._host.peer_id}"
        self.reservations[result.peer] = addr
        return addr

    async def dial_relayed(self, circuit_addr: str, timeout_s: float = 10.0) -> str:
        """Open a connection to the peer behind `circuit_addr`
        (`<relay addr>/p2p/<relay>/p2p-circuit/p2p/<peer>`) through the relay; returns its id."""
        try:
            maddr = multiaddr.Multiaddr(circuit_addr)
            peer = circuit_addr.rsplit("/p2p/", 1)[1]
        except Exception as exc:
            raise ValueError(
                f"not a /p2p-circuit/p2p/<id> multiaddr: {circuit_addr!r} ({exc})"
            ) from exc
        try:
            with trio.fail_after(timeout_s):
                await self.transport.dial(maddr)
        except trio.TooSlowError:
            raise PeerUnreachable(peer, f"no relayed connection within {timeout_s:g} s") from None
        except trio.Cancelled:
            raise
        except Exception as exc:
            raise PeerUnreachable(peer, f"relayed dial failed: {exc}") from exc
        self._host.adopt_connection(peer)
        return peer

    async def dial_result(self, circuit_addr: str) -> DialResult:
        """`SwarmHost.connect` for a `/p2p-circuit` address: never raises for a remote failure."""
        started = time.monotonic()
        peer = circuit_addr.rsplit("/p2p/", 1)[-1]
        if peer == self._host.peer_id:
            return DialResult(circuit_addr, False, peer, "that is our own peer id")
        if self._host.is_banned(peer):
            return DialResult(circuit_addr, False, peer, "peer is banned")
        try:
            peer = await self.dial_relayed(circuit_addr, self._host.settings.dial_timeout_s * 2)
        except (PeerError, ValueError) as exc:
            return DialResult(circuit_addr, False, peer, str(exc), time.monotonic() - started)
        return DialResult(circuit_addr, True, peer, None, time.monotonic() - started)


class RelayRefused(Exception):
    """A relay answered a reservation with a refusal (or not at all)."""

    def __init__(self, relay: str, reason: str) -> None:
        super().__init__(f"relay {relay[:12]}...: {reason}")
        self.relay = relay
        self.reason = reason


def _remote_ip(stream: Any) -> str | None:
    with contextlib.suppress(Exception):
        addr = stream.get_remote_address()
        if addr:
            return str(addr[0])
    return None


def connection_kinds(host: SwarmHost) -> dict[str, str]:
    """Each connected peer -> "direct" when at least one of its connections is a plain
    transport connection, else "relayed"."""
    kinds: dict[str, str] = {}
    for pid, conns in list(host.libp2p.get_network().connections.items()):
        conns = conns if isinstance(conns, list) else [conns]
        if not conns:
            continue
        kinds[pid.to_base58()] = "direct" if any(not _is_relayed(c) for c in conns) else "relayed"
    return kinds


def _is_relayed(conn: Any) -> bool:
    with contextlib.suppress(Exception):
        return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses())
    return False


@contextlib.asynccontextmanager
async def open_relay(
    host: SwarmHost, serve: RelayLimitsConfig | None = None
) -> AsyncIterator[RelayEndpoint]:
    """Run circuit relay v2 on `host` (hop service too when `serve` is given) until exit."""
    endpoint = RelayEndpoint(host, serve)
    host.circuit_dialer = endpoint.dial_result
    async with background_trio_service(endpoint.protocol):
        async with trio.open_nursery() as nursery:
            endpoint._nursery = nursery
            try:
                yield endpoint
            finally:
                host.circuit_dialer = None
                nursery.cancel_scope.cancel()
