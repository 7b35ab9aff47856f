"""`HostSettings`: the knobs of the libp2p adapter, and the size caps they default to.

Imports nothing of the adapter but `gossip_guard`'s `ControlLimits`, so every part of
`node.host` can take its settings without importing `node.host.host`.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.host.gossip_guard import ControlLimits

# The library's RPC limit is 1 MiB including protobuf framing, the signature and the key;
# 1,000,000 bytes of payload leaves room for all of it.
MAX_GOSSIP_BYTES = 1_000_000
# A body frame on a request stream: the largest wire object (a 4 MiB rollout body in its
# envelope) plus headroom.
MAX_FRAME_BYTES = 5 * 1024 * 1024


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
