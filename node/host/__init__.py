"""The libp2p adapter: the only package that imports py-libp2p.

The code is organized as follows:

- `host.py`: `SwarmHost` and `open_host()`, a running libp2p host (TCP + Noise + Yamux) with
  GossipSub, bans and framed request streams, composed of the parts below.
- `settings.py`: `HostSettings`, the adapter's knobs, and the size caps.
- `peers.py`: `PeerTable`, the live peers and what the host knows of each.
- `framed_stream.py`: length-prefixed frames over a libp2p stream, and the adapter's errors.
- `gossip.py`: `Gossip`, subscribe with validators, size-checked and paced publishing.
- `gossip_guard.py`: GossipSub control traffic limited per peer; garbage RPCs survived.
- `heartbeat.py`: `Heartbeat`, the application ping and event-loop stall tracking.
- `limits.py`: `ConnectionLimits` (total and per peer) and `IpGate` (per IP).
- `listen.py`: listen-address checks and failure explanations.
- `goodbye.py`: telling a refused peer why, and hearing that a peer refuses us.
- `identify.py`: what a peer tells us over libp2p identify.
- `relay.py`: circuit relay v2, the service with limits and the client.
- `reachability.py`: AutoNAT dial-back and DCUtR hole punching.
- `libp2p_patches.py`: the named patches of py-libp2p 0.8.1 internals, applied once.

Importing this package imports py-libp2p (every name below comes from a module that does).
"""

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
from node.host.goodbye import GOODBYE_PROTOCOL, Goodbye, Goodbyes
from node.host.gossip import Gossip, GossipMessage, Later, Validator
from node.host.gossip_guard import ControlLimits, Misbehaviour
from node.host.heartbeat import Heartbeat, LoopStalls
from node.host.host import (
    AGENT,
    DialResult,
    PeerEvent,
    SwarmHost,
    key_pair_from_private_bytes,
    open_host,
)
from node.host.identify import Identified, observed_addr
from node.host.libp2p_patches import PatchError
from node.host.limits import ConnectionLimits, IpGate
from node.host.peers import PeerState, PeerTable
from node.host.reachability import Reachability, open_reachability
from node.host.relay import RelayEndpoint, RelayLimitsConfig, RelayRefused, open_relay
from node.host.settings import MAX_FRAME_BYTES, MAX_GOSSIP_BYTES, HostSettings

__all__ = [
    "AGENT",
    "GOODBYE_PROTOCOL",
    "MAX_FRAME_BYTES",
    "MAX_GOSSIP_BYTES",
    "ConnectionLimits",
    "ControlLimits",
    "DialResult",
    "FrameTooLarge",
    "FramedStream",
    "Goodbye",
    "Goodbyes",
    "Gossip",
    "GossipMessage",
    "Heartbeat",
    "HostClosed",
    "HostError",
    "HostSettings",
    "Identified",
    "IpGate",
    "Later",
    "ListenFailed",
    "LoopStalls",
    "MessageTooLarge",
    "Misbehaviour",
    "PatchError",
    "PeerError",
    "PeerEvent",
    "PeerState",
    "PeerTable",
    "PeerTimeout",
    "PeerUnreachable",
    "Reachability",
    "RelayEndpoint",
    "RelayLimitsConfig",
    "RelayRefused",
    "SwarmHost",
    "Validator",
    "key_pair_from_private_bytes",
    "observed_addr",
    "open_host",
    "open_reachability",
    "open_relay",
]
