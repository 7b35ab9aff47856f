"""`swarm-node keygen` and `swarm-node id`."""

from __future__ import annotations

from pathlib import Path

import click

from node.cli_errors import one_line_errors
from node.keyfile import read_key, write_key
from protocol.identity import Identity


def keygen(out: Path, *, force: bool = False) -> None:
    """Write a new identity key file at `out` and print its peer id."""
    identity = Identity.generate()
    write_key(out, identity, force=force)
    click.echo(f"wrote {out} (mode 0600)", err=True)
    click.echo(identity.peer_id_b58)


def show_id(path: Path) -> None:
    """Print the peer id of the key file at `path`."""
    click.echo(read_key(path).peer_id_b58)


@click.command(name="keygen")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Key file to write."
)
@click.option("--force", is_flag=True, help="Overwrite an existing key file.")
@one_line_errors
def keygen_command(out: Path, force: bool) -> None:
    """Create an Ed25519 identity key file (owner-readable only)."""
    keygen(out, force=force)


@click.command(name="id")
@click.argument("path", type=click.Path(path_type=Path))
@one_line_errors
def id_command(path: Path) -> None:
    """Print the libp2p peer id of a key file."""
    show_id(path)
