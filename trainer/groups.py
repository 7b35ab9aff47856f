"""Groups of samples made in-process (no records, no signatures), and held-out evaluation.

For local training (a peer's own rollouts feed its own copy directly) and for the
learning benchmark: `generate_groups` samples `group_size` completions per task with the
seeded sampler, scores each from its task and returns `trainer.samples.Sample` groups
with the sampler's log-probs, ready for `Trainer.train_on`. `heldout_solved` says which
held-out tasks one sample at temperature 1 solves (the learning metric, docs/DESIGN.md
§5); `heldout_shares` averages several seeded samples per task, and `paired_gain` compares
two policies scored on the same tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trainer.engine import SamplingSettings
from trainer.samples import Sample
from trainer.tasks import TaskSet

HELDOUT_SEED = 0x4E1D_0000  # held-out tasks come from a task set no run or warm start uses


def generate_groups(
    engine: Any,
    tokenizer: Any,
    tasks: TaskSet,
    items: Sequence[tuple[str, int]],
    *,
    group_size: int,
    settings: SamplingSettings,
    seed: int,
    version: int = 0,
    producer: bytes = b"local",
) -> list[list[Sample]]:
    """One group of `group_size` samples per (dataset, index) in `items`."""
    batch = [tasks.task(n, i) for n, i in items]
    prompts, seeds, owners = [], [], []
    for g, t in enumerate(batch):
        p = tokenizer.encode(t.prompt, add_special_tokens=False)
        for k in range(group_size):
            prompts.append(p)
            seeds.append((seed * 1_000_003 + g * group_size + k) % 2**64)
            owners.append(g)
    gens = engine.generate(prompts, settings, seeds, capture_hidden=False)
    groups: list[list[Sample]] = [[] for _ in batch]
    for p, g, owner in zip(prompts, gens, owners, strict=True):
        text = tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        score = tasks.score(batch[owner], text).reward
        groups[owner].append(
            Sample(
                prompt_ids=tuple(p),
                completion_ids=tuple(g.completion_ids),
                sampler_logprobs=tuple(g.logprobs),
                temperature=settings.temperature,
                version=version,
                group=(producer, version, seed * 10_000 + owner),
                reward=1.0 if score >= 1.0 else 0.0,
                score=score,
            )
        )
    return groups


def heldout_items(datasets: Sequence[str], n: int, offset: int = 0) -> list[tuple[str, int]]:
    """`n` held-out (dataset, index) pairs, the datasets in turn."""
    return [(datasets[k % len(datasets)], offset + k) for k in range(n)]


def heldout_solved(
    engine: Any,
    tokenizer: Any,
    items: Sequence[tuple[str, int]],
    max_new_tokens: int,
    seed: int = 7,
) -> list[bool]:
    """Per held-out item: solved (full marks) by one sample at temperature 1."""
    tasks = TaskSet(HELDOUT_SEED)
    batch = [tasks.task(n, i) for n, i in items]
    prompts = [tokenizer.encode(t.prompt, add_special_tokens=False) for t in batch]
    settings = SamplingSettings(temperature=1.0, max_new_tokens=max_new_tokens)
    seeds = [(seed * 1_000_003 + k) % 2**64 for k in range(len(batch))]
    gens = engine.generate(prompts, settings, seeds, capture_hidden=False)
    return [
        tasks.score(t, tokenizer.decode(g.completion_ids, skip_special_tokens=True)).reward >= 1.0
        for t, g in zip(batch, gens, strict=True)
    ]


def heldout_shares(
    engine: Any,
    tokenizer: Any,
    items: Sequence[tuple[str, int]],
    max_new_tokens: int,
    samples: int,
) -> list[float]:
    """Per held-out item, the share of `samples` seeded samples (sampling seeds 7, 8, ...)
    that solved it."""
    runs = [
        heldout_solved(engine, tokenizer, items, max_new_tokens, seed=7 + k) for k in range(samples)
    ]
    return [sum(r) / samples for r in zip(*runs, strict=True)]


def paired_gain(before: Sequence[float], after: Sequence[float]) -> dict[str, Any]:
    """Two scorings of the same items: each mean, the gain after - before, and the gain's
    paired 95% interval (`paired_ci95`), rounded to 4 places."""
    n = len(before)
    low, high = paired_ci95(before, after)
    return {
        "solve_rate_before": round(sum(before) / n, 4),
        "solve_rate_after": round(sum(after) / n, 4),
        "gain": round((sum(after) - sum(before)) / n, 4),
        "gain_ci95": [round(low, 4), round(high, 4)],
    }


def paired_ci95(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """95% normal interval of the mean paired difference after - before (same items;
    per item a 0/1 outcome or a share of samples)."""
    n = len(before)
    d = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(1, n - 1)
    half = 1.96 * math.sqrt(var / n)
    return mean - half, mean + half
