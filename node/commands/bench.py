"""`swarm-node bench NAME [--quick] [--json] [ARGS...]`: run one benchmark.

Benchmarks are the modules of the package named `BENCH_PACKAGE` (`<package>.<name>`, each
with `run(quick, args) -> dict`), resolved by name when the command runs: this command is
the one place outside that package and the tests that imports it. The JSON result is the
last line on stdout; without `--json` each figure is also printed on stderr.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import click

from node.cli_errors import one_line_errors
from node.errors import CommandError

BENCH_PACKAGE = "swarm_node_bench"


def available() -> list[str]:
    """The benchmark names the installed package offers."""
    package = importlib.import_module(BENCH_PACKAGE)
    return sorted(p.stem for p in Path(package.__file__ or "").parent.glob("[a-z]*.py"))


def main(name: str, *, quick: bool, args: list[str], as_json: bool) -> None:
    """Run benchmark `name` and print its result (see the module docstring)."""
    if not name.isidentifier():
        raise CommandError(f"unknown benchmark {name!r}")
    module_name = f"{BENCH_PACKAGE}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise CommandError(
            f"unknown benchmark {name!r}; available: {', '.join(available())}"
        ) from None
    result = module.run(quick=quick, args=args)
    if not as_json:
        for key, value in result.items():
            click.echo(f"{key:>32}: {json.dumps(value)}", err=True)
    click.echo(json.dumps(result, sort_keys=False))


@click.command(
    name="bench",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print only the result JSON on stdout.")
@click.option("--quick", is_flag=True, help="A short run (under a minute).")
@click.pass_context
@one_line_errors
def command(ctx: click.Context, name: str, as_json: bool, quick: bool) -> None:
    """Run benchmark NAME; the JSON result is the last line.

    \b
    NAME: adversary, broadcast, churn, codec, generate, gossip, learn, reach, scale, sim,
    verify
    """
    main(name, quick=quick, args=list(ctx.args), as_json=as_json)
