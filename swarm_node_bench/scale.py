"""`swarm-node bench scale`: the node's work on a Qwen2-shaped model of a real size.

The model is `swarm-node init-model --shape` (a `transformers.Qwen2Config` of Qwen2-0.5B,
-1.5B or -7B, vocabulary 151,936, random weights, the real Qwen tokenizer; built once under
the data directory, nothing downloaded). Each part runs in its own child process under a
memory cap (`swarm_node_bench.parts.scale_runner`): a part that cannot fit reports
`"skipped: needs X GiB ..."` before it starts, one that outgrows the cap or is killed for
memory reports `"oom"`, and the bench goes on with the next part. `parts` gives each
part's status; a figure a part could not measure is null, with the reason under
`reasons[figure]`.

Parts (`--parts`, all by default, in this order):

- `load`: `load_s`, `rss_gib`, `gpu_gib` of the model directory loaded as the roles load it
  (fp32); `roles` has the same figures from each role's own process (worker = gen,
  validator = audit, trainer = train, weights).
- `gen` (`swarm_node_bench.parts.scale_gen`): `gen_tokens_per_s` of the worker's rollouts
  (seeded sampler, recorded log-probs, hidden capture, proofs, signed records) and
  `plain_hf_tokens_per_s` of plain transformers `generate`, same model, prompts and batch,
  side by side in one process; `gen_over_plain_hf` their ratio; `capture_overhead`.
- `audit` (`scale_audit`): the validator's audit of those records: `audit_s_per_rollout`
  and its split, `verify_speedup` (gen seconds per rollout ÷ audit seconds per rollout),
  `audit_peak_gib`, `false_fails` (every record is honest).
- `train` (`scale_train`): one optimiser step of the run's trainer over the records:
  `step_s`, `train_tokens_per_s`, `train_peak_gib`.
- `weights` (`scale_weights`): the stepped weights published as a bf16 version and
  installed, through the node's code: `publish_s`, `sha_passes`, `patch_bytes_ratio`,
  `install_full_s`, `install_delta_s`, `hot_swap_s`, `peak_rss_gib`, `loop_max_stall_s`.
- `e2e` (`scale_e2e`): trainer + 2 workers + validator on loopback (`devnet --model`):
  `version_latency_s`, `audited_per_hour`, `stale_fraction`. Skipped at `--quick`.

`--quick`: Qwen2-0.5B at 256 tokens, 4 rollouts at batch 4, a training step of one
micro-batch; about 10 minutes on 2 cores. Full: 64 rollouts at batch 8, steps of
micro-batches of 8 (4 on the CPU). Arguments: `--shape NAME`, `--tokens N` (completion
length: 256 or 1,024 for the issue's figures, fewer for a smoke test; 1,024 turns on the
trainer's activation checkpointing),
`--device cpu|cuda`, `--parts a,b,...`, `--rollouts N`, `--batch N`, `--micro-batch N`,
`--lr X` (the bench run's learning rate), `--cap-gib X` (memory cap per part, default 12),
`--threads N`, `--data-dir DIR`, `--tokenizer PATH` (for the first build), `--out DIR`
(records and the stepped version; default under the data directory), `--duration S` (e2e).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from node.console import say as _say
from node.errors import CommandError
from swarm_node_bench.parts.scale_model import DEFAULT_LR, GIB, need_bytes, params_of
from swarm_node_bench.parts.scale_runner import run_capped
from trainer import shaped_model, tiny_policy

PARTS = ("load", "gen", "audit", "train", "weights", "e2e")
QUICK_SHAPE = "qwen2-0.5b"
DEFAULT_CAP_GIB = 12.0
MAX_TOKENS = 4096
PARTS_PKG = "swarm_node_bench.parts"

# The figures of each part: null, with a reason, when the part did not run to its end.
KEYS: dict[str, tuple[str, ...]] = {
    "load": ("load_s", "rss_gib", "gpu_gib"),
    "gen": (
        "gen_tokens_per_s",
        "plain_hf_tokens_per_s",
        "gen_over_plain_hf",
        "capture_overhead",
        "capture_overhead_parts",
        "gen_s_per_rollout",
        "gen_peak_gib",
        "completion_tokens",
    ),
    "audit": (
        "audit_s_per_rollout",
        "audit_split_s_per_rollout",
        "replay_share",
        "audit_peak_gib",
        "false_fails",
        "fail_reasons",
        "audited",
    ),
    "train": (
        "step_s",
        "train_tokens_per_s",
        "train_completion_tokens_per_s",
        "train_peak_gib",
        "train_sequences",
        "train_input",
        "micro_batch",
    ),
    "weights": (
        "publish_s",
        "sha_passes",
        "patch_bytes_ratio",
        "install_full_s",
        "install_delta_s",
        "hot_swap_s",
        "peak_rss_gib",
        "loop_max_stall_s",
        "loop_stall_by_step",
        "version_bytes",
        "step_source",
    ),
    "e2e": ("version_latency_s", "audited_per_hour", "stale_fraction"),
}
ROLE_OF = {"gen": "worker", "audit": "validator", "train": "trainer", "weights": "weights_role"}


def _parse(quick: bool, args: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="swarm-node bench scale", add_help=False)
    ap.add_argument("--shape", choices=sorted(shaped_model.SHAPES))
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rollouts", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--lr", type=float, default=DEFAULT_LR)
    ap.add_argument("--cap-gib", type=float, default=DEFAULT_CAP_GIB)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--data-dir")
    ap.add_argument("--tokenizer")
    ap.add_argument("--out")
    ap.add_argument("--duration", type=int, default=600)
    try:
        opts = ap.parse_args(args)
    except SystemExit:
        raise CommandError(
            f"bench scale: bad arguments {args}; allowed: --shape, --tokens 256|1024, "
            "--device cpu|cuda, --parts, --rollouts, --batch, --micro-batch, --lr, --cap-gib, "
            "--threads, --data-dir, --tokenizer, --out, --duration"
        ) from None
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise CommandError(f"bench scale: unknown parts {unknown}; known: {', '.join(PARTS)}")
    opts.parts = [p for p in PARTS if p in parts]
    opts.shape = opts.shape or QUICK_SHAPE
    opts.tokens = opts.tokens or 256
    opts.rollouts = opts.rollouts or (4 if quick else 64)
    opts.batch = opts.batch or (4 if quick else 8)
    if opts.micro_batch is None:
        opts.micro_batch = opts.rollouts if quick else (8 if opts.device == "cuda" else 4)
    for name in ("rollouts", "batch", "micro_batch", "duration"):
        if getattr(opts, name) < 1:
            raise CommandError(f"bench scale: --{name.replace('_', '-')} must be >= 1")
    if not 1 <= opts.tokens <= MAX_TOKENS:
        raise CommandError(f"bench scale: --tokens must be in [1, {MAX_TOKENS}], got {opts.tokens}")
    if opts.cap_gib <= 0:
        raise CommandError("bench scale: --cap-gib must be > 0")
    return opts


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments in the module docstring); returns its figures."""
    opts = _parse(quick, args)
    t_start = time.perf_counter()
    cap = opts.cap_gib * GIB
    work = (
        Path(opts.out)
        if opts.out
        else (
            tiny_policy.default_data_dir(opts.data_dir)
            / "bench-scale"
            / f"{opts.shape}-{opts.tokens}"
        )
    )
    work.mkdir(parents=True, exist_ok=True)
    records, after_step = work / "records.msgpack", work / "after_step.safetensors"
    for stale in (records, after_step):
        stale.unlink(missing_ok=True)

    def need(part: str) -> float:
        return need_bytes(part, opts.shape, opts.tokens, opts.batch, opts.micro_batch)

    status: dict[str, str] = {}
    results: dict[str, dict[str, Any]] = {}
    _say(f"bench scale: {opts.shape}, {opts.tokens} tokens, parts {','.join(opts.parts)}")
    built = run_capped(
        f"{PARTS_PKG}.scale_model:build_part",
        {"shape": opts.shape, "data_dir": opts.data_dir, "tokenizer": opts.tokenizer},
        cap_bytes=cap,
        need_bytes=need("build"),
    )
    base = {
        "model_dir": built.get("model_dir"),
        "shape": opts.shape,
        "tokens": opts.tokens,
        "device": opts.device,
        "threads": opts.threads,
        "lr": opts.lr,
        "rollouts": opts.rollouts,
        "batch": opts.batch,
        "micro_batch": opts.micro_batch,
        "records": str(records),
        "after_step": str(after_step) if {"train", "weights"} <= set(opts.parts) else None,
        "work": str(work),
    }
    targets = {
        "load": ("scale_model:load_part", {}),
        "gen": ("scale_gen:gen_part", {"capture_pair": not quick}),
        "audit": ("scale_audit:audit_part", {}),
        "train": (
            "scale_train:train_part",
            {"grad_checkpointing": True if opts.tokens >= 1024 else None},
        ),
        "weights": ("scale_weights:weights_part", {}),
        "e2e": ("scale_e2e:e2e_part", {"duration_s": opts.duration}),
    }
    for part in opts.parts:
        if built.get("status") != "ok":
            status[part] = f"skipped: no model directory ({built.get('status')})"
            continue
        if part == "audit" and status.get("gen") != "ok":
            status[part] = "skipped: needs the gen part's records"
            continue
        if part == "e2e" and quick:
            status[part] = (
                "skipped: --quick (trainer + 2 workers + validator need "
                f"{need('e2e') / GIB:.1f} GiB and a run of {opts.duration} s)"
            )
            continue
        _say(f"bench scale: part {part}")
        target, extra = targets[part]
        res = run_capped(
            f"{PARTS_PKG}.{target}",
            {**base, **extra},
            cap_bytes=cap,
            need_bytes=need(part),
            timeout_s=(opts.duration + 600) if part == "e2e" else 6 * 3600,
        )
        status[part] = res.pop("status")
        results[part] = res
        # each part's figures as soon as it ends: a long run that is stopped keeps them
        _say(f"bench scale: part {part}: {status[part]} {json.dumps(res)}")
    after_step.unlink(missing_ok=True)
    return _assemble(opts, quick, built, status, results, time.perf_counter() - t_start)


def _assemble(
    opts: argparse.Namespace,
    quick: bool,
    built: dict[str, Any],
    status: dict[str, str],
    results: dict[str, dict[str, Any]],
    seconds: float,
) -> dict[str, Any]:
    """The result: every part's keys (null with a reason where not measured)."""
    out: dict[str, Any] = {
        "shape": opts.shape,
        "params": params_of(opts.shape),
        "tokens": opts.tokens,
        "device": opts.device,
        "quick": quick,
        "rollouts": opts.rollouts,
        "gen_batch": opts.batch,
        "lr": opts.lr,
        "cap_gib": opts.cap_gib,
        "model_built": built.get("built"),
        "parts": {p: status.get(p, "not asked") for p in PARTS},
    }
    reasons: dict[str, str] = {}
    for part in PARTS:
        res = results.get(part, {})
        why = status.get(part, "not asked (--parts)")
        for key in KEYS[part]:
            value = res.get(key) if status.get(part) == "ok" else None
            out[key] = value
            if value is None and status.get(part) != "ok":
                reasons[key] = why
            elif value is None:
                reasons[key] = "--device cpu" if key == "gpu_gib" else "not measured by this part"
    out["roles"] = {
        ROLE_OF[p].removesuffix("_role"): results[p].get(ROLE_OF[p])
        for p in ROLE_OF
        if status.get(p) == "ok"
    }
    gen, audit = out["gen_s_per_rollout"], out["audit_s_per_rollout"]
    out["verify_speedup"] = round(gen / audit, 2) if gen and audit else None
    if out["verify_speedup"] is None:
        reasons["verify_speedup"] = "needs both the gen and the audit part"
    out["child_peak_rss_gib"] = {p: r.get("child_peak_rss_gib") for p, r in results.items()}
    out["reasons"] = reasons
    out["seconds"] = round(seconds, 1)
    return out
