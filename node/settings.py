"""The settings objects of the node's components, built from the configuration tree.

`node.config.NodeConfig` is what the operator wrote (file and flags); this module turns it
into what each component takes: `HostSettings` (the libp2p adapter), `WeightSettings`
(policy versions), `RelayLimitsConfig` (the relay service), `AdmissionConfig` and the
`PeerConfig` that carries them all. Call sites use these functions instead of copying keys
by hand. It imports the host (libp2p): commands import it only when they run.
"""

from __future__ import annotations

from pathlib import Path

from node.config import NodeConfig
from node.host.host import HostSettings
from node.host.relay import RelayLimitsConfig
from node.peer.config import PeerConfig
from node.weights.sync import WeightSettings
from protocol.admission import AdmissionConfig
from protocol.identity import Identity
from protocol.wire import RunManifest

MIB = 2**20


def host_settings(cfg: NodeConfig) -> HostSettings:
    """The libp2p adapter's timeouts, heartbeat and gossip message cap from `[network]`."""
    net = cfg.network
    return HostSettings(
        dial_timeout_s=net.dial_timeout_s,
        io_timeout_s=net.io_timeout_s,
        heartbeat_interval_s=net.heartbeat_interval_s,
        peer_dead_after_s=net.heartbeat_timeout_s,
        max_gossip_bytes=net.max_message_bytes,
    )


def weight_settings(cfg: NodeConfig) -> WeightSettings:
    """Upload cap, largest version accepted and shard size from `[network]` and `[weights]`."""
    return WeightSettings(
        upload_limit_mib_s=cfg.network.upload_limit_mib_s,
        max_version_bytes=int(cfg.weights.max_version_mib * MIB),
        shard_bytes=int(cfg.weights.shard_mib * MIB),
    )


def relay_limits(cfg: NodeConfig) -> RelayLimitsConfig:
    """The relay service's limits from `[relay]`."""
    r = cfg.relay
    return RelayLimitsConfig(
        max_reservations=r.max_reservations,
        max_reservations_per_ip=r.max_reservations_per_ip,
        max_circuits_per_peer=r.max_circuits_per_peer,
        max_circuit_bytes=r.max_circuit_bytes,
        max_circuit_s=r.max_circuit_s,
        reservation_ttl_s=r.reservation_ttl_s,
    )


def admission_config(role: str) -> AdmissionConfig:
    """Admission limits for a role. The trainer knows which versions exist: a rollout of any
    other costs its signer."""
    return AdmissionConfig(publishes_versions=role == "trainer")


def peer_config(
    cfg: NodeConfig,
    *,
    manifest: RunManifest,
    identity: Identity,
    data_dir: Path,
    listen: tuple[str, ...],
    bootstrap: tuple[str, ...],
    pull_bodies: bool,
) -> PeerConfig:
    """The peer's configuration for `cfg.node.role`: the run, the identity, where it keeps
    its data and the addresses it was given, with every component's settings from `cfg`."""
    role = cfg.node.role
    return PeerConfig(
        manifest=manifest,
        identity=identity,
        data_dir=data_dir,
        roles=(role,),
        listen=listen,
        bootstrap=bootstrap,
        pull_bodies=pull_bodies,
        publish_rate_per_s=cfg.network.publish_rate_per_s,
        max_peers=cfg.network.max_peers,
        header_batch=cfg.network.header_batch,
        admission=admission_config(role),
        host=host_settings(cfg),
        weights=weight_settings(cfg),
        store_max_bytes=cfg.store.max_bytes,
        relay=relay_limits(cfg),
    )
