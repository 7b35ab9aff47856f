"""`swarm_node_bench.learn`'s `sapo` grid (the setting, and why it is fair, are in `bench.learn`'s
docstring): peers training their own copies on I own + J foreign groups a round, probed
every round, against training alone and against not training at all.

Rounds: `--rounds R` fixes them. Otherwise the full grid first runs training alone (8/0)
round by round, every seed side by side, until its gain over the untrained policy is more
than two standard errors (looked at from `MIN_ROUNDS` on; `MAX_ROUNDS` at most; with
`--sapo-budget-s`, also until a share of the budget is spent that leaves the other
configurations the same time each), then runs every other configuration for that many
rounds; `rounds_stop` says which bound ended it.
Everything runs on `device` (`--device cuda`: the policy and every peer's copy on the GPU).
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

from node.console import say as _say
from trainer.engine import SamplingSettings
from trainer.groups import generate_groups
from trainer.tasks import TaskSet
from trainer.tiny_policy import DEFAULT_MAX_NEW_TOKENS, RL_LR, TASK_MIX

GROUP = 4
GROUPS_PER_ROUND = 8
PROBE = 16
MAX_ROUNDS = 48  # the full grid's cap while it waits for training alone to gain
# ... and the rounds it runs before it looks at that gain: the probe pairs every policy on
# the same sampler noise, so a step or two at the run's rate barely moves it, and a gain
# measured that early is a ratio of noise (docs/BENCHMARKS.md has the runs).
MIN_ROUNDS = 24
# The built-in run's rate: a much larger one makes the probe reward collapse, so every
# configuration would measure collapse, not learning.
LR = RL_LR

Key = tuple[int, int, float]  # (I own, J foreign, importance bound C)


def trainer_for(model: Any, tok: Any, *, is_bound: float = 2.0, lr: float = LR) -> Any:
    """A `Trainer` taking one step on the groups it is given (no staleness, no versions)."""
    from trainer.loss import LossSettings  # deferred: heavy import
    from trainer.train_loop import Trainer  # deferred: heavy import

    return Trainer(
        model,
        tok,
        group_size=GROUP,
        max_staleness=None,
        loss=LossSettings(is_bound=is_bound),
        lr=lr,
        groups_per_step=GROUPS_PER_ROUND,
        publish_every=10**9,
    )


def sampling() -> Any:
    """The sampling settings of the grid: temperature 1, the built-in policy's token budget."""

    return SamplingSettings(temperature=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


def sapo(
    base: Any, tok: Any, quick: bool, rounds: int | None, budget_s: float | None = None
) -> dict[str, Any]:
    """The `sapo` figures (module docstring); `base` is on the device the grid runs on."""
    configs = [(8, 0), (4, 4)] if quick else [(8, 0), (6, 2), (4, 4), (2, 6)]
    peers = 2 if quick else 8
    seeds = [0] if quick else [0, 1, 2]
    later: list[Key] = [(i, j, 2.0) for i, j in configs[1:]] + [(4, 4, 0.0)]
    totals: dict[Key, list[float]] = {}
    is_weights: dict[Key, list[float]] = {}
    t0 = time.perf_counter()
    if rounds is None and not quick:
        deadline = None if budget_s is None else t0 + budget_s / (1 + len(later))
        rounds, iso, untrained, weights, stop = isolated_until_gain(
            base, tok, peers, seeds, MAX_ROUNDS, deadline, min_rounds=MIN_ROUNDS
        )
        totals[(8, 0, 2.0)], is_weights[(8, 0, 2.0)] = iso, weights
    else:
        rounds, stop = rounds or 2, "fixed"
        untrained = [untrained_reward(base, tok, rounds, seed) for seed in seeds]
        later.insert(0, (8, 0, 2.0))
    for i, j, c in later:
        vals: list[float] = []
        for seed in seeds:
            t = time.perf_counter()
            got, w = sapo_run(base, tok, peers, rounds, i, j, c, seed)
            vals += got
            is_weights.setdefault((i, j, c), []).append(w)
            _say(
                f"sapo {i}/{j} C={c} seed {seed}: {statistics.mean(vals):.2f} ({time.perf_counter() - t:.0f}s)"
            )
        totals[(i, j, c)] = vals
    out: dict[str, Any] = {
        "peers": peers,
        "rounds": rounds,
        "rounds_stop": stop,
        "seeds": len(seeds),
        "device": str(next(base.parameters()).device),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    per_peer = [u for u in untrained for _ in range(peers)]  # the order sapo_run's lists add up in
    out.update(sapo_summary(totals, per_peer, configs))
    for key, ws in is_weights.items():
        if key[2] > 0:
            out[f"{key[0]}/{key[1]}"]["is_weight_mean"] = round(statistics.mean(ws), 3)
    for i, j in configs:
        out[f"{i}/{j}"]["rounds"] = rounds
    return out


def isolated_until_gain(
    base: Any,
    tok: Any,
    peers: int,
    seeds: list[int],
    max_rounds: int,
    deadline: float | None,
    min_rounds: int = 1,
) -> tuple[int, list[float], list[float], list[float], str]:
    """Training alone (8/0), every seed a round at a time, until its mean gain over the
    untrained policy exceeds two standard errors (`rounds_stop` "gain", looked at from
    `min_rounds` on), `max_rounds` ("max_rounds") or `deadline` ("budget"): (rounds,
    per-peer cumulative rewards in `sapo_run`'s order, the untrained policy's per seed,
    importance weights, stop)."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    runs = [sapo_rounds(base, tok, peers, 8, 0, 2.0, seed) for seed in seeds]
    engine = HFEngine(base, tok, max_batch=64)
    probe_tasks = [TaskSet(2000 + seed) for seed in seeds]
    cumulative = [0.0] * (peers * len(seeds))
    untrained = [0.0] * len(seeds)
    weights: list[float] = []
    stop, r = "max_rounds", 0
    while r < max_rounds:
        for k, seed in enumerate(seeds):
            rewards, w = next(runs[k])
            for p, x in enumerate(rewards):
                cumulative[k * peers + p] += x
            weights += w
            untrained[k] += _probe(engine, tok, probe_tasks[k], r, seed)
        r += 1
        gain, se = paired_gain(cumulative, [u for u in untrained for _ in range(peers)])
        _say(f"sapo 8/0 round {r}: gain {gain:+.3f} +- {se:.3f} (se)")
        if r >= min_rounds and gain > 0 and gain > 2 * se:
            stop = "gain"
            break
        if deadline is not None and time.perf_counter() > deadline:
            stop = "budget"
            break
    return r, cumulative, untrained, [statistics.mean(weights) if weights else 1.0], stop


def paired_gain(values: list[float], untrained: list[float]) -> tuple[float, float]:
    """Mean of `values - untrained` (paired item by item) and its standard error."""
    g = [c - u for c, u in zip(values, untrained, strict=True)]
    se = statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else 0.0
    return statistics.mean(g), se


def sapo_summary(
    totals: dict[Key, list[float]],
    untrained: list[float],
    configs: list[tuple[int, int]],
) -> dict[str, Any]:
    """The `sapo` figures from per-peer cumulative rewards, keyed (I, J, C); C = 0 is the
    run without importance correction (4/4 only). `untrained[k]` is the cumulative probe
    reward of the untrained policy on the probes of the peer behind `totals[...][k]` (its
    seed): what that peer would have earned by not training. `gain_vs_untrained` is what
    training added (mean over peers x seeds, with its standard error);
    `gain_ratio_vs_isolated` compares gains, and is None unless training alone gained more
    than two standard errors (a ratio over a gain lost in noise means nothing)."""
    out: dict[str, Any] = {"untrained_cumulative_reward": round(statistics.mean(untrained), 3)}
    isolated = statistics.mean(totals[(8, 0, 2.0)])
    iso_gain, iso_se = paired_gain(totals[(8, 0, 2.0)], untrained)
    gain_known = iso_gain > 0 and iso_gain > 2 * iso_se

    def ratios(v: list[float]) -> tuple[float | None, float | None]:
        r = round(statistics.mean(v) / isolated, 3) if isolated else None
        g = round(paired_gain(v, untrained)[0] / iso_gain, 3) if gain_known else None
        return r, g

    for i, j in configs:
        v = totals[(i, j, 2.0)]
        ratio, gain_ratio = ratios(v)
        gain, se = paired_gain(v, untrained)
        out[f"{i}/{j}"] = {
            "cumulative_reward_mean": round(statistics.mean(v), 3),
            "cumulative_reward_sd": round(statistics.stdev(v), 3) if len(v) > 1 else 0.0,
            "ratio_vs_isolated": ratio,
            "gain_vs_untrained": round(gain, 3),
            "gain_se": round(se, 3),
            "gain_ratio_vs_isolated": gain_ratio,
        }
    v = totals[(4, 4, 0.0)]
    ratio, gain_ratio = ratios(v)
    out["4/4"]["ratio_vs_isolated_no_is"] = ratio
    out["4/4"]["cumulative_reward_mean_no_is"] = round(statistics.mean(v), 3)
    out["4/4"]["gain_ratio_vs_isolated_no_is"] = gain_ratio
    return out


def _probe_items(r: int) -> list[tuple[str, int]]:
    names = [n for n, _ in TASK_MIX]
    return [(names[k % len(names)], r * PROBE + k) for k in range(PROBE)]


def _probe(engine: Any, tok: Any, tasks: Any, r: int, seed: int) -> float:
    """Mean reward over round r's probe: PROBE tasks of the full mix, one sample each,
    with the round's sampler seed (the same for every peer and for the untrained policy)."""

    probed = generate_groups(
        engine, tok, tasks, _probe_items(r), group_size=1, settings=sampling(), seed=seed * 31 + r
    )
    return sum(g[0].reward for g in probed) / PROBE


def untrained_reward(base: Any, tok: Any, rounds: int, seed: int) -> float:
    """The cumulative probe reward of the policy every peer starts from, never trained."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    engine = HFEngine(base, tok, max_batch=64)
    tasks = TaskSet(2000 + seed)
    return sum(_probe(engine, tok, tasks, r, seed) for r in range(rounds))


def sapo_run(
    base: Any,
    tok: Any,
    n_peers: int,
    rounds: int,
    own: int,
    foreign: int,
    is_bound: float,
    seed: int,
) -> tuple[list[float], float]:
    """Per peer: the sum of its probe rewards over the rounds; and the mean importance
    weight of the trained tokens (own and foreign) over all steps."""
    cumulative = [0.0] * n_peers
    weights: list[float] = []
    run = sapo_rounds(base, tok, n_peers, own, foreign, is_bound, seed)
    for _ in range(rounds):
        rewards, w = next(run)
        cumulative = [c + x for c, x in zip(cumulative, rewards, strict=True)]
        weights += w
    return cumulative, (statistics.mean(weights) if weights else 1.0)


def sapo_rounds(
    base: Any,
    tok: Any,
    n_peers: int,
    own: int,
    foreign: int,
    is_bound: float,
    seed: int,
) -> Iterator[tuple[list[float], list[float]]]:
    """Round after round: each peer's probe reward (probed before it trains that round)
    and the mean importance weights of the round's steps."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    names = [n for n, _ in TASK_MIX]
    rng = random.Random(seed)
    models = [copy.deepcopy(base) for _ in range(n_peers)]
    trainers = [trainer_for(m, tok, is_bound=is_bound) for m in models]
    engines = [HFEngine(m, tok, max_batch=64) for m in models]
    tasks = TaskSet(1000 + seed)
    probe_tasks = TaskSet(2000 + seed)
    settings = sampling()
    r = 0
    while True:
        made, probes, weights = [], [], []
        for p in range(n_peers):
            name = names[p % len(names)]  # the peer's specialty
            items = [(name, (r * n_peers + p) * 64 + k) for k in range(own)]
            made.append(
                generate_groups(
                    engines[p],
                    tok,
                    tasks,
                    items,
                    group_size=GROUP,
                    settings=settings,
                    seed=seed * 7919 + r * 131 + p,
                    producer=b"p%d" % p,
                )
            )
            probes.append(_probe(engines[p], tok, probe_tasks, r, seed))
        for p in range(n_peers):
            pool = [g for q in range(n_peers) if q != p for g in made[q]]
            taken = rng.sample(pool, min(foreign, len(pool)))
            stats = trainers[p].train_on(made[p][:own] + taken)
            if "is_weight_mean" in stats:
                weights.append(stats["is_weight_mean"])
        yield probes, weights
        r += 1
