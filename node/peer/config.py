"""What a peer needs to join a run (`PeerConfig`), and its envelope sequence numbers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from node.host.host import HostSettings
from node.host.relay import RelayLimitsConfig
from node.weights.sync import WeightSettings
from protocol import body_pull as bp
from protocol.admission import AdmissionConfig
from protocol.identity import Identity
from protocol.wire import MAX_HEADER_BATCH, RunManifest

PACE_MARGIN = 0.8  # share of the peers' per-producer rate and burst a node publishes at


@dataclass(frozen=True)
class PeerConfig:
    """What a peer needs to join a run."""

    manifest: RunManifest
    identity: Identity
    data_dir: Path
    roles: tuple[str, ...]
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: tuple[str, ...] = ()
    pull_bodies: bool = True
    publish_rate_per_s: float = 8.0
    max_peers: int = 64
    policy_version: int = 0
    host: HostSettings = field(default_factory=HostSettings)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    weights: WeightSettings = field(default_factory=WeightSettings)
    pull: bp.PullConfig = field(default_factory=bp.PullConfig)
    header_batch: int = MAX_HEADER_BATCH // 2  # headers per gossip message at most (1: no batching)
    store_max_bytes: int | None = None  # the store prunes to stay under it (node.store.retention)
    drain_timeout_s: float = 15.0  # at stop: publish queued headers/verdicts for this long at most
    relay: RelayLimitsConfig = field(
        default_factory=RelayLimitsConfig
    )  # the relay service's (role relay)


class SeqCounter:
    """Envelope sequence numbers for one signer: dense (+1 per message), so receivers'
    `ReplayGuard` window (the last 4096 numbers) tolerates gossip reordering, and starting
    at `start_s * 4096` (start time in seconds), so a restarted peer continues above what it
    used before as long as it averaged under 4096 messages per second."""

    PER_SECOND = 4096

    def __init__(self, start_s: float | None = None) -> None:
        self._last = int(time.time() if start_s is None else start_s) * self.PER_SECOND

    def next(self) -> int:
        """The next sequence number."""
        self._last += 1
        return self._last
