"""The RL loss against values computed by hand on tiny tensors: each clipping branch, the
importance-weight truncation, masking, both aggregations, the KL term, advantages."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import LossSettings, group_advantages, policy_loss

NO_IS = LossSettings(is_bound=0.0)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def _loss(logp, old, sampler, adv, mask, settings, ref=None):
    lp = _t(logp).requires_grad_(True)
    loss, stats = policy_loss(
        lp, _t(old), _t(sampler), _t(adv), _t(mask), settings, _t(ref) if ref else None
    )
    loss.backward()
    return loss.item(), lp.grad, stats


def test_on_policy_is_reinforce_with_token_mean():
    # ρ = 1 and w = 1: L = -(A1·2 + A2·1)/3, dL/dlogp = -A/3 per real token
    lp = [[-1.0, -2.0], [-0.5, 0.0]]
    loss, grad, stats = _loss(lp, lp, lp, [0.5, -1.0], [[1, 1], [1, 0]], LossSettings())
    assert loss == pytest.approx(-(0.5 * 2 - 1.0) / 3)
    assert torch.allclose(grad, _t([[-0.5 / 3, -0.5 / 3], [1.0 / 3, 0.0]]))
    assert stats["clip_fraction"] == 0.0 and stats["is_weight_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ratio", "adv", "objective", "has_grad"),
    [
        (1.5, 1.0, 1.28, False),  # A > 0, ρ above 1 + ε_high: clipped, no gradient
        (1.1, 1.0, 1.1, True),  # A > 0, inside the band
        (0.5, 1.0, 0.5, True),  # A > 0, below 1 - ε_low: min picks ρA, gradient flows
        (0.5, -1.0, -0.8, False),  # A < 0, ρ below 1 - ε_low: clipped, no gradient
        (1.5, -1.0, -1.5, True),  # A < 0, ρ above the band: min picks ρA (pessimistic)
    ],
)
def test_each_clipping_branch(ratio, adv, objective, has_grad):
    old = [[-1.0]]
    logp = [[-1.0 + math.log(ratio)]]
    loss, grad, stats = _loss(logp, old, old, [adv], [[1]], NO_IS)
    assert loss == pytest.approx(-objective)
    assert (grad.abs().item() > 0) == has_grad
    assert stats["clip_fraction"] == (0.0 if has_grad else 1.0)


def test_importance_weight_is_truncated_at_the_bound():
    # w = min(exp(old - sampler), C): 3 -> 2 (truncated), 0.5 stays; C <= 0 -> 1
    old = [[-1.0, -1.0]]
    sampler = [[-1.0 - math.log(3.0), -1.0 + math.log(2.0)]]
    loss, grad, stats = _loss(old, old, sampler, [1.0], [[1, 1]], LossSettings(is_bound=2.0))
    assert loss == pytest.approx(-(2.0 + 0.5) / 2)
    assert torch.allclose(grad, _t([[-1.0, -0.25]]))
    assert stats["is_truncated_fraction"] == 0.5
    loss, _, _ = _loss(old, old, sampler, [1.0], [[1, 1]], LossSettings(is_bound=4.0))
    assert loss == pytest.approx(-(3.0 + 0.5) / 2)
    loss, _, _ = _loss(old, old, sampler, [1.0], [[1, 1]], NO_IS)
    assert loss == pytest.approx(-1.0)


def test_padding_is_masked_out():
    lp = [[-1.0, -50.0, 7.0]]
    wild = [[-1.0, 3.0, -9.0]]  # padded positions hold anything
    loss, grad, _ = _loss(lp, [[-1.0, 0, 0]], wild, [2.0], [[1, 0, 0]], LossSettings())
    assert loss == pytest.approx(-2.0)
    assert grad[0, 1:].abs().sum().item() == 0.0


def test_token_mean_and_sequence_mean_differ_as_computed():
    # sequence 1: one token, A = 1; sequence 2: three tokens, A = -1 (on-policy, no IS)
    lp = [[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    mask = [[1, 0, 0], [1, 1, 1]]
    tok, _, _ = _loss(lp, lp, lp, [1.0, -1.0], mask, LossSettings(aggregation="token"))
    seq, g, _ = _loss(lp, lp, lp, [1.0, -1.0], mask, LossSettings(aggregation="sequence"))
    assert tok == pytest.approx(-(1.0 - 3.0) / 4)
    assert seq == pytest.approx(-(1.0 + -1.0) / 2)
    assert torch.allclose(g, _t([[-0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6]]))


def test_kl_to_reference():
    lp = [[-1.0, -2.0]]
    ref = [[-1.0, -2.0 + math.log(2.0)]]  # k3 = 2 - ln 2 - 1 on token 2, 0 on token 1
    settings = LossSettings(kl_coef=0.5)
    loss, _, stats = _loss(lp, lp, lp, [0.0], [[1, 1]], settings, ref)
    kl = (2.0 - math.log(2.0) - 1.0) / 2
    assert stats["kl"] == pytest.approx(kl)
    assert loss == pytest.approx(0.5 * kl)
    with pytest.raises(ValueError, match="ref_logp"):
        _loss(lp, lp, lp, [0.0], [[1, 1]], settings)


def test_group_advantages_and_flat_groups_dropped():
    assert group_advantages([1, 0, 0, 1], "mean") == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group_advantages([1, 0, 0, 1], "std") == pytest.approx([1, -1, -1, 1], rel=1e-5)
    assert group_advantages([1, 0, 0, 0], "mean") == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert group_advantages([0.0, 0.0, 0.0], "mean") is None
    assert group_advantages([1.0, 1.0], "std") is None
    assert group_advantages([1.0], "mean") is None
    with pytest.raises(ValueError):
        group_advantages([1, 0], "median")


def test_settings_are_checked():
    with pytest.raises(ValueError):
        LossSettings(aggregation="batch")
    with pytest.raises(ValueError):
        LossSettings(clip_low=1.5)
