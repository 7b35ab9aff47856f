"""Reservation requests at once from one IP to the relay's reservation handler
(`node.host.relay.CountingRelay`), with the library's own reserve step answering after a
round trip: for `bench reach --hostile` (tests/test_node_relay_ip_cap.py builds the same
stand-ins for its own case)."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

from node.host import relay

LIBRARY_ROUND_TRIP_S = 0.05


class _Manager:
    def __init__(self) -> None:
        self._reservations: dict[Any, object] = {}

    def _clean_expired(self) -> None:
        return None


class _Msg:
    def ClearField(self, _name: str) -> None:  # noqa: N802 - protobuf's name
        return None


class _Stream:
    def __init__(self, peer: str, ip: str) -> None:
        self.muxed_conn = type("Conn", (), {"peer_id": peer})()
        self.ip = ip

    def get_remote_address(self) -> tuple[str, int]:
        return (self.ip, 4001)

    async def write(self, _data: bytes) -> None:
        return None


async def _library_reserve(self: Any, stream: Any, _msg: Any) -> None:
    await trio.sleep(LIBRARY_ROUND_TRIP_S)
    self.resource_manager._reservations[stream.muxed_conn.peer_id] = object()


async def reservations_at_once(count: int, ip: str = "10.0.0.7") -> tuple[int, int]:
    """(slots granted, the per-IP cap) for `count` requests from `ip` at once. The
    library's reserve step is replaced for the duration of the call, then restored."""
    proto: Any = object.__new__(relay.CountingRelay)
    proto.resource_manager = _Manager()
    proto._ips, proto._pending = {}, {}
    cap = proto.max_per_ip = relay.RelayLimitsConfig().max_reservations_per_ip
    original = CircuitV2Protocol._handle_reserve
    CircuitV2Protocol._handle_reserve = _library_reserve  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(proto._handle_reserve, _Stream(f"peer{i}", ip), _Msg())
    finally:
        CircuitV2Protocol._handle_reserve = original  # type: ignore[method-assign]
    return len(proto.resource_manager._reservations), cap
