"""`swarm-node bench broadcast`: weight broadcast figures.

delta: patch size over full checkpoint size for consecutive versions made by one AdamW
step on the built-in policy. The policy ships in bf16 (the trainer keeps an fp32 master
copy; a version is the master cast to bf16), so a small step changes only the bf16 values
whose rounding it crosses. One step at each learning rate from the same start, one
side-by-side run: `patch_bytes_ratio_lr1e-5`, `patch_bytes_ratio_lr1e-6`; the patch is
checked bit-exact (applied, digest equal to the full version's).
`patch_bytes_ratio_trained`: the same for two consecutive versions of real training
(`trainer.train_loop.Trainer`, the built-in run's rate, groups generated on the built-in
tasks; one version per `rl.groups_per_step` x `rl.publish_every` groups as the built-in
run publishes), cast to bf16; `patch_bytes_ratio_trained_fp32`: the same versions as the
fp32 state the trainer holds (every fp32 value moves in an AdamW step: a patch is no
smaller than the checkpoint, so a run should publish bf16).

real: see `swarm_node_bench.parts.broadcast_real` (1 origin + N receivers as processes on loopback,
upload capped by the node's own limiter).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from node.console import say as _say
from trainer.checkpoint import from_state_dict, weights_digest
from trainer.engine import SamplingSettings
from trainer.groups import generate_groups
from trainer.model_dir import load_model_dir
from trainer.tasks import TaskSet
from trainer.tiny_policy import DEFAULT_MAX_NEW_TOKENS, RL_LR, TASK_MIX, ensure_policy

LRS = (("lr1e-5", 1e-5), ("lr1e-6", 1e-6))


def bf16_state(model: Any) -> dict[str, Any]:
    """The model's state dict in bfloat16."""
    import torch  # deferred: heavy import

    return {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}


def one_adamw_step(model: Any, lr: float, seed: int = 0) -> None:
    """One AdamW step (fp32 master weights) on a next-token loss over random sequences."""
    import torch  # deferred: heavy import

    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (16, 32), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()


def delta_part(quick: bool) -> dict[str, Any]:
    """The delta figures: patch size, changed values and time to make and apply a patch between versions of the built-in policy."""

    import torch  # deferred: heavy import

    from trainer.delta import apply_patch, make_patch, patch_stats  # deferred: heavy import

    path, _, _ = ensure_policy(progress=_say)
    torch.set_num_threads(1)
    model, tok = load_model_dir(path)
    base = from_state_dict(bf16_state(model))
    out: dict[str, Any] = {"delta_full_bytes": len(base)}
    for name, lr in LRS:
        m = copy.deepcopy(model)
        one_adamw_step(m, lr)
        new = from_state_dict(bf16_state(m))
        t0 = time.perf_counter()
        patch = make_patch(base, new)
        made_s = time.perf_counter() - t0
        assert weights_digest(apply_patch(base, patch)) == weights_digest(new)
        stats = patch_stats(patch)
        out[f"patch_bytes_ratio_{name}"] = round(len(patch) / len(new), 5)
        out[f"changed_fraction_{name}"] = round(stats["changed"] / _elements(model), 5)
        _say(
            f"delta {name}: patch {len(patch)} bytes of {len(new)} "
            f"({len(patch) / len(new):.4f}), {stats['changed']} values changed, {made_s:.3f} s"
        )
    out.update(trained_part(quick, model, tok))
    return out


def trained_part(quick: bool, model: Any, tok: Any) -> dict[str, Any]:
    """Patch ratios between consecutive versions of real RL training of `model` (module
    docstring)."""
    import torch  # deferred: heavy import

    from trainer.delta import apply_patch, make_patch  # deferred: heavy import
    from trainer.engine_hf import HFEngine  # deferred: heavy import
    from trainer.loss import LossSettings  # deferred: heavy import
    from trainer.train_loop import Trainer  # deferred: heavy import

    groups_per_step, steps_per_version, group = (4, 1 if quick else 2, 4)
    trainer = Trainer(
        model,
        tok,
        group_size=group,
        max_staleness=None,
        loss=LossSettings(),
        lr=RL_LR,
        groups_per_step=groups_per_step,
        publish_every=10**9,
    )
    engine = HFEngine(model, tok, max_batch=64)
    tasks, names = TaskSet(7), [n for n, _ in TASK_MIX]
    settings = SamplingSettings(temperature=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    versions: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for v in range(2):
        for k in range(steps_per_version):
            step = v * steps_per_version + k
            items = [(names[i % len(names)], step * 64 + i) for i in range(groups_per_step)]
            groups = generate_groups(
                engine, tok, tasks, items, group_size=group, settings=settings, seed=step
            )
            trainer.train_on(groups)
        versions.append({k: t.detach().clone() for k, t in model.state_dict().items()})
    out: dict[str, Any] = {}
    for name, cast in (
        ("patch_bytes_ratio_trained", torch.bfloat16),
        ("patch_bytes_ratio_trained_fp32", None),
    ):
        a, b = (
            from_state_dict({k: t.to(cast) if cast else t for k, t in s.items()}) for s in versions
        )
        patch = make_patch(a, b)
        assert weights_digest(apply_patch(a, patch)) == weights_digest(b)
        out[name] = round(len(patch) / len(b), 5)
    _say(f"delta trained: {out} ({trainer.steps} RL steps, {time.perf_counter() - t0:.0f} s)")
    return out


def _elements(model: Any) -> int:
    return sum(v.numel() for v in model.state_dict().values())


def run(quick: bool, args: list[str]) -> dict:
    """Run the chosen parts (`delta`, `real`; default both); returns their figures."""
    parts = {"delta", "real"}
    chosen = set(args) or parts
    if chosen - parts:
        raise SystemExit(f"bench broadcast parts are {sorted(parts)}, got {args}")
    result: dict[str, Any] = {"quick": quick}
    if "delta" in chosen:
        result.update(delta_part(quick))
    if "real" in chosen:
        from swarm_node_bench.parts.broadcast_real import real_part  # deferred: heavy import

        result.update(real_part(quick))
    return result
