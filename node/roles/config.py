"""Each role's own settings (frozen dataclasses), and `RoleIO`, what a role reports through.

`node.settings.role_config` fills them from the node's configuration; a role reads only its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelChoice:
    """Which policy model a role loads, where it computes, and how many torch threads it
    may use."""

    model: str | None = None  # --model: a model directory or builtin:tiny (default: the run's)
    models_dir: str | None = None  # where built-in models are cached (default: SWARM_NODE_DATA)
    threads: int | None = 1  # torch threads per process (None: torch's default)
    device: str = "cpu"  # --device: auto | cpu | cuda (`trainer.devices.resolve_device`)


@dataclass(frozen=True)
class InferenceConfig:
    """The inference role's settings."""

    model: ModelChoice = field(default_factory=ModelChoice)
    batch_size: int = 8
    engine: str = "hf"  # generation engine, hf | vllm
    max_rollouts: int | None = None  # stop producing after this many (None: forever)
    rollouts_per_version: int = 0  # made per published version, S - 1 versions ahead (0: no bound)
    local_train: tuple[int, int] | None = None  # SAPO-style I own + J swarm groups
    data_dir: Path = Path(".")  # the node's data directory (generation batches go to tmp/)


@dataclass(frozen=True)
class ValidatorConfig:
    """The validator role's settings."""

    model: ModelChoice = field(default_factory=ModelChoice)
    batch_size: int = 8
    audit_fraction: float = 0.25  # the share of rollouts sampled by their own ticket
    producer_window_fraction: float = 0.0625  # the share of producers' windows audited whole


@dataclass(frozen=True)
class TrainerConfig:
    """The trainer role's settings."""

    model: ModelChoice = field(default_factory=ModelChoice)
    data_dir: Path = Path(".")  # the node's data directory (the checkpoint goes to trainer/)
    publish_every_s: float = 0.0  # publish perturbed weights this often, no training (0: never)
    micro_batch: int = 8  # sequences per forward/backward pass of a step
    nproc: int = 1  # training ranks on this machine (`trainer.distributed`); this one is rank 0


@dataclass(frozen=True)
class RelayConfig:
    """The relay role's settings (it has none)."""


RoleConfig = InferenceConfig | ValidatorConfig | TrainerConfig | RelayConfig


@dataclass
class RoleIO:
    """What a role reports through, and the one signal it takes while running."""

    status: dict[str, Any] = field(default_factory=dict)  # live figures the role reports
    say: Callable[[str], None] = print  # a line for the operator
    producing: bool = True  # cleared by SIGUSR1: stop making new work, keep serving it
