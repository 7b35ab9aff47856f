"""The relay's per-IP reservation cap holds when the reservations from one IP arrive at
once: a request counts against its IP from the moment it is checked, not only after the
library has answered it."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

from node.host import relay


class FakeManager:
    """The resource manager's state the relay's reserve handler reads."""

    def __init__(self) -> None:
        self._reservations: dict[Any, object] = {}

    def _clean_expired(self) -> None:
        pass


class FakeMsg:
    def ClearField(self, _name: str) -> None:  # noqa: N802 - protobuf's name
        pass


class FakeConn:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id


class FakeStream:
    def __init__(self, peer_id: str, ip: str) -> None:
        self.muxed_conn = FakeConn(peer_id)
        self.ip = ip
        self.written: list[bytes] = []

    def get_remote_address(self) -> tuple[str, int]:
        return (self.ip, 4001)

    async def write(self, data: bytes) -> None:
        self.written.append(data)


async def test_concurrent_reservations_from_one_ip_stop_at_the_cap(monkeypatch) -> None:
    async def slow_library_reserve(self: Any, stream: FakeStream, _msg: Any) -> None:
        await trio.sleep(0.05)  # the library answers after a round trip
        self.resource_manager._reservations[stream.muxed_conn.peer_id] = object()

    monkeypatch.setattr(CircuitV2Protocol, "_handle_reserve", slow_library_reserve)
    proto = object.__new__(relay.CountingRelay)
    proto.resource_manager = FakeManager()  # type: ignore[assignment]
    proto._ips = {}
    proto._pending = {}
    proto.max_per_ip = 8
    async with trio.open_nursery() as nursery:
        for i in range(12):
            nursery.start_soon(proto._handle_reserve, FakeStream(f"peer{i}", "10.0.0.7"), FakeMsg())
    reserved = proto.resource_manager._reservations
    assert len(reserved) == 8
    # Another IP is not affected, and a refused peer can reserve once a slot frees.
    await proto._handle_reserve(FakeStream("other", "10.0.0.8"), FakeMsg())
    assert "other" in reserved
