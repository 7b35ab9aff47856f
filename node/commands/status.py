"""`swarm-node status`: what a node's data directory says about it.

Reads the node's SQLite store (safe while the node runs: WAL readers do not block the
writer) and prints the stored rollouts, this peer's own work (`Store.own_work`: produced,
delivered to a trainer, audited, trained, too stale, refused, awaiting audit, trained
unaudited), what it accepted and rejected from others and why, and the peers it has banned;
the role's own figures and the installed policy versions (`<data dir>/weights/`) with any
weight download in progress (from the running node's status file).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.errors import CommandError
from node.paths import find_node_dir, node_dirs
from node.store.store import DB_FILENAME, Store
from protocol.identity import peer_text


def collect(data_dir: Path, now: float | None = None) -> dict[str, Any]:
    """The status of the store under `data_dir` as a JSON-ready dict."""
    path = data_dir / DB_FILENAME
    if not path.is_file():
        raise CommandError(f"no node store at {path} (has a node run with --data-dir {data_dir}?)")
    now = time.time() if now is None else now
    with Store(path) as store:
        inbound: dict[str, dict[str, int]] = {}
        for (direction, outcome, reason), n in store.ledger_summary("in").items():
            assert direction == "in"
            bucket = inbound.setdefault(outcome, {})
            bucket[reason or "-"] = bucket.get(reason or "-", 0) + n
        peers = store.load_peers()
        bans = store.active_bans(now)
        live = _read_live(data_dir)
        version = (live or {}).get("policy_version")
        staleness = (live or {}).get("max_staleness")
        return {
            "live": live,
            "weights": _weights(data_dir, live),
            "store": str(path),
            "schema_version": store.schema_version(),
            "rollouts_stored": store.count_rollouts(),
            "own_rollouts": store.produced_status("rollout"),
            "delivery": store.delivery_status(),
            "own_work": store.own_work(
                version if isinstance(version, int) else None,
                staleness if isinstance(staleness, int) else None,
            ),
            "inbound": inbound,
            "peers_scored": len(peers),
            "banned": [
                {
                    "peer": peer_text(r.peer),
                    "until_s": round(r.banned_until - now, 1),
                    "offences": r.offences,
                }
                for r in bans
            ],
        }


def _weights(data_dir: Path, live: dict[str, Any] | None) -> dict[str, Any]:
    """Installed versions from the weights store; the download from the live status."""
    from node.weights.store import WeightsError, WeightsStore  # deferred: heavy import

    out: dict[str, Any] = {"installed": {}, "download": None, "error": None}
    if (data_dir / "weights" / "weights.sqlite3").is_file():
        try:
            store = WeightsStore.open(data_dir)
            try:
                out["installed"] = {str(v): d.hex() for v, d in sorted(store.installed().items())}
            finally:
                store.close()
        except WeightsError as exc:
            out["error"] = str(exc)
    w = (live or {}).get("weights") or {}
    out["download"] = w.get("download")
    out["target"] = w.get("target")
    out["error"] = out["error"] or w.get("error")
    return out


def work_lines(work: dict[str, int]) -> list[str]:
    """This node's own rollouts (`Store.own_work`) as text; none for a node that made none."""
    if not work.get("produced"):
        return []
    return [
        f"own work        {work['produced']} produced, {work['delivered']} delivered,"
        f" {work['audited']} audited, {work['trained']} trained, {work['too_stale']} too stale,"
        f" {work['refused']} refused",
        f"  not judged    {work['awaiting_audit']} awaiting audit,"
        f" {work['trained_unaudited']} trained unaudited",
    ]


def role_lines(role: Any) -> list[str]:
    """The role's own figures (`role_status` of the live status) as text: its numbers on
    one line, each table of numbers on its own, each series by its length and last point."""
    if not isinstance(role, dict) or not role:
        return []
    flat = [f"{k}={v}" for k, v in role.items() if isinstance(v, int | float | str | bool)]
    lines = [f"role            {', '.join(flat)}"] if flat else []
    for key, value in role.items():
        if isinstance(value, dict) and value:
            inner = ", ".join(
                f"{k}={v}" for k, v in value.items() if isinstance(v, int | float | str | bool)
            )
            if inner:
                lines.append(f"  {key:<14}{inner}")
        elif isinstance(value, list) and value:
            lines.append(f"  {key:<14}{len(value)} points, last {json.dumps(value[-1])}")
    return lines


def _state(live: dict[str, Any]) -> str:
    """'live' only for a running node: not marked stopped, its pid alive, written lately."""
    pid = live.get("pid")
    alive = False
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
            alive = True
        except (OSError, OverflowError):
            alive = False
    fresh = time.time() - float(live.get("time", 0) or 0) < 10.0
    if live.get("stopped") or not alive or not fresh:
        return "stopped"
    return "live"


def _read_live(data_dir: Path) -> dict[str, Any] | None:
    """The running node's own `status.json` (written each second by `swarm-node start`)."""
    try:
        live = json.loads((data_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return live if isinstance(live, dict) else None


def main(data_dir: Path | None, as_json: bool) -> None:
    """Show the node at `data_dir` (or every node of a devnet report folder), as text or
    JSON."""
    many = node_dirs(Path(data_dir)) if data_dir else []
    if len(many) > 1:  # a devnet report folder: every node in turn
        for d in many:
            if as_json:
                click.echo(json.dumps({"node": d.parent.name, **collect(d)}))
            else:
                click.echo(f"== {d.parent.name} ==")
                _show(d)
        return
    data_dir = find_node_dir(data_dir)
    if as_json:
        click.echo(json.dumps(collect(data_dir)))
        return
    _show(data_dir)


def _show(data_dir: Path) -> None:
    """The status of one node as text."""
    status = collect(data_dir)
    live = status["live"]
    if live:
        summary = ", ".join(f"{k}={v}" for k, v in live.items() if isinstance(v, int | float | str))
        click.echo(f"{_state(live):<16}{summary}")
        for line in role_lines(live.get("role_status")):
            click.echo(line)
    click.echo(f"store           {status['store']} (schema v{status['schema_version']})")
    click.echo(f"rollouts stored {status['rollouts_stored']}")
    for line in work_lines(status["own_work"]):
        click.echo(line)
    for outcome, reasons in sorted(status["inbound"].items()):
        line = f"inbound {outcome} {sum(reasons.values())}"
        if set(reasons) != {"-"}:
            line += (
                " ("
                + ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items(), key=lambda x: -x[1]))
                + ")"
            )
        click.echo(line)
    refused = (live or {}).get("rejected") or {}
    if refused:
        # Every refusal of the node's last run, with or without a penalty (the ledger keeps
        # only those that cost the sender something).
        detail = ", ".join(f"{r}: {n}" for r, n in sorted(refused.items(), key=lambda x: -x[1]))
        click.echo(f"refused (run)   {sum(refused.values())} ({detail})")
    w = status["weights"]
    versions = ", ".join(f"{v} ({d[:12]})" for v, d in w["installed"].items()) or "none"
    click.echo(f"policy versions {versions}")
    d = w.get("download")
    if d:
        click.echo(
            f"downloading     version {w.get('target')}: {d['bytes_done'] / 2**20:.1f} of "
            f"{d['bytes_total'] / 2**20:.1f} MiB, {d['rate_mib_s']} MiB/s, ETA {d['eta_s']} s"
        )
    if w.get("error"):
        click.echo(f"weights error   {w['error']}")
    for peer, d in ((live or {}).get("dropped_by") or {}).items():
        until = time.strftime("%H:%M:%S", time.localtime(d["until"]))
        if d.get("told"):
            click.echo(f"refused by      {peer}: {d['reason']}, until {until} (as it told us)")
            continue
        click.echo(
            f"dropped by      {peer}: closed our connections {d['closes']} times (last: {d['reason'] or '-'}); "
            f"it may have banned us or find us over its limits (reported until {until} if it stops)"
        )
    click.echo(f"peers scored    {status['peers_scored']}, banned now {len(status['banned'])}")
    for ban in status["banned"]:
        click.echo(
            f"  banned {ban['peer']} for {ban['until_s']} s more ({ban['offences']} offences)"
        )


@click.command(name="status")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="The node's data directory, a devnet node folder or a devnet report folder "
    "(every node) (default: the one node under <data root>/nodes/).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (one a node).")
@one_line_errors
def command(data_dir: Path | None, as_json: bool) -> None:
    """Show a node's store: rollouts, its own work's verdicts, rejections, bans."""
    main(data_dir=data_dir, as_json=as_json)
