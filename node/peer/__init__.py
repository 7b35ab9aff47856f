"""One running peer of a run: the IO shell around `protocol.admission` and its drivers.

The code is organized as follows:

- `peer.py`: `Peer` and `open_peer()`: every event goes through admission, one executor
  carries out its actions.
- `ports.py`: the `typing.Protocol`s the drivers and roles are typed against (what they
  use of a peer), and `Handled`.
- `config.py`: `PeerConfig`, what a peer needs to join a run; envelope sequence numbers.
- `gossip.py`: per-run gossip topics and a paced outbox.
- `body_puller.py`: pulling rollout bodies (rules: `protocol.body_pull`).
- `services.py`: the body server, the catch-up driver and asking a peer to back a version.
- `upkeep.py`: periodic upkeep: ticks, saving scores, retention.
- `discovery.py`: bootstrap list, peer exchange and redial with backoff.
- `dropped_by.py`: peers that refuse this node.
- `run_service.py`: serving, pulling and adopting the run release.
- `nat_upkeep.py`: AutoNAT checks and relay slots when not reachable.
- `stats.py`: latency percentiles for status.
"""

from node.peer.body_puller import BodyPuller
from node.peer.config import PACE_MARGIN, PeerConfig, SeqCounter
from node.peer.discovery import AddressBook, Discovery
from node.peer.dropped_by import DroppedBy
from node.peer.gossip import BATCH_TOPICS, TOPIC_KINDS, Outbox, run_topics, topic_name
from node.peer.nat_upkeep import NatUpkeep
from node.peer.peer import Peer, open_peer
from node.peer.ports import (
    Admit,
    BadRequests,
    BodyWants,
    Deliveries,
    Handled,
    InferencePeer,
    Publisher,
    RelayPeer,
    Reporter,
    RunPeer,
    Spawn,
    TrainerPeer,
    ValidatorPeer,
    VersionView,
    WeightsView,
)
from node.peer.run_service import RunService
from node.peer.services import BodyServer, CatchUpDriver, ask_newest
from node.peer.stats import p99_ms, rtt_median_ms
from node.peer.upkeep import Upkeep

__all__ = [
    "BATCH_TOPICS",
    "PACE_MARGIN",
    "TOPIC_KINDS",
    "AddressBook",
    "Admit",
    "BadRequests",
    "BodyPuller",
    "BodyServer",
    "BodyWants",
    "CatchUpDriver",
    "Deliveries",
    "Discovery",
    "DroppedBy",
    "Handled",
    "InferencePeer",
    "NatUpkeep",
    "Outbox",
    "Peer",
    "PeerConfig",
    "Publisher",
    "RelayPeer",
    "Reporter",
    "RunPeer",
    "RunService",
    "SeqCounter",
    "Spawn",
    "TrainerPeer",
    "Upkeep",
    "ValidatorPeer",
    "VersionView",
    "WeightsView",
    "ask_newest",
    "open_peer",
    "p99_ms",
    "rtt_median_ms",
    "run_topics",
    "topic_name",
]
