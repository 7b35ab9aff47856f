"""`swarm-node bench learn`: does training make the built-in policy better, and what helps.

- `efficiency` (`swarm_node_bench.parts.learn_swarm`): what a default devnet learns in T seconds against
  what the single-process reference (`trainer.single`, plain on-policy GRPO) learns in the
  same T on the same machine, on the same held-out tasks: `single_gain`, `swarm_gain` with
  paired 95% intervals, `swarm_over_single`, and the swarm's produced rollouts by fate at
  the trainer (`trained`, `stale`, `unverified`, `incomplete_group`, `other`). T: `--seconds`,
  else the devnet's default duration (`--quick`: 8 s, 64 held-out tasks, one worker).
- `sapo` (`swarm_node_bench.parts.learn_sapo`): P peers (8; `--quick` 2), each training its own copy locally for R rounds on
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
  Measured figures and set-ups tried: docs/BENCHMARKS.md.
- `async`: one trainer, K steps of 8 groups x 4, rollouts sampled by the policy S
  versions behind, S in {0, 2, 8}. For S > 0 the next batch is generated in a second
  thread while the trainer steps (what asynchrony buys on two cores). `final_solve_rate`
  on N held-out tasks (512; `--quick` 64) and `wall_s` per S.
- `devnet`: the efficiency run's swarm on its own: held-out solve rate of the built-in
  policy and of the devnet trainer's last checkpoint, on the same held-out tasks, two
  seeded samples each (a task's score is its share solved): `solve_rate_before`,
  `solve_rate_after`, and a paired 95% interval of the difference over the tasks
  (`ci95_low`, `ci95_high`).
- `train_tokens_per_s`, `trainer_rss_mb`: the S = 0 trainer's completion tokens trained
  per second of training time, and this process's peak RSS.
Extra arguments: `--data-dir DIR`, `--seconds T`, `--rounds R` (sapo; without it the full
grid runs at least 24 rounds and as many as training alone needs to gain more than two
standard errors),
`--steps K` (async), `--no-devnet` (efficiency without the swarm), `--only PARTS`
(efficiency,sapo,async), `--sapo-budget-s S`, and for a GPU `--device cuda --policy
qwen2-24m --only sapo [--warm-steps N]` (a 24M-parameter Qwen2 built from its config,
warm-started here for at most N steps, default the built-in policy's).
"""

from __future__ import annotations

import argparse
import copy
import threading
import time
from typing import Any

from node.console import say as _say
from node.errors import CommandError
from swarm_node_bench.parts import learn_sapo, learn_swarm
from swarm_node_bench.parts.learn_sapo import GROUP, GROUPS_PER_ROUND, sampling, trainer_for
from trainer import tiny_policy
from trainer.groups import generate_groups, heldout_items, heldout_solved
from trainer.model_dir import load_model_dir
from trainer.tasks import TaskSet
from trainer.tiny_policy import DEFAULT_MAX_NEW_TOKENS, TASK_MIX

PARTS = ("efficiency", "sapo", "async")
# --policy qwen2-24m: a Qwen2 built here from its config, 8x the built-in policy's width x
# depth, warm-started as the built-in one is (for --device cuda; nothing is downloaded)
QWEN2_24M = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
)


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the chosen parts (arguments as in the module docstring); returns their figures."""
    opts = options(args)
    import torch  # deferred: heavy import

    from trainer.engine_hf import torch_threads  # deferred: heavy import

    torch.set_num_threads(1)
    base, tok = _policy(opts.policy, opts.device, opts.data_dir, opts.warm_steps)
    parts = set(opts.only.split(",")) if opts.only else set(PARTS)
    t0 = time.perf_counter()
    sapo = asy = efficiency = devnet = None
    status: dict[str, Any] = {}
    with torch_threads(1):
        if "sapo" in parts:
            sapo = learn_sapo.sapo(base, tok, quick, opts.rounds, opts.sapo_budget_s)
        if "async" in parts:
            asy, status = _async(base.to("cpu"), tok, quick, opts.steps)
    if "efficiency" in parts:
        efficiency, devnet = learn_swarm.efficiency(
            base.to("cpu"), tok, quick, opts.seconds, not opts.no_devnet
        )
    return {
        "quick": quick,
        "policy": opts.policy,
        "efficiency": efficiency,
        "sapo": sapo,
        "async": asy,
        "devnet": devnet,
        "train_tokens_per_s": status.get("train_tokens_per_s"),
        "trainer_rss_mb": status.get("trainer_rss_mb"),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def options(args: list[str]) -> argparse.Namespace:
    """Parse the benchmark's arguments (see the module docstring)."""

    ap = argparse.ArgumentParser(prog="swarm-node bench learn", add_help=False)
    ap.add_argument("--data-dir")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--no-devnet", action="store_true")
    ap.add_argument("--only")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--policy", default="builtin", choices=("builtin", "qwen2-24m"))
    ap.add_argument("--sapo-budget-s", type=float)
    ap.add_argument("--warm-steps", type=int)
    try:
        opts = ap.parse_args(args)
    except SystemExit:
        raise CommandError(
            f"bench learn: bad arguments {args}; allowed: --data-dir, --rounds, --steps, --seconds, "
            "--no-devnet, --only PARTS, --device, --policy builtin|qwen2-24m, --sapo-budget-s, "
            "--warm-steps"
        ) from None
    unknown = set(opts.only.split(",")) - set(PARTS) if opts.only else set()
    if unknown:
        raise CommandError(f"bench learn: --only takes {','.join(PARTS)}, got {opts.only!r}")
    if opts.warm_steps is not None and (opts.policy == "builtin" or opts.warm_steps < 1):
        raise CommandError("bench learn: --warm-steps N (>= 1) is for --policy qwen2-24m")
    if opts.rounds is not None and opts.rounds < 1:
        raise CommandError(f"bench learn: --rounds must be >= 1, got {opts.rounds}")
    if opts.policy != "builtin" and (not opts.only or "efficiency" in opts.only):
        raise CommandError(
            "bench learn: the devnet runs the built-in policy: --policy qwen2-24m needs --only sapo or async"
        )
    if opts.device != "cpu" and opts.only != "sapo":
        raise CommandError(
            "bench learn: --device other than cpu runs the sapo grid only: add --only sapo"
        )
    return opts


def _policy(
    name: str, device: str, data_dir: str | None, warm_steps: int | None
) -> tuple[Any, Any]:
    """(model on `device`, tokenizer): the cached built-in policy, or a Qwen2 built here
    from `QWEN2_24M` and warm-started on `device` as the built-in one is (at most
    `warm_steps` steps, default the built-in's)."""

    if name == "builtin":
        path, _report, _built = tiny_policy.ensure_policy(data_dir, progress=_say)
        base, tok = load_model_dir(path)
        return base.to(device), tok
    tok = tiny_policy.build_tokenizer(0)
    model = tiny_policy.build_model(tok, seed=0, **QWEN2_24M).to(device)
    _say(
        f"policy {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters on {device}"
    )
    report = tiny_policy.warm_start(model, tok, seed=0, max_steps=warm_steps, progress=_say)
    _say(f"policy {name}: warm start solve rate {report.solve_rate:.3f} after {report.steps} steps")
    return model.eval(), tok


# ------------------------------------------------------------------------------ async
def _async(base: Any, tok: Any, quick: bool, steps: int | None) -> tuple[dict[str, Any], dict]:
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    steps = steps or (3 if quick else 40)
    n_eval = 64 if quick else 512
    items = heldout_items([n for n, w in TASK_MIX for _ in range(w)], n_eval)
    out: dict[str, Any] = {"steps": steps, "heldout_tasks": n_eval}
    status0: dict[str, Any] = {}
    for s in (0, 2, 8):
        model = copy.deepcopy(base)
        trainer = trainer_for(model, tok)
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
    from trainer.engine_hf import HFEngine, torch_threads  # deferred: heavy import

    names = [n for n, w in TASK_MIX for _ in range(w)]
    tasks = TaskSet(3000)
    settings = sampling()
    history = [copy.deepcopy(model.state_dict())]  # weights after each step
    sampler = copy.deepcopy(model)
    engine = HFEngine(sampler, tok, max_batch=64)

    def make(k: int) -> list[Any]:
        sampler.load_state_dict(history[max(0, k - lag)] if lag else model.state_dict())
        items = [(names[(k * 8 + g) % len(names)], k * 8 + g) for g in range(GROUPS_PER_ROUND)]
        with torch_threads(1):
            return generate_groups(
                engine,
                tok,
                tasks,
                items,
                group_size=GROUP,
                settings=settings,
                seed=k,
                version=max(0, k - lag),
            )

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
