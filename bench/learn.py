"""`swarm-node bench learn`: does training make the built-in policy better, and what helps.

- `sapo`: P peers (8; `--quick` 4), each training its own copy locally for R rounds on
  I own + J foreign groups per round (I + J = 8 groups of G = 4: the same number of
  training samples in every configuration), I/J in 8/0, 6/2, 4/4, 2/6 (`--quick`: 8/0,
  4/4), over seeds (3; `--quick` 1). Identical peers on one task mix gain nothing from
  sharing (docs/DESIGN.md §5), so the peers differ: half draw their own tasks from
  `tiny-chain-sum-4` only, half from `tiny-products` only; what one half practises the
  other lacks. Foreign groups are other peers' own groups of the same round (what gossip
  would bring), picked at random (not filtered for signal), with importance weights
  against their sampler log-probs (truncated at C = 2). Reward counted: each round every
  peer also answers a probe of the full mix (`PROBE` tasks, one sample each, never trained
  on); `cumulative_reward` is the sum of a peer's probe rewards over the rounds, mean and
  sd over peers x seeds; `ratio_vs_isolated` is a configuration's mean over 8/0's. 4/4
  runs once more with C = 0 (no importance correction, SAPO's code):
  `ratio_vs_isolated_no_is`.
  Why this is fair: every configuration starts from the same weights, sees the same task
  stream for its own groups, trains on the same number of groups with the same loss,
  rate and seeds, and is probed on the same tasks with the same sampler seeds (the probe
  pairs the configurations, so their difference is not sampling noise of the probe).
  Foreign groups cost the receiver nothing to make, as in a swarm; the isolated peer
  instead spends its whole budget on its own speciality.
  What the ratio can show at this scale: a cumulative reward over R rounds is R times
  the starting level plus what training added, and at the run's rate (5e-5; 3e-4 and
  1e-3 make the policy worse in every configuration) R = 12 steps add a few percent. So
  the bench also probes the untrained policy on the same probes
  (`untrained_cumulative_reward`, what a peer earns by not training) and reports per
  configuration `gain_vs_untrained` (cumulative minus that, paired by seed) with its
  standard error `gain_se`, and `gain_ratio_vs_isolated` (gains compared; None unless
  training alone gained more than two standard errors), plus `is_weight_mean` (mean
  truncated importance weight of the tokens trained on).
  Measured (full run, 12 rounds at 5e-5): never training earns 3.396; training alone
  3.417 (gain 0.021 +- 0.030), 4/4 3.427 (0.031 +- 0.034), 2/6 3.552 (0.156 +- 0.028: the
  peers that mix the specialities most learn most on the mixed probe). A configuration
  1.3x the isolated one would need a gain of about 1.05, 50x that of training alone. Set-ups measured and not kept (4 peers, one seed, 15-20
  rounds, so indicative): peers that differ in skills instead of data (each half
  fine-tuned on one family, all drawing from the full mix, SAPO's training reward as the
  count): 4/4 over 8/0 = 1.02 (lr 1e-4) and 1.05 (std advantages, 2 steps a round); 1.18
  at 3e-4, but there every configuration got worse (products 0.57 -> 0.42 alone), a ratio
  of damage, not of learning. A peer trained only on another specialist's products groups
  gained 0.00 (1e-4) / 0.05 (3e-4) solve rate in 20 steps: a strong peer's groups are
  mostly all solved (flat), and the truncated importance weights (mean 0.33-0.5) discount
  exactly the text the learner cannot yet write. Learning alone on products: 0.46 -> 0.54
  to 0.60 in 16 rounds with mean or std advantages, 1, 2 or 4 clipped epochs, 5e-5 or
  1e-4 (2e-4: 0.45, 3e-4: 0.30); chain-sum-4 does not move (0.05-0.07). With products half
  of the probe, no configuration can beat one that learns nothing by much more than 10%
  in 16 rounds; SAPO's +94% was over 2000 rounds.
- `async`: one trainer, K steps of 8 groups x 4, rollouts sampled by the policy S
  versions behind, S in {0, 2, 8}. For S > 0 the next batch is generated in a second
  thread while the trainer steps (what asynchrony buys on two cores). `final_solve_rate`
  on N held-out tasks (512; `--quick` 64) and `wall_s` per S.
- `devnet` (full run only; `--quick` reports null): held-out solve rate of the built-in
  policy and of the devnet trainer's last checkpoint after a default `swarm-node devnet`,
  on the same 512 held-out tasks, two seeded samples each (a task's score is its share
  solved): `solve_rate_before`, `solve_rate_after`, and a paired 95% interval of the
  difference over the tasks (`ci95_low`, `ci95_high`).
- `train_tokens_per_s`, `trainer_rss_mb`: the S = 0 trainer's completion tokens trained
  per second of training time, and this process's peak RSS.
Extra arguments: `--data-dir DIR`, `--rounds R`, `--steps K`, `--no-devnet`.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import threading
import time
from typing import Any

from bench import _learn_swarm
from node.console import say as _say
from trainer.tiny_policy import RL_LR

GROUP = 4
GROUPS_PER_ROUND = 8
PROBE = 16
# The built-in run's rate. At 1e-3 the probe reward halves in 12 rounds (0.318 per round
# untrained, 0.158 trained): every configuration would measure collapse, not learning.
LR = RL_LR


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    from node.errors import CommandError

    ap = argparse.ArgumentParser(prog="swarm-node bench learn", add_help=False)
    ap.add_argument("--data-dir")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--no-devnet", action="store_true")
    try:
        opts = ap.parse_args(args)
    except SystemExit:
        raise CommandError(
            f"bench learn: bad arguments {args}; allowed: --data-dir, --rounds, --steps, "
            "--seconds, --no-devnet"
        ) from None
    import torch

    from trainer import tiny_policy
    from trainer.engine_hf import torch_threads
    from trainer.model_dir import load_model_dir

    torch.set_num_threads(1)
    path, _report, _built = tiny_policy.ensure_policy(opts.data_dir, progress=_say)
    base, tok = load_model_dir(path)
    t0 = time.perf_counter()
    with torch_threads(1):
        sapo = _sapo(base, tok, quick, opts.rounds)
        asy, trainer_status = _async(base, tok, quick, opts.steps)
    efficiency, devnet = _learn_swarm.efficiency(base, tok, quick, opts.seconds, not opts.no_devnet)
    return {
        "quick": quick,
        "efficiency": efficiency,
        "sapo": sapo,
        "async": asy,
        "devnet": devnet,
        "train_tokens_per_s": trainer_status["train_tokens_per_s"],
        "trainer_rss_mb": trainer_status["trainer_rss_mb"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _trainer(model: Any, tok: Any, *, is_bound: float = 2.0, lr: float = LR) -> Any:
    from trainer.loss import LossSettings
    from trainer.train_loop import Trainer

    return Trainer(
        model, tok, group_size=GROUP, max_staleness=None, loss=LossSettings(is_bound=is_bound),
        lr=lr, groups_per_step=GROUPS_PER_ROUND, publish_every=10**9,
    )  # fmt: skip


def _settings() -> Any:
    from trainer.engine import SamplingSettings
    from trainer.tiny_policy import DEFAULT_MAX_NEW_TOKENS

    return SamplingSettings(temperature=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


# ------------------------------------------------------------------------------- sapo
def _sapo(base: Any, tok: Any, quick: bool, rounds: int | None) -> dict[str, Any]:
    configs = [(8, 0), (4, 4)] if quick else [(8, 0), (6, 2), (4, 4), (2, 6)]
    peers = 2 if quick else 8
    seeds = [0] if quick else [0, 1, 2]
    rounds = rounds or (2 if quick else 12)
    runs = [(i, j, 2.0) for i, j in configs] + [(4, 4, 0.0)]
    totals: dict[tuple[int, int, float], list[float]] = {}
    is_weights: dict[tuple[int, int, float], list[float]] = {}
    untrained: list[float] = []
    for seed in seeds:
        untrained.append(_untrained(base, tok, rounds, seed))
    for i, j, c in runs:
        vals: list[float] = []
        for seed in seeds:
            t = time.perf_counter()
            got, w = _sapo_run(base, tok, peers, rounds, i, j, c, seed)
            vals += got
            is_weights.setdefault((i, j, c), []).append(w)
            _say(
                f"sapo {i}/{j} C={c} seed {seed}: {statistics.mean(vals):.2f} ({time.perf_counter() - t:.0f}s)"
            )
        totals[(i, j, c)] = vals
    out: dict[str, Any] = {"peers": peers, "rounds": rounds, "seeds": len(seeds)}
    per_peer = [u for u in untrained for _ in range(peers)]  # the order _sapo_run's lists add up in
    out.update(sapo_summary(totals, per_peer, configs))
    for key, ws in is_weights.items():
        if key[2] > 0:
            out[f"{key[0]}/{key[1]}"]["is_weight_mean"] = round(statistics.mean(ws), 3)
    return out


def sapo_summary(
    totals: dict[tuple[int, int, float], list[float]],
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
    base = statistics.mean(untrained)
    out: dict[str, Any] = {"untrained_cumulative_reward": round(base, 3)}

    def gains(v: list[float]) -> tuple[float, float]:
        g = [c - u for c, u in zip(v, untrained, strict=True)]
        se = statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else 0.0
        return statistics.mean(g), se

    isolated = statistics.mean(totals[(8, 0, 2.0)])
    iso_gain, iso_se = gains(totals[(8, 0, 2.0)])
    gain_known = iso_gain > 0 and iso_gain > 2 * iso_se

    def ratios(v: list[float]) -> tuple[float | None, float | None]:
        r = round(statistics.mean(v) / isolated, 3) if isolated else None
        g = round(gains(v)[0] / iso_gain, 3) if gain_known else None
        return r, g

    for i, j in configs:
        v = totals[(i, j, 2.0)]
        ratio, gain_ratio = ratios(v)
        gain, se = gains(v)
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
    from trainer.tiny_policy import TASK_MIX

    names = [n for n, _ in TASK_MIX]
    return [(names[k % len(names)], r * PROBE + k) for k in range(PROBE)]


def _probe(engine: Any, tok: Any, tasks: Any, r: int, seed: int) -> float:
    """Mean reward over round r's probe: PROBE tasks of the full mix, one sample each,
    with the round's sampler seed (the same for every peer and for the untrained policy)."""
    from trainer.groups import generate_groups

    probed = generate_groups(engine, tok, tasks, _probe_items(r), group_size=1,
                             settings=_settings(), seed=seed * 31 + r)  # fmt: skip
    return sum(g[0].reward for g in probed) / PROBE


def _untrained(base: Any, tok: Any, rounds: int, seed: int) -> float:
    """The cumulative probe reward of the policy every peer starts from, never trained."""
    from trainer.engine_hf import HFEngine
    from trainer.tasks import TaskSet

    engine = HFEngine(base, tok, max_batch=64)
    tasks = TaskSet(2000 + seed)
    return sum(_probe(engine, tok, tasks, r, seed) for r in range(rounds))


def _sapo_run(
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
    from trainer.engine_hf import HFEngine
    from trainer.groups import generate_groups
    from trainer.tasks import TaskSet
    from trainer.tiny_policy import TASK_MIX

    names = [n for n, _ in TASK_MIX]
    rng = random.Random(seed)
    models = [copy.deepcopy(base) for _ in range(n_peers)]
    trainers = [_trainer(m, tok, is_bound=is_bound) for m in models]
    engines = [HFEngine(m, tok, max_batch=64) for m in models]
    tasks = TaskSet(1000 + seed)
    probe_tasks = TaskSet(2000 + seed)
    settings = _settings()
    cumulative = [0.0] * n_peers
    weights: list[float] = []
    for r in range(rounds):
        made = []
        for p in range(n_peers):
            name = names[p % len(names)]  # the peer's specialty
            items = [(name, (r * n_peers + p) * 64 + k) for k in range(own)]
            made.append(
                generate_groups(engines[p], tok, tasks, items, group_size=GROUP, settings=settings,
                                seed=seed * 7919 + r * 131 + p, producer=b"p%d" % p)
            )  # fmt: skip
            cumulative[p] += _probe(engines[p], tok, probe_tasks, r, seed)
        for p in range(n_peers):
            pool = [g for q in range(n_peers) if q != p for g in made[q]]
            taken = rng.sample(pool, min(foreign, len(pool)))
            stats = trainers[p].train_on(made[p][:own] + taken)
            if "is_weight_mean" in stats:
                weights.append(stats["is_weight_mean"])
    return cumulative, (statistics.mean(weights) if weights else 1.0)


# ------------------------------------------------------------------------------ async
def _async(base: Any, tok: Any, quick: bool, steps: int | None) -> tuple[dict[str, Any], dict]:
    from trainer.engine_hf import HFEngine
    from trainer.groups import heldout_items, heldout_solved
    from trainer.tiny_policy import DEFAULT_MAX_NEW_TOKENS, TASK_MIX

    steps = steps or (3 if quick else 40)
    n_eval = 64 if quick else 512
    items = heldout_items([n for n, w in TASK_MIX for _ in range(w)], n_eval)
    out: dict[str, Any] = {"steps": steps, "heldout_tasks": n_eval}
    status0: dict[str, Any] = {}
    for s in (0, 2, 8):
        model = copy.deepcopy(base)
        trainer = _trainer(model, tok)
        t = time.perf_counter()
        _async_run(model, tok, trainer, steps, s)
        wall = time.perf_counter() - t
        solved = heldout_solved(
            HFEngine(model, tok, max_batch=128), tok, items, DEFAULT_MAX_NEW_TOKENS
        )
        out[f"S={s}"] = {
            "final_solve_rate": round(sum(solved) / len(solved), 4),
            "wall_s": round(wall, 1),
        }
        _say(f"async S={s}: {out[f'S={s}']}")
        if s == 0:
            status0 = trainer.status()
    return out, status0


def _async_run(model: Any, tok: Any, trainer: Any, steps: int, lag: int) -> None:
    """K steps; batch k is sampled by the weights of step max(0, k - lag). With lag > 0
    the next batch is generated in a thread while this one trains."""
    from trainer.engine_hf import HFEngine, torch_threads
    from trainer.groups import generate_groups
    from trainer.tasks import TaskSet
    from trainer.tiny_policy import TASK_MIX

    names = [n for n, w in TASK_MIX for _ in range(w)]
    tasks = TaskSet(3000)
    settings = _settings()
    history = [copy.deepcopy(model.state_dict())]  # weights after each step
    sampler = copy.deepcopy(model)
    engine = HFEngine(sampler, tok, max_batch=64)

    def make(k: int) -> list[Any]:
        sampler.load_state_dict(history[max(0, k - lag)] if lag else model.state_dict())
        items = [(names[(k * 8 + g) % len(names)], k * 8 + g) for g in range(GROUPS_PER_ROUND)]
        with torch_threads(1):
            return generate_groups(engine, tok, tasks, items, group_size=GROUP, settings=settings,
                                   seed=k, version=max(0, k - lag))  # fmt: skip

    box: dict[int, Any] = {}
    nxt = make(0)
    for k in range(steps):
        batch = nxt
        worker = None
        if lag and k + 1 < steps:
            worker = threading.Thread(target=lambda k=k: box.__setitem__(k + 1, make(k + 1)))
            worker.start()
        trainer.train_on(batch)
        history.append(copy.deepcopy(model.state_dict()))
        if len(history) > lag + 2:
            history[-(lag + 3)] = None  # keep only what a lagging sampler can still ask for
        if k + 1 < steps:
            if worker is not None:
                worker.join()
                nxt = box.pop(k + 1)
            else:
                nxt = make(k + 1)
