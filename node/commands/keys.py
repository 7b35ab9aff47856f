"""`swarm-node keygen` and `swarm-node id`."""

from __future__ import annotations

from pathlib import Path

import click

from node.keyfile import read_key, write_key
from protocol.identity import Identity


def keygen(out: Path, *, force: bool = False) -> None:
    identity = Identity.generate()
    write_key(out, identity, force=force)
    click.echo(f"wrote {out} (mode 0600)", err=True)
    click.echo(identity.peer_id_b58)


def show_id(path: Path) -> None:
    click.echo(read_key(path).peer_id_b58)
