"""The `swarm-node` command: argument parsing and dispatch only.

Each command's work lives in `node.commands.<name>`, imported when the command runs so that
`swarm-node --help` does not load torch. Benchmarks live in the top-level `bench` package
(`bench.<name>`), which may import every layer; this module's `bench` command is the one
place outside `bench/` and `tests/` that imports it, lazily.
A `CommandError` becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from node.commands.devnet_evaluation import FINAL_EVAL_TASKS
from node.errors import CommandError


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn `CommandError` (and unreadable files) into `swarm-node: error: ...` + exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CommandError as exc:
            click.echo(f"swarm-node: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except BaseExceptionGroup as group:
            # A CommandError raised inside a trio nursery arrives wrapped in a group.
            found = _first_command_error(group)
            if found is None:
                raise
            click.echo(f"swarm-node: error: {found}", err=True)
            sys.exit(found.exit_code)
        except KeyboardInterrupt:
            click.echo("swarm-node: interrupted", err=True)
            sys.exit(130)

    return wrapper


def _first_command_error(group: BaseExceptionGroup) -> CommandError | None:
    """The first `CommandError` anywhere inside an exception group (nested groups too)."""
    for exc in group.exceptions:
        if isinstance(exc, CommandError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (inner := _first_command_error(exc)):
            return inner
    return None


def _command_path(ctx: click.Context | None) -> str:
    """`swarm-node <command>` for a context, whatever name the program was started by."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["swarm-node", *reversed(names)])


class _Cli(click.Group):
    """The command group; a usage error is one line on stderr (exit 2), as every other error."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.UsageError as exc:
            click.echo(
                f"swarm-node: error: {exc.format_message()} "
                f"(see '{_command_path(exc.ctx)} --help')",
                err=True,
            )
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"swarm-node: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("swarm-node: interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="swarm-node")
def cli() -> None:
    """swarm-node: a peer of a decentralized RL training network."""


@cli.command()
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Key file to write."
)
@click.option("--force", is_flag=True, help="Overwrite an existing key file.")
@_one_line_errors
def keygen(out: Path, force: bool) -> None:
    """Create an Ed25519 identity key file (owner-readable only)."""
    from node.commands import keys

    keys.keygen(out, force=force)


@cli.command(name="id")
@click.argument("path", type=click.Path(path_type=Path))
@_one_line_errors
def id_(path: Path) -> None:
    """Print the libp2p peer id of a key file."""
    from node.commands import keys

    keys.show_id(path)


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print only the result JSON on stdout.")
@click.option("--quick", is_flag=True, help="A short run (under a minute).")
@click.pass_context
@_one_line_errors
def bench(ctx: click.Context, name: str, as_json: bool, quick: bool) -> None:
    """Run benchmark NAME; the JSON result is the last line.

    \b
    NAME: adversary, broadcast, churn, codec, generate, gossip, learn, reach, sim, verify
    """
    if not name.isidentifier():
        raise CommandError(f"unknown benchmark {name!r}")
    try:
        module = importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"bench.{name}":
            raise
        import bench as benches

        available = sorted(p.stem for p in Path(benches.__file__).parent.glob("[a-z]*.py"))
        raise CommandError(
            f"unknown benchmark {name!r}; available: {', '.join(available)}"
        ) from None
    result = module.run(quick=quick, args=list(ctx.args))
    if not as_json:
        for key, value in result.items():
            click.echo(f"{key:>32}: {json.dumps(value)}", err=True)
    click.echo(json.dumps(result, sort_keys=False))


@cli.command()
@click.option(
    "--role",
    type=click.Choice(["inference", "trainer", "validator", "relay"]),
    help="What this node does (or node.role in --config; default inference).",
)
@click.option(
    "--run", "run", type=click.Path(path_type=Path), help="Run manifest TOML (or node.run)."
)
@click.option("--key", type=click.Path(path_type=Path), help="Identity key file (or node.key).")
@click.option("--listen", multiple=True, help="Multiaddr to listen on (repeatable).")
@click.option(
    "--bootstrap", multiple=True, help="Multiaddr of a peer, ending in /p2p/<id> (repeatable)."
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="This node's directory: store, status file, models/ (default <data root>/nodes/...).",
)
@click.option("--model", help="Model directory or builtin:tiny (default: the manifest's model).")
@click.option("--config", type=click.Path(path_type=Path), help="Node configuration TOML.")
@click.option("--batch-size", type=int, help="Inference batch size.")
@click.option("--audit-fraction", type=float, help="Validator: share of rollouts to audit.")
@click.option("--max-rollouts", type=int, help="Inference: stop producing after this many.")
@click.option(
    "--rollouts-per-version",
    type=int,
    help="Inference: make at most this many rollouts per published version (0: no bound).",
)
@click.option(
    "--local-train",
    metavar="I:J",
    help="Inference: train an own copy on I own + J swarm groups a round (never published).",
)
@click.option("--duration", type=float, help="Stop by itself after this many seconds.")
@click.option(
    "--publish-every", type=float, help="Trainer: publish perturbed weights every S seconds."
)
@click.option("--upload-limit", type=float, help="Weight shard upload cap, MiB/s (0: none).")
@click.option(
    "--micro-batch",
    type=click.IntRange(min=1),
    help="Trainer: sequences per forward/backward pass of a step (default 8).",
)
@click.option("--threads", default=1, show_default=True, type=int, help="Torch CPU threads.")
@click.option(
    "--engine", type=click.Choice(["hf", "vllm"]), help="Inference: generation engine (default hf)."
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option(
    "--join",
    multiple=True,
    metavar="MULTIADDR",
    help="Find the run at this peer instead of --run (repeatable; also a bootstrap peer).",
)
@click.option(
    "--authority",
    metavar="PEER_ID",
    help="With --join: the run authority to trust (default: trust on first use).",
)
@click.option(
    "--metrics",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (or node.metrics).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines on stderr: text, or one JSON object a line (or node.log_format).",
)
@click.option(
    "--relay-limit",
    multiple=True,
    metavar="NAME=N",
    help="Role relay: one of the [relay] limits, like max_reservations=64 (repeatable).",
)
@_one_line_errors
def start(**kwargs: Any) -> None:
    """Join a training run as one role (inference, trainer, validator, relay)."""
    import signal

    # Until the node runs (it then handles both signals itself and exits 0 once stopped),
    # SIGTERM stops start-up as SIGINT does; either way the exit status is 0.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    from node.commands import start as cmd

    try:
        cmd.main(**kwargs)
    except KeyboardInterrupt:
        click.echo("swarm-node: stopped before it was running", err=True)
    except BaseExceptionGroup as group:  # raised inside a trio nursery
        if group.split(KeyboardInterrupt)[1] is not None:
            raise
        click.echo("swarm-node: stopped before it was running", err=True)


@cli.command()
@click.option("--inference", default=3, show_default=True, help="Inference workers.")
@click.option("--validators", default=1, show_default=True, help="Validators.")
@click.option("--relays", default=0, show_default=True, help="Relays.")
@click.option("--duration", default=300.0, show_default=True, help="Seconds to run, then stop.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Report directory (default ./devnet-reports/<time>).",
)
@click.option(
    "--run",
    "run",
    type=click.Path(path_type=Path),
    help="Run manifest (default: the built-in tiny run).",
)
@click.option("--audit-fraction", default=0.25, show_default=True, help="Validator audit share.")
@click.option("--batch-size", default=16, show_default=True, help="Inference and audit batch size.")
@click.option("--no-live", is_flag=True, help="Plain progress lines instead of a live table.")
@click.option(
    "--publish-every",
    default=0.0,
    show_default=True,
    help="Trainer publishes perturbed weights every S seconds (0: never).",
)
@click.option(
    "--pace",
    default=1.1,
    show_default=True,
    help="Workers together make this many times what the trainer trains per version (0: flat out).",
)
@click.option(
    "--eval-tasks",
    default=FINAL_EVAL_TASKS,
    show_default=True,
    help="Held-out tasks (2 samples each) on which the warm start and the last version are compared "
    "after the stop (0: skip).",
)
@_one_line_errors
def devnet(no_live: bool, **kwargs: Any) -> None:
    """Run a local swarm of real processes on loopback with the built-in tiny policy."""
    import signal

    from node.commands import devnet as cmd

    report = cmd.main(live=not no_live, **kwargs)
    if report.get("stopped_by"):
        # stopped by a signal: the report is written, the exit status says which signal
        sys.exit(128 + int(signal.Signals[report["stopped_by"]]))


@cli.command()
@click.argument("scenario")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output directory.")
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed (same seed, same results)."
)
@click.option(
    "--quiet", is_flag=True, help="Less output: a progress line at each quarter of the run."
)
@_one_line_errors
def sim(scenario: str, out: Path, seed: int, quiet: bool) -> None:
    """Simulate a swarm: SCENARIO is a built-in (gossip-1k, churn, byzantine, broadcast, run)
    or a TOML file; writes results.json, plots and report.md into --out."""
    from node.commands import sim as cmd

    cmd.main(scenario, out, seed, quiet)


@cli.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--model", default="builtin:tiny", show_default=True, help="Model directory (or builtin:tiny)."
)
@click.option(
    "--run",
    "--manifest",
    "manifest",
    type=click.Path(path_type=Path),
    help="Run manifest: re-derive tasks and re-score rewards.",
)
@click.option("--data-dir", help="Data directory holding the built-in policy (init-model's).")
@click.option(
    "--precision",
    help="Without a manifest: the workers' compute precision, fp32 (default) or bf16.",
)
@click.option(
    "--model-version", default=0, show_default=True, type=int, help="The version --model holds."
)
@click.option(
    "--versions",
    type=click.Path(path_type=Path),
    help="Directory of model directories named by policy version (DIR/3).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per rollout.")
@_one_line_errors
def audit(
    files: tuple[Path, ...],
    model: str,
    manifest: Path | None,
    data_dir: str | None,
    precision: str | None,
    model_version: int,
    versions: Path | None,
    as_json: bool,
) -> None:
    """Audit rollout records: proofs, sampling replay, log-probs, termination, reward.

    Exit status 0 when every rollout passed, 1 when any failed, 2 on usage or IO errors.
    """
    from node.commands import audit as cmd

    sys.exit(
        cmd.main(
            files=list(files),
            model=model,
            as_json=as_json,
            manifest=manifest,
            data_dir=data_dir,
            precision=precision,
            model_version=model_version,
            versions=versions,
        )
    )


@cli.command()
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
@_one_line_errors
def train(files: tuple[Path, ...], **kwargs: Any) -> None:
    """Train on rollout record files offline with the run's loss and loop (debugging, tests)."""
    from node.commands import train as cmd

    cmd.main(files=list(files), **kwargs)


@cli.command()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="The node's data directory, a devnet node folder or a devnet report folder "
    "(every node) (default: the one node under <data root>/nodes/).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (one a node).")
@_one_line_errors
def status(data_dir: Path | None, as_json: bool) -> None:
    """Show a node's store: rollouts, its own work's verdicts, rejections, bans."""
    from node.commands import status as cmd

    cmd.main(data_dir=data_dir, as_json=as_json)


@cli.command()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="The node's directory (default: the one node under <data root>/nodes/).",
)
@click.option("--out", "direction", flag_value="out", help="Only this node's own work.")
@click.option("--in", "direction", flag_value="in", help="Only what others sent us.")
@click.option("--rejected", is_flag=True, help="Only rejections.")
@click.option("--kind", help="Only this kind (rollout, verdict, rollout_header, ...).")
@click.option("--last", default=100, show_default=True, help="The newest N lines.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@_one_line_errors
def ledger(
    data_dir: Path | None,
    direction: str | None,
    rejected: bool,
    kind: str | None,
    last: int,
    as_json: bool,
) -> None:
    """List the node's ledger: its own work (produced, accepted or rejected by validators,
    with reasons) and what others sent it (accepted, or rejected and why)."""
    from node.commands import ledger as cmd

    cmd.main(data_dir, direction, rejected, kind, last, as_json)


@cli.command()
@click.option("--model", required=True, help="Model directory (or builtin:tiny).")
@click.option("--n", default=32, show_default=True, help="Honest rollouts per variation.")
@click.option("--precisions", default="fp32,bf16", show_default=True, help="Regimes to calibrate.")
@click.option("--data-dir", help="Data directory holding the built-in policy (init-model's).")
@_one_line_errors
def calibrate(model: str, n: int, precisions: str, data_dir: str | None) -> None:
    """Measure honest variation and write the audit limits next to the model.

    Prints the calibration file's digest, to pin as [verification] calibration_digest.
    """
    from node.commands import calibrate as cmd

    cmd.main(model=model, n=n, precisions=precisions, data_dir=data_dir)


@cli.command(name="init-model")
@click.option(
    "--data-dir", help="Where models are cached (default $SWARM_NODE_DATA or ~/.cache/swarm-node)."
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the build (deterministic)."
)
@click.option("--force", is_flag=True, help="Rebuild even if the cache has it.")
@click.option("--threads", type=int, help="Torch CPU threads.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@_one_line_errors
def init_model(
    data_dir: str | None, seed: int, force: bool, threads: int | None, quiet: bool
) -> None:
    """Build and warm-start the built-in tiny policy (cached; a Hugging Face model directory)."""
    from node.commands import init_model as cmd

    cmd.main(data_dir=data_dir, seed=seed, force=force, threads=threads, quiet=quiet)


@cli.command()
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
@_one_line_errors
def rollouts(no_proofs: bool, **kwargs: Any) -> None:
    """Generate N signed rollout records offline, with activation proofs."""
    from node.commands import rollouts as cmd

    cmd.main(proofs=not no_proofs, **kwargs)


from node.cli_runs import register  # noqa: E402 - its commands need the helpers above

register(cli, _one_line_errors)


def main() -> None:
    sys.exit(cli())


if __name__ == "__main__":
    main()
