"""A broadcast drill: the trainer publishes perturbed weights every few seconds.

`trainer.publish_every_s` (`swarm-node start --publish-every S`, `devnet --publish-every`)
makes the trainer role publish a new policy version every S seconds instead of training,
so the whole path
(export, signed manifests, swarm exchange, delta install, hot swap, audits of older
versions) runs end to end before real training exists. Each version is the previous one
with `FRACTION` of every floating-point tensor's values nudged by `SCALE` times the
tensor's standard deviation (seeded by the version number): a sparse change, like an RL
step, so versions after the first ship as small patches. The trainer's own key must be one
of the run's `trainer_keys`.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from node.roles.config import RoleIO, TrainerConfig
from node.weights.sync import WeightSync

FRACTION = 0.01
SCALE = 0.01


def perturb(state: dict[str, Any], seed: int) -> dict[str, Any]:
    """A copy of `state` with a sparse, seeded nudge on every floating tensor."""
    import torch  # deferred: heavy import

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if not t.is_floating_point() or t.numel() == 0:
            out[name] = t
            continue
        mask = torch.rand(t.shape, generator=g) < FRACTION
        std = float(t.float().std()) if t.numel() > 1 else 1.0
        noise = torch.randn(t.shape, generator=g) * (SCALE * (std or 1.0))
        out[name] = (t.float() + noise * mask).to(t.dtype)
    return out


async def publish_loop(weights: WeightSync | None, config: TrainerConfig, io: RoleIO) -> None:
    """Publish a perturbed version every `config.publish_every_s` seconds, forever."""
    if weights is None or weights.newest() is None:
        io.say("trainer: --publish-every needs the model's weights (version 0); not publishing")
        return
    io.say(f"trainer: publishing perturbed weights every {config.publish_every_s:g} s")
    published: dict[str, float] = io.status.setdefault("published_at", {})
    while True:
        await trio.sleep(config.publish_every_s)
        newest = weights.newest()
        assert newest is not None  # it held version 0 already
        state = await weights.load_state_dict(newest)
        state = await trio.to_thread.run_sync(perturb, state, newest + 1)
        t0 = time.time()
        version = await weights.publish(state)
        published[str(version)] = t0
        io.status["policy_version"] = version
        io.say(f"trainer: published policy version {version} ({time.time() - t0:.2f} s to export)")
