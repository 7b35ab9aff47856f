"""`swarm-node train --run RUN.toml ROLLOUTS... [--out DIR]`: the trainer's loop, offline.

Reads rollout record files in order, opens each record (signature, body digest), re-scores
it from its task (`trainer.samples.Rescorer`), queues it (`trainer.train_loop.Trainer`,
staleness bound from the manifest) and steps whenever `groups_per_step` groups are ready.
Each version the run's cadence produces is written as an ordinary model directory
`OUT/v<N>/`; the checkpoint (`OUT/ckpt/`) makes a second invocation continue at the last
version rather than reuse a number. Prints one JSON summary line (admitted, refused by
reason, steps, versions, throughput).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.errors import CommandError
from node.paths import check_writable, resolve_model
from node.run_file import load_run_manifest
from protocol.errors import RemoteProtocolError
from protocol.rollout import open_record, read_records
from trainer.model_dir import ModelDirError, load_model_dir, save_model_dir
from trainer.samples import Refused, Rescorer


def main(
    *,
    run: Path,
    files: list[Path],
    model: str | None = None,
    out: Path | None = None,
    data_dir: str | None = None,
    threads: int = 1,
    micro_batch: int = 8,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train offline on the rollout files with the run's loss and loop; returns the summary
    printed as JSON. Usage errors (no file, a missing file, a bad run file, an unwritable
    `--out`) are found before the heavy imports."""
    if not files:
        raise CommandError("train: give at least one rollout record file", exit_code=2)
    for f in files:
        if not Path(f).is_file():
            raise CommandError(f"{f}: no such file", exit_code=2)
    manifest = load_run_manifest(run)
    check_writable(out or Path("train-out"), "--out")
    path = resolve_model(model, manifest.model, data_dir)
    from trainer.engine_hf import torch_threads  # deferred: heavy import
    from trainer.micro_step import StepSettings  # deferred: heavy import
    from trainer.train_loop import Trainer  # deferred: heavy import

    try:
        net, tokenizer = load_model_dir(path)
    except ModelDirError as exc:
        raise CommandError(str(exc)) from None
    out = out or Path("train-out")

    def publish(version: int, m: Any) -> None:
        save_model_dir(m, tokenizer, out / f"v{version}")

    trainer = Trainer.from_manifest(
        net,
        tokenizer,
        manifest,
        ckpt_dir=out / "ckpt",
        publish=publish,
        step_settings=StepSettings(micro_batch=micro_batch),
    )
    rescorer = Rescorer(manifest, tokenizer)
    admitted = 0
    with torch_threads(threads):
        for f in files:
            try:
                with open(f, "rb") as fh:
                    for data in read_records(fh):
                        try:
                            sample = rescorer.sample(open_record(data))
                        except RemoteProtocolError:
                            trainer.refused["unreadable"] += 1
                            continue
                        except Refused as exc:
                            trainer.refused[exc.reason] += 1
                            continue
                        if trainer.add(sample) is None:
                            admitted += 1
                        stats = trainer.step()
                        if stats is not None and not quiet:
                            print(
                                f"train: step {trainer.steps} version {trainer.version} "
                                f"reward {stats['reward_mean']:.3f} loss {stats.get('loss', 0):.4f}",
                                file=sys.stderr,
                            )
            except OSError as exc:
                raise CommandError(f"{f}: cannot read ({exc.strerror})", exit_code=2) from None
            except RemoteProtocolError as exc:
                raise CommandError(
                    f"{f}: not a rollout record stream ({exc})", exit_code=2
                ) from None
    summary = {"admitted": admitted, **trainer.status(), "out": str(out)}
    summary["versions_published"] = trainer.published
    print(json.dumps(summary))
    return summary


@click.command(name="train")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--run", "run", required=True, type=click.Path(path_type=Path), help="Run manifest TOML."
)
@click.option("--model", help="Model directory or builtin:tiny (default: the manifest's model).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Versions (v<N>/) and checkpoint (ckpt/) go here (default ./train-out).",
)
@click.option("--data-dir", help="Where the built-in policy is cached.")
@click.option("--threads", default=1, show_default=True, type=int, help="Torch CPU threads.")
@click.option(
    "--micro-batch",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Sequences per forward/backward pass; gradients accumulate into one step.",
)
@one_line_errors
def command(files: tuple[Path, ...], **kwargs: Any) -> None:
    """Train on rollout record files offline with the run's loss and loop (debugging, tests)."""
    main(files=list(files), **kwargs)
