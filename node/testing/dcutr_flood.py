"""py-libp2p's DCUtR handler against a network that counts dial attempts: for the DCUtR
tests of `node.host.libp2p_patches` and `bench reach --hostile`.

`flood_target(peers)` builds a `DCUtRProtocol` (the library's, patched by whatever patches
the process applied) on a stand-in host that reaches each of `peers` through a relay only;
every dial it makes is recorded by `CountingNetwork` and fails (a third party never
answers as the peer). `connect_stream(peer, addrs)` is a DCUtR stream from `peer` carrying
a CONNECT that lists `addrs`, then a SYNC. No sockets are opened.
"""

from __future__ import annotations

import types
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
from libp2p.utils.varint import encode_varint_prefixed
from multiaddr import Multiaddr

from protocol.identity import Identity

OUR_ADDR = "/ip4/10.9.9.9/tcp/4001"  # the stand-in host's own listen address


class Conn:
    """A connection as DCUtR reads it: its transport addresses."""

    def __init__(self, addr: str) -> None:
        self.addr = addr

    def get_transport_addresses(self) -> list[Multiaddr]:
        """The one address it was made with."""
        return [Multiaddr(self.addr)]


class CountingNetwork:
    """Every dial recorded with its (trio) time; none succeeds."""

    def __init__(self, connections: dict[ID, list[Conn]]) -> None:
        self.connections = connections
        self.dials: list[str] = []
        self.last: dict[str, float] = {}  # address -> when it was last dialled
        self.again_within_a_minute = 0  # dials to an address dialled less than 60 s before

    async def dial_addr(self, addr: Multiaddr, peer_id: ID, source: object = None) -> None:
        """Record the dial, then fail it."""
        now = trio.current_time()
        if now - self.last.get(str(addr), -1e9) < 60:
            self.again_within_a_minute += 1
        self.dials.append(str(addr))
        self.last[str(addr)] = now
        raise OSError("connection refused")

    dial_addr_as_responder = dial_addr


class Peerstore:
    """The addresses DCUtR stores and reads."""

    def __init__(self) -> None:
        self.stored: dict[ID, list[Multiaddr]] = {}

    def addrs(self, peer_id: ID) -> list[Multiaddr]:
        """What was stored for `peer_id`."""
        return list(self.stored.get(peer_id, []))

    def add_addrs(self, peer_id: ID, addrs: list[Multiaddr], ttl: int) -> None:
        """Store `addrs` (the TTL is not modelled)."""
        self.stored.setdefault(peer_id, []).extend(addrs)

    def peer_info(self, peer_id: ID) -> object:
        """No peer info: DCUtR skips the relay-address filter that needs it."""
        raise KeyError(peer_id)


class StandInHost:
    """What `DCUtRProtocol` reads of a host: its id, addresses, network and peerstore."""

    def __init__(self, network: CountingNetwork) -> None:
        self.network, self.peerstore = network, Peerstore()
        self.id = ID(b"\x00\x24" + bytes(36))

    def get_id(self) -> ID:
        """Our (all-zero) id."""
        return self.id

    def get_addrs(self) -> list[Multiaddr]:
        """Our one listen address."""
        return [Multiaddr(OUR_ADDR)]

    def get_network(self) -> CountingNetwork:
        """The counting network."""
        return self.network

    def get_peerstore(self) -> Peerstore:
        """The peerstore."""
        return self.peerstore


class ConnectStream:
    """A DCUtR stream from `peer`: its CONNECT listing `addrs`, then a SYNC."""

    def __init__(self, peer: ID, addrs: list[str]) -> None:
        connect, sync = HolePunch(), HolePunch()
        connect.type, sync.type = HolePunch.CONNECT, HolePunch.SYNC
        connect.ObsAddrs.extend(Multiaddr(a).to_bytes() for a in addrs)
        self.inbound = b"".join(
            encode_varint_prefixed(m.SerializeToString()) for m in (connect, sync)
        )
        self.muxed_conn = types.SimpleNamespace(peer_id=peer)

    async def read(self, n: int | None = None) -> bytes:
        """The next `n` bytes of the two messages."""
        size = len(self.inbound) if n is None else n
        out, self.inbound = self.inbound[:size], self.inbound[size:]
        return out

    async def write(self, data: bytes) -> None:
        """Our CONNECT answer, dropped."""
        return None

    async def close(self) -> None:
        """Nothing to close."""
        return None


def new_peer() -> ID:
    """A fresh peer id."""
    return ID.from_base58(Identity.generate().peer_id_b58)


def flood_target(peers: list[ID]) -> tuple[DCUtRProtocol, CountingNetwork]:
    """A DCUtR instance whose stand-in host reaches each of `peers` through a relay only."""
    relay = Identity.generate().peer_id_b58
    circuit = f"/ip4/203.0.113.1/tcp/4001/p2p/{relay}/p2p-circuit"
    network = CountingNetwork({p: [Conn(circuit)] for p in peers})
    host: Any = StandInHost(network)
    return DCUtRProtocol(host), network


def connect_stream(peer: ID, addrs: list[str]) -> Any:
    """A DCUtR stream from `peer` whose CONNECT lists `addrs` (typed for the handler)."""
    return ConnectStream(peer, addrs)
