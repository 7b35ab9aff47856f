"""`swarm-node init-model`: build and warm-start the built-in tiny policy (cached).

Writes an ordinary Hugging Face model directory under `<data dir>/models/`, its audit
calibration (`calibration.json` next to the weights, `swarm-node calibrate`; measured once)
and a run manifest for it (`<data dir>/tiny-run.toml`, pinning the calibration's digest)
ready for `swarm-node rollouts --run`.
A second call finds the cache and returns at once (`--force` rebuilds).
Progress goes to stderr; the result is returned and printed as one JSON line on stdout.
"""

from __future__ import annotations

import json
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.commands.calibrate import ensure_calibration
from node.console import say as _say
from node.errors import CommandError
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from trainer import tiny_policy


def main(
    *,
    data_dir: str | None = None,
    seed: int = 0,
    force: bool = False,
    threads: int | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Build (or find) the tiny policy; returns its path, run manifest path and report."""
    if not 0 <= seed < 2**31:
        raise CommandError(f"--seed must be in [0, 2^31), got {seed}")
    if threads is not None and threads < 1:
        raise CommandError(f"--threads must be >= 1, got {threads}")
    say = (lambda _m: None) if quiet else _say
    root = tiny_policy.default_data_dir(data_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        path, report, built = tiny_policy.ensure_policy(
            root, seed=seed, force=force, threads=threads, progress=say
        )
    except OSError as exc:
        raise CommandError(
            f"cannot write to data directory {root}: {exc.strerror or exc}"
        ) from None
    digest = ensure_calibration(path, force=built or force, say=say)
    run_path = root / "tiny-run.toml"
    if not run_path.exists() or force:
        table = tiny_policy.run_manifest_table()
        table.setdefault("verification", {})["calibration_digest"] = digest
        manifest = manifest_from_table(table, source="built-in manifest")
        run_path.write_text(manifest_to_toml(manifest))
    else:
        load_run_manifest(run_path)  # an edited manifest must still be valid
    if seed != 0:
        say("note: rollouts use the built-in model of seed 0 unless --model names this directory")
    say(
        f"{'built' if built else 'cached'}: {path} (solve rate {report['solve_rate']:.1%} "
        f"sampled, {report['greedy_solve_rate']:.1%} greedy; {report['steps']} steps)"
    )
    result = {
        "model_dir": str(path),
        "calibration_digest": digest,
        "run_manifest": str(run_path),
        "built": built,
        "warm_start_solve_rate": report["solve_rate"],
        "greedy_solve_rate": report["greedy_solve_rate"],
        "steps": report["steps"],
        "init_model_seconds": report.get("init_model_seconds"),
        "threads": report["threads"],
        "n_params": report["n_params"],
    }
    print(json.dumps(result), flush=True)
    return result


@click.command(name="init-model")
@click.option(
    "--data-dir", help="Where models are cached (default $SWARM_NODE_DATA or ~/.cache/swarm-node)."
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the build (deterministic)."
)
@click.option("--force", is_flag=True, help="Rebuild even if the cache has it.")
@click.option("--threads", type=int, help="Torch CPU threads.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@one_line_errors
def command(data_dir: str | None, seed: int, force: bool, threads: int | None, quiet: bool) -> None:
    """Build and warm-start the built-in tiny policy (cached; a Hugging Face model directory)."""
    main(data_dir=data_dir, seed=seed, force=force, threads=threads, quiet=quiet)
