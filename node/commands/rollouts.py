"""`swarm-node rollouts`: generate N signed rollout records offline into a msgpack stream.

The work is `trainer.produce.generate_records` (the inference role's too): counter `c`
gets its task and sampling seed from (run seed, this key's peer id, policy version, c), so
any peer can re-derive and replay it; proofs are built while the next batch generates.
Progress goes to stderr; the summary (reward mean, tokens/s, ...) is returned and printed
as one JSON line on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.console import say as _say
from node.errors import CommandError
from node.keyfile import read_key
from node.local_model import check_datasets, load_engine
from node.paths import check_writable, resolve_model
from node.run_file import load_run_manifest
from trainer.produce import DEFAULT_BATCH_SIZE, generate_records
from trainer.tasks import TaskError

MAX_N = 1_000_000


def main(
    *,
    run: Path | str,
    key: Path | str,
    n: int,
    out: Path | str,
    model: str | None = None,
    data_dir: str | None = None,
    policy_version: int = 0,
    start_counter: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    threads: int | None = None,
    proofs: bool = True,
    quiet: bool = False,
    engine: str = "hf",
) -> dict[str, Any]:
    """Generate `n` records into `out`; returns (and prints on stdout) the summary."""
    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise CommandError(f"--n must be an integer in [1, {MAX_N}], got {n!r}")
    if not 1 <= batch_size <= 4096:
        raise CommandError(f"--batch-size must be in [1, 4096], got {batch_size}")
    if policy_version < 0 or start_counter < 0:
        raise CommandError("--policy-version and --start-counter must be non-negative")
    if threads is not None and threads < 1:
        raise CommandError(f"--threads must be >= 1, got {threads}")
    run, key, out = Path(run), Path(key), Path(out)
    say = (lambda _m: None) if quiet else _say

    manifest = load_run_manifest(run)
    check_datasets(manifest, str(run))
    identity = read_key(key)
    model_path = resolve_model(model, manifest.model, data_dir)
    if out.is_dir():
        raise CommandError(f"--out {out} is a directory; give a file path")
    if not out.parent.exists():
        raise CommandError(f"--out {out}: directory {out.parent} does not exist")
    check_writable(out, "--out")
    gen = load_engine(model_path, batch_size=batch_size, threads=threads, engine=engine)
    build = None
    if proofs:
        from verify.toploc import build_proofs_bytes_many as build  # deferred: heavy import
    try:
        summary = generate_records(
            engine=gen,
            manifest=manifest,
            identity=identity,
            n=n,
            out=out,
            policy_version=policy_version,
            start_counter=start_counter,
            batch_size=batch_size,
            build_proofs=build,
            say=say,
        )
    except TaskError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        gen.close()
    summary["model"] = str(model_path)
    summary["engine"] = engine
    print(json.dumps(summary), flush=True)
    return summary


@click.command(name="rollouts")
@click.option(
    "--run", "run", required=True, type=click.Path(path_type=Path), help="Run manifest TOML."
)
@click.option("--key", required=True, type=click.Path(path_type=Path), help="Identity key file.")
@click.option("--n", "n", required=True, type=int, help="How many rollouts.")
@click.option(
    "--out", required=True, type=click.Path(path_type=Path), help="Output file (msgpack stream)."
)
@click.option("--model", help="Model directory or builtin:tiny (default: the manifest's model).")
@click.option("--data-dir", help="Data directory holding the built-in policy.")
@click.option("--policy-version", default=0, show_default=True, type=int)
@click.option(
    "--start-counter", default=0, show_default=True, type=int, help="First assignment counter."
)
@click.option("--batch-size", default=16, show_default=True, type=int)
@click.option("--threads", type=int, help="Torch CPU threads.")
@click.option(
    "--engine",
    default="hf",
    show_default=True,
    type=click.Choice(["hf", "vllm"]),
    help="Generation engine: transformers or vLLM.",
)
@click.option("--no-proofs", is_flag=True, help="Leave activation proofs empty.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@one_line_errors
def command(no_proofs: bool, **kwargs: Any) -> None:
    """Generate N signed rollout records offline, with activation proofs."""
    main(proofs=not no_proofs, **kwargs)
