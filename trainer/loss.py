"""The RL loss: group-relative advantages and the clipped, importance-corrected surrogate.

Two pure functions on tensors; no model, no IO. `trainer.train_loop` feeds them.

Advantages (`group_advantages`), per group of rollouts of one task with re-scored rewards
r_1..r_G (never the rewards workers claim):

    mode "mean":  A_i = r_i - mean(r)                       (Dr. GRPO, nanochat)
    mode "std":   A_i = (r_i - mean(r)) / (std(r) + eps)    (GRPO; std is the population std)

A group whose rewards are all equal carries no signal (every A_i = 0): it is dropped, not
trained on as zeros (INTELLECT-2, SAPO); `group_advantages` returns None for it.

Loss (`policy_loss`), per completion token t of sequence i, with three log-probs of the
token: log π_θ (the policy being trained, with gradient), log π_old (the same policy at
the start of this optimisation step, detached) and log π_s (what the sampler recorded; the
sampler may be stale by a few versions or another peer's copy):

    ρ_t = exp(log π_θ - log π_old)                  the PPO ratio (1 at the first step)
    w_t = min(exp(log π_old - log π_s), C)          truncated importance weight (detached)
    o_t = w_t · min(ρ_t A_i, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_i)
    k_t = exp(log π_ref - log π_θ) - (log π_ref - log π_θ) - 1     (k3 KL estimate, ≥ 0)

    token mean:    L = -Σ_{i,t} m_it o_it / Σ_{i,t} m_it  +  β · (same mean of k)
    sequence mean: L = -(1/B) Σ_i (Σ_t m_it o_it / Σ_t m_it)  +  β · (same mean of k)

m is the completion mask (padding 0). C ≤ 0 turns the importance correction off (w = 1,
what SAPO does with foreign text); β = 0 (the default) drops the KL term and π_ref is not
needed. Deliberately left out: entropy bonus, value baseline, the dual-clip lower bound
for negative advantages (the truncation of w already bounds a token's weight), and length
normalisation beyond the two aggregations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ADVANTAGE_MODES = ("mean", "std")
AGGREGATIONS = ("token", "sequence")


@dataclass(frozen=True)
class LossSettings:
    """The loss's knobs; `from_manifest` reads them from a run manifest's RL settings."""

    advantage: str = "mean"  # "mean" | "std" (see module docstring)
    clip_low: float = 0.2  # ε_low
    clip_high: float = 0.28  # ε_high (DAPO's clip-higher)
    is_bound: float = 2.0  # C of the truncated importance weight; <= 0: no correction
    aggregation: str = "token"  # "token" | "sequence"
    kl_coef: float = 0.0  # β; 0 = no KL term
    eps: float = 1e-6  # in the std normalisation

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {self.advantage!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
            raise ValueError("clip_low must be in [0, 1) and clip_high >= 0")
        if self.kl_coef < 0.0:
            raise ValueError("kl_coef must be >= 0")

    @classmethod
    def from_manifest(cls, manifest: Any) -> LossSettings:
        """The loss settings a run manifest fixes."""
        return cls(
            advantage=manifest.rl_advantage,
            clip_low=manifest.rl_clip_low,
            clip_high=manifest.rl_clip_high,
            is_bound=manifest.rl_is_bound,
            aggregation=manifest.rl_aggregation,
            kl_coef=manifest.rl_kl_coef,
        )


def group_advantages(
    rewards: Sequence[float], mode: str = "mean", eps: float = 1e-6
) -> list[float] | None:
    """Advantages of one group's rewards, or None when they are all equal (no signal)."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {mode!r}")
    r = torch.tensor(list(rewards), dtype=torch.float64)
    if r.numel() < 2 or bool((r == r[0]).all()):
        return None
    a = r - r.mean()
    if mode == "std":
        a = a / (r.std(unbiased=False) + eps)
    return a.tolist()


def policy_loss(
    logp: torch.Tensor,  # (B, T) log π_θ of the completion tokens, with gradient
    old_logp: torch.Tensor,  # (B, T) log π_old, detached
    sampler_logp: torch.Tensor,  # (B, T) log π_s as recorded by the sampler
    advantages: torch.Tensor,  # (B,) one advantage per sequence
    mask: torch.Tensor,  # (B, T) 1 for completion tokens, 0 for padding
    settings: LossSettings,
    ref_logp: torch.Tensor | None = None,  # (B, T) log π_ref, needed when kl_coef > 0
    total: float | None = None,  # the step's Σ m (token mean) or B (sequence mean)
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss to minimise and a few statistics (module docstring has the math).

    `total` replaces this batch's own denominator when the batch is one micro-batch of a
    larger step (`trainer.micro_step`): the step's completion tokens for the token mean, its
    sequences for the sequence mean; summed over the micro-batches, the losses and their
    gradients are then those of one pass over the whole step."""
    mask = mask.to(logp.dtype)
    old_logp = old_logp.detach()
    adv = advantages.to(logp.dtype)[:, None]  # (B, 1)
    ratio = torch.exp(logp - old_logp)  # ρ, (B, T)
    if settings.is_bound > 0:
        w = torch.exp(old_logp - sampler_logp.to(logp.dtype)).clamp(max=settings.is_bound)
    else:
        w = torch.ones_like(logp)
    w = w.detach()
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    objective = w * torch.minimum(ratio * adv, clipped * adv)  # o, (B, T)
    loss = -_aggregate(objective, mask, settings.aggregation, total)
    kl_value = 0.0
    if settings.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        d = ref_logp.detach() - logp
        kl = _aggregate(torch.exp(d) - d - 1.0, mask, settings.aggregation, total)
        loss = loss + settings.kl_coef * kl
        kl_value = float(kl.detach())
    n = mask.sum().clamp(min=1.0)
    was_clipped = ((ratio * adv) > (clipped * adv)).to(mask.dtype)
    stats = {
        "clip_fraction": float((was_clipped * mask).sum() / n),
        "is_weight_mean": float((w * mask).sum() / n),
        "is_truncated_fraction": float(
            ((torch.exp(old_logp - sampler_logp) > settings.is_bound) * mask).sum() / n
        )
        if settings.is_bound > 0
        else 0.0,
        "kl": kl_value,
    }
    return loss, stats


def _aggregate(
    x: torch.Tensor, mask: torch.Tensor, how: str, total: float | None = None
) -> torch.Tensor:
    """Token mean over the whole batch, or the mean over sequences of per-sequence means;
    `total`, when given, is the denominator (tokens, or sequences) instead of this batch's."""
    if how == "token":
        denom = mask.sum().clamp(min=1.0) if total is None else max(total, 1.0)
        return (x * mask).sum() / denom
    per_seq = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    return per_seq.mean() if total is None else per_seq.sum() / max(total, 1.0)
