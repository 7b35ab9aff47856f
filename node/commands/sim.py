"""`swarm-node sim SCENARIO|FILE --out DIR [--seed N]`: run the swarm simulator.

Loads a built-in scenario or a TOML file (`swarm_sim.scenario`), runs it with progress and
an ETA on stderr (`--quiet`: a line at each quarter only), and writes `results.json`, PNG plots and `report.md` into DIR
(`swarm_sim.report`). A bad scenario is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from node.cli_errors import one_line_errors
from node.errors import CommandError
from node.paths import check_writable
from swarm_sim.report import start_note, write_outputs
from swarm_sim.runner import progress_printer, run_scenario
from swarm_sim.scenario import ScenarioError, load


def main(scenario: str, out: Path, seed: int, quiet: bool = False) -> None:
    """Run `scenario` (a built-in name or a TOML file) with `seed` and write its outputs
    into `out`."""
    try:
        scn = load(scenario)
    except ScenarioError as exc:
        raise CommandError(str(exc)) from None
    check_writable(out, "--out")
    # a gossip run publishes for duration_s, then drains for lifetime_s (Swarm.run)
    publish = scn.workload.duration_s if scn.kind == "gossip" else 0.0
    total = publish + scn.workload.lifetime_s if scn.kind == "gossip" else 0.0
    if not quiet:
        print(f"sim: {scn.name} (seed {seed}) -> {out}", file=sys.stderr, flush=True)
    # quiet: no banner and a progress line only at each quarter of the run
    progress = (
        None
        if scn.kind != "gossip"
        else progress_printer(total, every_fraction=0.25 if quiet else 0.0, publish_s=publish)
    )
    results, info = run_scenario(scn, seed, progress)
    try:
        files = write_outputs(out, results, info)
    except OSError as exc:
        raise CommandError(f"cannot write to {out}: {exc}") from None
    note = start_note(results)
    if note is not None and not quiet:
        print(f"sim: {note}", file=sys.stderr)
    if not quiet:
        print(
            f"sim: done in {info.wall_s:,.1f} s wall, {info.events:,} events;"
            f" wrote {', '.join(f.name for f in files)}",
            file=sys.stderr,
        )


@click.command(name="sim")
@click.argument("scenario")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output directory.")
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed (same seed, same results)."
)
@click.option(
    "--quiet", is_flag=True, help="Less output: a progress line at each quarter of the run."
)
@one_line_errors
def command(scenario: str, out: Path, seed: int, quiet: bool) -> None:
    """Simulate a swarm: SCENARIO is a built-in or a TOML file; writes results.json, plots
    and report.md into --out.

    \b
    Built-ins, and their wall time on a busy 2-core machine:
      broadcast   1,000 peers, a 1 GB version     about 2 min
      gossip-1k   1,000 peers x 10 virtual min    about 30 min
      byzantine   300 peers x 5 min, 12% attack   over 25 min
      churn       500 peers x 20 min, churn       not measured: tens of minutes
      run         300 peers x 30 min, training    not measured: tens of minutes
    The progress line's ETA follows the recent pace (it is an upper bound while the run
    still publishes: the drain after it is lighter)."""
    main(scenario, out, seed, quiet)
