"""`swarm-node ledger`: the node's ledger, line by line.

What this peer produced and how others judged it (direction "out": produced, then accepted
or rejected by a validator, with its reason), and what others sent us and what admission
made of it (direction "in": accepted, or rejected with the reason and the sender). Read
from the node's SQLite store (safe while the node runs). Filters: `--out` / `--in`,
`--rejected`, `--kind`, `--last N` (newest N lines); `--json` prints one JSON object a
line, for pipes. The text form ends with the totals (every line ever logged, those
retention compacted into per-reason totals included, and how many were compacted), so a
filter that matches no line still says what the node holds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.commands.status import work_lines
from node.errors import CommandError
from node.paths import find_node_dir
from node.store.store import DB_FILENAME, LedgerEntry, Store
from protocol.admission import Kind
from protocol.identity import peer_text

# what a ledger line can be about: a rollout this node produced, or a message kind received
KINDS = ("rollout", *(k.value for k in Kind))


def entries(
    data_dir: Path,
    direction: str | None = None,
    rejected: bool = False,
    kind: str | None = None,
    last: int = 100,
) -> list[LedgerEntry]:
    """The newest `last` ledger lines under `data_dir` matching the filters, oldest first."""
    path = data_dir / DB_FILENAME
    if not path.is_file():
        raise CommandError(f"no node store at {path} (has a node run with --data-dir {data_dir}?)")
    if last < 1:
        raise CommandError(f"--last: expected a positive number of lines, got {last}")
    if kind is not None and kind not in KINDS:
        raise CommandError(f"--kind {kind!r}: not a ledger kind; one of {', '.join(KINDS)}")
    with Store(path) as store:
        return store.ledger(
            direction, "rejected" if rejected else None, kind, limit=last, newest=True
        )


def as_dict(e: LedgerEntry) -> dict[str, Any]:
    """One ledger entry as the JSON object `ledger --json` prints."""
    return {
        "seq": e.seq,
        "at": e.at,
        "direction": e.direction,
        "outcome": e.outcome,
        "kind": e.kind,
        "item": e.item_id.hex() if e.item_id else None,
        "peer": peer_text(e.peer) if e.peer is not None else None,
        "reason": e.reason,
        "detail": e.detail,
    }


def totals(data_dir: Path, direction: str | None = None) -> list[str]:
    """The ledger's totals as text: this node's own work (`Store.own_work`; direction
    "out"), what others sent by outcome and how many lines retention compacted into those
    totals ("in"); both for None."""
    with Store(data_dir / DB_FILENAME) as store:
        work = store.own_work()
        summary = store.ledger_summary("in")
        compacted = sum(store.ledger_compacted().values())
    out = [line.replace("own work       ", "totals: own work", 1) for line in work_lines(work)[:1]]
    if direction == "in":
        out = []
    inbound: dict[str, int] = {}
    for (_d, outcome, _r), n in summary.items():
        inbound[outcome] = inbound.get(outcome, 0) + n
    if inbound and direction != "out":
        out.append(
            "totals: received "
            + ", ".join(f"{n} {outcome}" for outcome, n in sorted(inbound.items()))
            + (
                f" ({compacted} older lines compacted into these totals by retention:"
                " not listed line by line)"
                if compacted
                else ""
            )
        )
    return out


def _line(e: LedgerEntry) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
    item = e.item_id.hex()[:12] if e.item_id else "-"
    peer = peer_text(e.peer)[-8:] if e.peer is not None else "-"
    why = f" {e.reason}" if e.reason else ""
    detail = f" ({e.detail})" if e.detail else ""
    return f"{when} {e.direction:<3} {e.outcome:<8} {e.kind:<10} {item} peer {peer}{why}{detail}"


def main(
    data_dir: Path | None,
    direction: str | None,
    rejected: bool,
    kind: str | None,
    last: int,
    as_json: bool,
) -> None:
    """Print the ledger lines of the node at `data_dir`, newest `last`, filtered as the
    flags say."""
    data_dir = find_node_dir(data_dir)
    lines = entries(data_dir, direction, rejected, kind, last)
    for e in lines:
        click.echo(json.dumps(as_dict(e)) if as_json else _line(e))
    if as_json:
        return
    if not lines:
        click.echo(f"ledger of {data_dir}: no lines match")
    for line in totals(data_dir, direction):
        click.echo(line)


@click.command(name="ledger")
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
@one_line_errors
def command(
    data_dir: Path | None,
    direction: str | None,
    rejected: bool,
    kind: str | None,
    last: int,
    as_json: bool,
) -> None:
    """List the node's ledger: its own work (produced, accepted or rejected by validators,
    with reasons) and what others sent it (accepted, or rejected and why)."""
    main(data_dir, direction, rejected, kind, last, as_json)
