"""`swarm-node calibrate --model DIR [--run RUN.toml] [--n N] [--precisions fp32,bf16]`:
measure honest variation and write the audit limits next to the model
(`DIR/calibration.json`).

With `--run`, the honest rollouts are the run's: its completion length, sampling settings,
proof shape and (unless `--precisions` says otherwise) its workers' precision only.
Worst-case statistics of a rollout grow with its length, so limits measured on short
rollouts do not describe long ones: calibrate at the length the run generates. The
measured block records the completion length and the device that judged.

For each compute precision a run may fix, honest workers generate N rollouts under each
variation an honest network has (KV-cache decode at batch 64, one rollout at a time, one
thread, eager attention; the verifier's prefill right- and left-padded), the audit's
metrics are measured at that precision with no limits (`verify.auditor.raw_metrics`), and
`verify.thresholds.calibrate` sets each limit at 2 x the largest honest value (drift
1.5 x, see METRIC_FACTORS) above the regime's floors. The file (`verify.calibration`) is
written atomically; its content id is printed and belongs in the run manifest
(`[verification] calibration_digest`), which makes every validator use exactly this file.

Recalibrating for another hardware pair (GPU workers, CPU validators): the limits describe
the rounding differences between where rollouts are generated and where they are audited.
Today both sides of the measurement run on this machine: run `calibrate` on the
validators' hardware, and for GPU workers measure the workers' side there too (generate
the honest sets with the workers' engine, e.g. vLLM, and feed their bodies to `measure`'s
`raw_metrics` step), then pin the new digest in the run manifest; validators refuse a file
whose digest is not the pinned one.

`init-model` calibrates the built-in policy once (the file is cached with the model).
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.console import sayer
from node.errors import CommandError
from node.paths import resolve_model
from node.run_file import load_run_manifest, manifest_from_table
from protocol.content_id import content_id
from protocol.wire import WORKER_PRECISIONS
from trainer.engine import SamplingSettings, rollout_body
from trainer.model_dir import ModelDirError, load_model_dir
from trainer.tasks import TaskSet, assign_task
from trainer.tiny_policy import run_manifest_table
from verify.calibration import FILE_NAME, calibration_digest, encode_calibration
from verify.thresholds import BF16_FLOOR, STRICT_FLOOR, calibrate

DEFAULT_N = 32
COUNTER0 = 10**7  # calibration tasks: counters no run of the built-in manifest reaches early
VARIATIONS = ("kv_cache_batch64", "batch_1", "threads_1", "eager_attention", "left_padded_prefill")


_say = sayer("calibrate")


def _bodies(
    model: Any, tok: Any, manifest: Any, n: int, counter0: int, **engine_kw: Any
) -> list[Any]:
    """n honest rollout bodies (assigned tasks, seeded sampling, proofs) from `model`."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import
    from verify.toploc import build_proofs_bytes_many  # deferred: heavy import

    producer = content_id(b"calibration-producer")[:32]
    engine = HFEngine(model, tok, **engine_kw)
    settings = SamplingSettings.from_manifest(manifest)
    tasks = TaskSet(manifest.seed)
    assigns = [assign_task(manifest, producer, c) for c in range(counter0, counter0 + n)]
    prompts = [tok.encode(tasks.task_for(a).prompt, add_special_tokens=False) for a in assigns]
    gens = engine.generate(prompts, settings, [a.task_seed for a in assigns], capture_hidden=True)
    proofs = build_proofs_bytes_many(
        [g.hidden for g in gens], manifest.proof_chunk, manifest.proof_topk
    )
    return [
        rollout_body(p, g, settings, a.task_seed, pl)
        for p, g, a, pl in zip(prompts, gens, assigns, proofs, strict=True)
    ]


def measure(
    model: Any,
    tok: Any,
    manifest: Any,
    *,
    n: int = DEFAULT_N,
    precisions: Sequence[str] = ("fp32", "bf16"),
    say: Callable[[str], None] = _say,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(limits per precision, measurements per precision) from honest rollouts."""
    from verify.auditor import AuditSettings, at_precision, raw_metrics  # deferred: heavy import

    base = AuditSettings(chunk=manifest.proof_chunk, topk=manifest.proof_topk)
    regimes: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for k, precision in enumerate(precisions):
        worker = at_precision(model, precision)
        eager = copy.deepcopy(worker)
        eager.set_attn_implementation("eager")
        st = replace(base, precision=precision)
        c0 = COUNTER0 * (k + 1)
        kv = _bodies(worker, tok, manifest, n, c0, max_batch=64)
        sets = {
            "kv_cache_batch64": (kv, st),
            "batch_1": (_bodies(worker, tok, manifest, n, c0 + n, max_batch=1), st),
            "threads_1": (
                _bodies(worker, tok, manifest, n, c0 + 2 * n, max_batch=64, threads=1),
                st,
            ),
            "eager_attention": (_bodies(eager, tok, manifest, n, c0 + 3 * n, max_batch=64), st),
            "left_padded_prefill": (kv, replace(st, padding_side="left")),
        }
        rows: list[dict[str, float]] = []
        for name, (bodies, settings) in sets.items():
            rows += raw_metrics(model, bodies, settings)
            say(f"{precision}: {name}: {len(bodies)} rollouts measured")
        floor = STRICT_FLOOR if precision == "fp32" else BF16_FLOOR
        regimes[precision] = calibrate(rows, floor)
        keys = sorted({m for r in rows for m in r})
        measured[precision] = {
            "rollouts": len(rows),
            "max_new_tokens": int(manifest.max_new_tokens),
            "judged_on": str(next(model.parameters()).device.type),
            "variations": list(sets),
            "max": {m: float(f"{max(r.get(m, 0.0) for r in rows):.4g}") for m in keys},
        }
    return regimes, measured


def write(model_dir: Path, data: bytes) -> Path:
    """Write the file atomically next to the model."""
    path = model_dir / FILE_NAME
    tmp = model_dir / f".{FILE_NAME}.tmp-{os.getpid()}"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def calibrate_dir(
    model_dir: Path,
    *,
    n: int = DEFAULT_N,
    precisions: Sequence[str] = ("fp32", "bf16"),
    say: Callable[[str], None] = _say,
    manifest: Any = None,
) -> dict[str, Any]:
    """Measure and write `model_dir/calibration.json`; returns the summary printed. The
    honest rollouts follow `manifest` (a run's: completion length, sampling, proof shape),
    by default the built-in policy's calibration manifest."""
    try:
        model, tok = load_model_dir(model_dir)
    except ModelDirError as exc:
        raise CommandError(str(exc)) from None
    if manifest is None:
        manifest = manifest_from_table(run_manifest_table("calibration", seed=11), "calibration")
    regimes, measured = measure(model, tok, manifest, n=n, precisions=precisions, say=say)
    data = encode_calibration(regimes, measured, model=str(model_dir.name))
    path = write(model_dir, data)
    return {
        "calibration": str(path),
        "calibration_digest": calibration_digest(data).hex(),
        "rollouts_per_variation": n,
        "precisions": list(precisions),
        "max_new_tokens": int(manifest.max_new_tokens),
    }


def ensure_calibration(model_dir: Path, *, force: bool, say: Callable[[str], None] = _say) -> str:
    """The model's calibration file (`swarm-node calibrate`), measured once and cached with
    the model; returns its digest (hex). One process measures at a time."""
    path = model_dir / FILE_NAME
    with open(model_dir.parent / f".{model_dir.name}.calibration.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or not path.is_file():
            say("calibrating the audit limits (honest variation, fp32 and bf16 workers)")
            calibrate_dir(model_dir, say=say)
        return calibration_digest(path.read_bytes()).hex()


def main(
    *,
    model: str,
    n: int = DEFAULT_N,
    precisions: str | None = None,
    data_dir: str | None = None,
    run: str | None = None,
) -> dict[str, Any]:
    """Calibrate `model` (n honest rollouts a variation, each precision in `precisions`:
    by default the run's workers' precision with `run`, else fp32 and bf16), at the run's
    completion length and sampling settings when `run` (a run manifest file) is given;
    write the audit limits next to it and print the calibration file's digest; returns the
    summary."""
    manifest = None
    if run is not None:
        try:
            manifest = load_run_manifest(Path(run))
        except (OSError, ValueError) as exc:
            raise CommandError(f"--run {run}: {exc}") from None
    if precisions is None:
        precisions = str(manifest.worker_precision) if manifest is not None else "fp32,bf16"
    wanted = tuple(p.strip() for p in str(precisions).split(",") if p.strip())
    if not wanted or set(wanted) - set(WORKER_PRECISIONS):
        raise CommandError(
            f"--precisions: a comma-separated subset of {', '.join(WORKER_PRECISIONS)}"
        )
    if not 4 <= n <= 4096:
        raise CommandError(f"--n must be in [4, 4096], got {n}")

    result = calibrate_dir(
        resolve_model(model, model, data_dir), n=n, precisions=wanted, manifest=manifest
    )
    print(json.dumps(result), flush=True)
    return result


@click.command(name="calibrate")
@click.option("--model", required=True, help="Model directory (or builtin:tiny).")
@click.option("--n", default=32, show_default=True, help="Honest rollouts per variation.")
@click.option(
    "--precisions", default=None, help="Regimes to calibrate [default: the run's, else fp32,bf16]."
)
@click.option("--data-dir", help="Data directory holding the built-in policy (init-model's).")
@click.option(
    "--run",
    "run",
    default=None,
    help="Run manifest (TOML): calibrate at its completion length, sampling and precision.",
)
@one_line_errors
def command(
    model: str, n: int, precisions: str | None, data_dir: str | None, run: str | None
) -> None:
    """Measure honest variation and write the audit limits next to the model.

    Prints the calibration file's digest, to pin as [verification] calibration_digest.
    """
    main(model=model, n=n, precisions=precisions, data_dir=data_dir, run=run)
