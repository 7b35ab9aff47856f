"""The `swarm-node` commands about finding and checking runs: `run sign`, `runs`, `doctor`
(`register` adds them to the command group of `node.cli`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def register(cli: click.Group, one_line_errors: Callable[..., Any]) -> None:
    """Add `run sign`, `runs` and `doctor` to `cli`."""

    @cli.group(name="run")
    def run_group() -> None:
        """Release a run: sign its manifest as the run authority."""

    @run_group.command(name="sign")
    @click.argument("path", type=click.Path(path_type=Path))
    @click.option(
        "--key",
        required=True,
        type=click.Path(path_type=Path),
        help="The run authority's key file.",
    )
    @click.option(
        "--version",
        "version",
        type=int,
        help="Manifest version (default: one above the file's current release, or 1).",
    )
    @click.option("--out", type=click.Path(path_type=Path), help="Write here instead of in place.")
    @one_line_errors
    def sign(path: Path, key: Path, version: int | None, out: Path | None) -> None:
        """Sign run file PATH as the run authority (adds a [release] section)."""
        from node.commands import run_sign

        run_sign.main(path, key, version, out)

    @cli.command()
    @click.argument("addrs", nargs=-1, required=True, metavar="MULTIADDR...")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
    @one_line_errors
    def runs(addrs: tuple[str, ...], as_json: bool) -> None:
        """List the runs the peers at MULTIADDR... serve."""
        from node.commands import runs as cmd

        cmd.main(list(addrs), as_json=as_json)

    @cli.command()
    @click.option(
        "--join", multiple=True, metavar="MULTIADDR", help="Bootstrap peer to join through."
    )
    @click.option("--run", "run", type=click.Path(path_type=Path), help="Run manifest TOML.")
    @click.option(
        "--bootstrap", multiple=True, metavar="MULTIADDR", help="With --run: a bootstrap peer."
    )
    @click.option(
        "--role",
        type=click.Choice(["inference", "trainer", "validator", "relay"]),
        default="inference",
        show_default=True,
        help="The role to check resources for.",
    )
    @click.option("--authority", metavar="PEER_ID", help="The run authority to trust.")
    @click.option("--listen", multiple=True, help="Multiaddr to listen on (default the config's).")
    @click.option("--data-dir", type=click.Path(path_type=Path), help="The node's data directory.")
    @click.option("--config", type=click.Path(path_type=Path), help="Node configuration TOML.")
    @one_line_errors
    def doctor(**kwargs: Any) -> None:
        """Check that this machine can join a run; one line per check (exit 0: it can)."""
        import sys

        from node.commands import doctor as cmd

        sys.exit(cmd.main(**kwargs))
