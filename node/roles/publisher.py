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

FRACTION = 0.01
SCALE = 0.01


def perturb(state: dict[str, Any], seed: int) -> dict[str, Any]:
    """A copy of `state` with a sparse, seeded nudge on every floating tensor."""
    import torch

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


async def publish_loop(peer: Any, ctx: Any) -> None:
    """Publish a perturbed version every `ctx.publish_every_s` seconds, forever."""
    weights = peer.weights
    if weights is None or weights.newest() is None:
        ctx.say("trainer: --publish-every needs the model's weights (version 0); not publishing")
        return
    ctx.say(f"trainer: publishing perturbed weights every {ctx.publish_every_s:g} s")
    published: dict[str, float] = ctx.status.setdefault("published_at", {})
    while True:
        await trio.sleep(ctx.publish_every_s)
        newest = weights.newest()
        state = await weights.load_state_dict(newest)
        state = await trio.to_thread.run_sync(perturb, state, newest + 1)
        t0 = time.time()
        version = await weights.publish(state)
        published[str(version)] = t0
        ctx.status["policy_version"] = version
        ctx.say(f"trainer: published policy version {version} ({time.time() - t0:.2f} s to export)")
