"""The models `bench verify`'s cases generate with: changed copies of the policy.

Attacks: another initialisation (`other_model`), every weight perturbed (`perturbed`), the
middle layer made the identity (`dropped_layer`), linear weights fake-quantised to int8
(`int8`), and the policy one training step later (`one_training_step`; the stale-version
case claims it while generating with the older one). Honest variations: the same weights
computed in bf16 (`bf16`) or with eager attention (`eager`). Each returns a copy; the
policy itself is never changed.
"""

from __future__ import annotations

import copy
from typing import Any

from swarm_node_bench.parts.verify_records import Ctx, canonical_bf16

# "One training step" for stale_version: one AdamW step at this learning rate on the honest
# rollouts (REINFORCE, advantages r - mean), the result rounded to bf16 as a published
# checkpoint. At 1e-5 about 1-3 % of the bf16 weights change, the rate reported for real
# RL steps (docs/DESIGN.md §5, "RL updates are sparse"); the bench reports the measured fraction.
STALE_LR = 1e-5


def perturbed(model: Any, rel: float, seed: int) -> Any:
    """A copy of `model` with every weight perturbed by relative noise `rel` (seeded)."""
    import torch  # deferred: heavy import

    m = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1 + rel * torch.randn(p.shape, generator=gen))
    return m


def dropped_layer(model: Any) -> Any:
    """A copy of `model` whose middle layer adds nothing to the residual stream."""
    import torch  # deferred: heavy import

    m = copy.deepcopy(model)
    layer = m.base_model.layers[len(m.base_model.layers) // 2]
    with torch.no_grad():  # residual stream passes through unchanged: the layer is gone
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        for mod in (layer.self_attn.o_proj, layer.mlp.down_proj):
            if mod.bias is not None:
                mod.bias.zero_()
    return m


def int8(model: Any) -> Any:
    """A copy of `model` with its layers' linear weights rounded to int8 (per-row scale) and back."""
    import torch  # deferred: heavy import

    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.base_model.layers:
            for mod in layer.modules():
                if isinstance(mod, torch.nn.Linear):
                    w = mod.weight
                    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
                    w.copy_((w / scale).round().clamp(-127, 127) * scale)
    return m


def bf16_copy(model: Any) -> Any:
    """A copy of `model` in bfloat16."""
    import torch  # deferred: heavy import

    return copy.deepcopy(model).to(torch.bfloat16)


def eager(model: Any) -> Any:
    """A copy of `model` with eager attention."""
    m = copy.deepcopy(model)
    m.set_attn_implementation("eager")
    return m


def other_model(ctx: Ctx, seed: int = 0) -> Any:
    """A freshly initialised model of the same configuration."""
    import torch  # deferred: heavy import

    torch.manual_seed(12345 + seed)
    m = type(ctx.model)(copy.deepcopy(ctx.model.config))
    m.generation_config = copy.deepcopy(ctx.model.generation_config)
    return canonical_bf16(m.eval())


def one_training_step(ctx: Ctx, opened: list[Any]) -> Any:
    """The policy after one REINFORCE step (group-free advantages r - mean) with AdamW at
    STALE_LR on the given rollouts: what a trainer publishes as the next version."""
    import torch  # deferred: heavy import

    m = copy.deepcopy(ctx.model).train()
    opt = torch.optim.AdamW(m.parameters(), lr=STALE_LR, weight_decay=0.0)
    rewards = torch.tensor([ro.header.reward for ro in opened])
    adv = rewards - rewards.mean()
    if float(adv.abs().sum()) == 0.0:
        adv = torch.ones_like(adv)
    loss = torch.zeros(())
    for ro, a in zip(opened, adv, strict=True):
        b = ro.body
        ids = torch.tensor([list(b.prompt_ids) + list(b.completion_ids)])
        logits = m(input_ids=ids).logits[0, len(b.prompt_ids) - 1 : -1].float()
        lp = torch.log_softmax(logits / max(b.temperature, 1e-6), -1)
        tok = torch.tensor(list(b.completion_ids))
        loss = loss - a * lp[torch.arange(len(tok)), tok].sum() / len(opened)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return canonical_bf16(m.eval())


def changed_fraction(a: Any, b: Any) -> float:
    """The fraction of parameters that differ between `a` and `b`."""
    changed = total = 0
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        changed += int((p != q).sum())
        total += p.numel()
    return changed / max(1, total)
