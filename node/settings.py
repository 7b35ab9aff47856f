"""The settings objects of the node's components, built from the configuration tree.

`node.config.NodeConfig` is what the operator wrote (file and flags); this module turns it
into what each component takes: `HostSettings` (the libp2p adapter), `WeightSettings`
(policy versions), `RelayLimitsConfig` (the relay service), `AdmissionConfig` and the
`PeerConfig` that carries them all, and each role's own config (`node.roles.config`). Call sites use these functions instead of copying keys
by hand. It imports the host (libp2p): commands import it only when they run.
"""

from __future__ import annotations

from pathlib import Path

from node.config import NodeConfig
from node.host.host import HostSettings
from node.host.relay import RelayLimitsConfig
from node.peer.config import PeerConfig
from node.resources import available_cores
from node.roles.config import (
    InferenceConfig,
    ModelChoice,
    RelayConfig,
    RoleConfig,
    TrainerConfig,
    ValidatorConfig,
)
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


def role_threads(cfg: NodeConfig) -> int:
    """Torch threads of one process: `node.threads`, or (0) the cores this process may run
    on, shared among a trainer's `trainer.nproc` ranks."""
    if cfg.node.threads:
        return cfg.node.threads
    ranks = cfg.trainer.nproc if cfg.node.role == "trainer" else 1
    return max(1, available_cores() // ranks)


def role_config(
    cfg: NodeConfig,
    *,
    data_dir: Path,
    max_rollouts: int | None,
    local_train: tuple[int, int] | None,
) -> RoleConfig:
    """The config of `cfg.node.role` from `[node]`, `[inference]`, `[validator]` and
    `[trainer]`, with what `start` takes besides the tree (a bound on rollouts, the
    local-training split); built-in models are cached under `data_dir`."""
    model = ModelChoice(
        model=cfg.node.model or None,
        models_dir=str(data_dir),
        threads=role_threads(cfg),
        device=cfg.node.device,
    )
    role = cfg.node.role
    if role == "inference":
        return InferenceConfig(
            model=model,
            batch_size=cfg.inference.batch_size,
            engine=cfg.inference.engine,
            max_rollouts=max_rollouts,
            rollouts_per_version=cfg.inference.rollouts_per_version,
            local_train=local_train,
            data_dir=data_dir,
        )
    if role == "validator":
        return ValidatorConfig(
            model=model,
            batch_size=cfg.inference.batch_size,
            audit_fraction=cfg.validator.audit_fraction,
            producer_window_fraction=cfg.validator.producer_window_fraction,
        )
    if role == "trainer":
        return TrainerConfig(
            model=model,
            data_dir=data_dir,
            publish_every_s=cfg.trainer.publish_every_s,
            micro_batch=cfg.trainer.micro_batch,
            nproc=cfg.trainer.nproc,
        )
    return RelayConfig()
