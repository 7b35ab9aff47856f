"""`swarm-node runs MULTIADDR...`: the runs that bootstrap peers serve.

    run 'demo'  model builtin:tiny  manifest version 2
      authority 12D3KooW... (signature good)
      the peer says (not signed): policy version 3; peers: trainer 1, validator 1, inference 4
      served by /ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...

Every field on the first two lines comes from the release, once its signature checks; what
the peer says of itself besides (policy version, peers, and any version or authority that
differs from the release's) is printed as its unsigned claim. A release whose signature
does not check is shown with the reason (unsigned, bad signature) and nothing of it but
the claim. Nothing here decides whom to trust: `start --join` does. Exit 1 when no peer
answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import trio

from node.cli_errors import one_line_errors
from node.commands.addrs import check_addrs
from node.errors import CommandError
from protocol import run_manifest as rm
from protocol.identity import Identity, peer_id_to_b58

ASK_TIMEOUT_S = 30.0


def main(addrs: list[str], *, as_json: bool = False) -> None:
    """Ask every peer at `addrs` which runs it serves and print them (a table, each peer's
    runs as soon as it answered; or one JSON object at the end)."""
    addrs = check_addrs(addrs, "MULTIADDR", need_peer=True)
    from node import join  # deferred: heavy import

    join.quiet_library_logs()

    def shown(answer: Any) -> None:
        if not as_json and answer.answered:
            for served in answer.runs:
                _print(_row(answer, served))

    answers = trio.run(_ask_all, addrs, shown)
    if as_json:
        rows = [_row(a, r) for a in answers if a.answered for r in a.runs]
        failed = {a.addr: a.why() for a in answers if not a.answered}
        click.echo(json.dumps({"runs": rows, "failed": failed}))
    else:
        for a in answers:
            if not a.answered:
                click.echo(f"{a.addr}: no run: {a.why()}")
    if not any(a.answered for a in answers):
        raise CommandError("no peer answered with a run", exit_code=1)


async def _ask_all(addrs: list[str], on_answer: Callable[[Any], None] | None = None) -> list[Any]:
    """Ask every address at once (a slow or hanging peer cannot use up the others' time),
    within one deadline; an address that has not answered by then is reported timed out.
    `on_answer(answer)` is called as each answer arrives."""
    from node import join  # deferred: heavy import
    from node.host.host import open_host  # deferred: heavy import

    answers: dict[int, join.Answer] = {}

    async def ask_one(host: Any, index: int, addr: str) -> None:
        answers[index] = await join.ask(host, addr)
        if on_answer is not None:
            on_answer(answers[index])

    with trio.move_on_after(ASK_TIMEOUT_S):
        async with open_host(Identity.generate().private_bytes(), ["/ip4/127.0.0.1/tcp/0"]) as host:
            async with trio.open_nursery() as nursery:
                for index, addr in enumerate(addrs):
                    nursery.start_soon(ask_one, host, index, addr)
    return [
        answers.get(index)
        or join.Answer(addr, cause=join.TIMED_OUT, detail=f"no answer within {ASK_TIMEOUT_S:g} s")
        for index, addr in enumerate(addrs)
    ]


# What a peer says of its run besides the release, printed as its claim.
CLAIMED = ("run", "model", "manifest_version", "authority", "policy_version", "peers")


def _row(answer: Any, served: Any) -> dict[str, Any]:
    """One run as printed: `run`, `model`, `manifest_version` and `authority` from the
    verified release (None when its signature does not check), `signature`, and `claimed`:
    what the peer's own summary says, unverified."""
    verdict = rm.check(served.release, None, None)
    claimed = {k: served.summary.get(k) for k in CLAIMED if k in served.summary}
    row: dict[str, Any] = {
        "run": None,
        "model": None,
        "manifest_version": None,
        "authority": None,
        "signature": str(verdict),
        "claimed": claimed,
        "served_by": answer.addr,
    }
    if isinstance(verdict, rm.Adopt):
        release = verdict.release
        row.update(
            run=release.manifest.run_id,
            model=release.manifest.model,
            manifest_version=release.manifest_version,
            authority=peer_id_to_b58(release.authority),
            signature="good",
        )
    return row


def _claim_text(row: dict[str, Any]) -> str:
    """The peer's claims: those the release does not carry, and those it contradicts."""
    claimed = row["claimed"]
    parts = []
    for key in ("run", "model", "manifest_version", "authority"):
        if key in claimed and claimed[key] != row[key]:
            parts.append(f"{key.replace('_', ' ')} {claimed[key]!r}")
    if "policy_version" in claimed:
        parts.append(f"policy version {claimed['policy_version']}")
    if isinstance(claimed.get("peers"), dict):
        peers = ", ".join(f"{role} {n}" for role, n in sorted(claimed["peers"].items()))
        parts.append(f"peers: {peers or 'none known'}")
    return "; ".join(parts)


def _print(row: dict[str, Any]) -> None:
    if row["signature"] == "good":
        click.echo(
            f"run {row['run']!r}  model {row['model']}  manifest version {row['manifest_version']}"
        )
        click.echo(f"  authority {row['authority']} (signature good)")
    else:
        click.echo(f"run: no verified release: {row['signature']}")
    claims = _claim_text(row)
    if claims:
        click.echo(f"  the peer says (not signed): {claims}")
    click.echo(f"  served by {row['served_by']}")


@click.command(name="runs")
@click.argument("addrs", nargs=-1, required=True, metavar="MULTIADDR...")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@one_line_errors
def command(addrs: tuple[str, ...], as_json: bool) -> None:
    """List the runs the peers at MULTIADDR... serve."""
    main(list(addrs), as_json=as_json)
