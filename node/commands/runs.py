"""`swarm-node runs MULTIADDR...`: the runs that bootstrap peers serve.

    run 'demo'  model builtin:tiny  policy version 3  manifest version 2
      authority 12D3KooW... (signature good)
      peers: trainer 1, validator 1, inference 4
      served by /ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...

A release whose signature does not check is shown with the reason (unsigned, bad signature);
nothing here decides whom to trust: `start --join` does. Exit 1 when no peer answered.
"""

from __future__ import annotations

import json
from typing import Any

import click
import trio

from node.cli_errors import one_line_errors
from node.commands.addrs import check_addrs
from node.errors import CommandError
from protocol import run_manifest as rm
from protocol.identity import Identity

ASK_TIMEOUT_S = 30.0


def main(addrs: list[str], *, as_json: bool = False) -> None:
    """Ask every peer at `addrs` which runs it serves and print them (a table, or one JSON
    object)."""
    addrs = check_addrs(addrs, "MULTIADDR", need_peer=True)
    from node import join  # deferred: heavy import

    join.quiet_library_logs()
    answers = trio.run(_ask_all, addrs)
    rows = [_row(a, r) for a in answers if a.answered for r in a.runs]
    if as_json:
        failed = {a.addr: a.why() for a in answers if not a.answered}
        click.echo(json.dumps({"runs": rows, "failed": failed}))
    else:
        for row in rows:
            _print(row)
        for a in answers:
            if not a.answered:
                click.echo(f"{a.addr}: no run: {a.why()}")
    if not any(a.answered for a in answers):
        raise CommandError("no peer answered with a run", exit_code=1)


async def _ask_all(addrs: list[str]) -> list[Any]:
    """Ask every address at once (a slow or hanging peer cannot use up the others' time),
    within one deadline; an address that has not answered by then is reported timed out."""
    from node import join  # deferred: heavy import
    from node.host.host import open_host  # deferred: heavy import

    answers: dict[int, join.Answer] = {}

    async def ask_one(host: Any, index: int, addr: str) -> None:
        answers[index] = await join.ask(host, addr)

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


def _row(answer: Any, served: Any) -> dict[str, Any]:
    verdict = rm.check(served.release, None, None)
    s = served.summary
    return {
        "run": s["run"],
        "model": s["model"],
        "policy_version": s["policy_version"],
        "manifest_version": s["manifest_version"],
        "authority": s["authority"],
        "signature": "good" if isinstance(verdict, rm.Adopt) else str(verdict),
        "peers": s["peers"],
        "served_by": answer.addr,
    }


def _print(row: dict[str, Any]) -> None:
    click.echo(
        f"run {row['run']!r}  model {row['model']}  policy version {row['policy_version']}"
        f"  manifest version {row['manifest_version']}"
    )
    click.echo(f"  authority {row['authority'] or '(none)'} (signature {row['signature']})")
    peers = ", ".join(f"{role} {n}" for role, n in sorted(row["peers"].items())) or "none known"
    click.echo(f"  peers: {peers}")
    click.echo(f"  served by {row['served_by']}")


@click.command(name="runs")
@click.argument("addrs", nargs=-1, required=True, metavar="MULTIADDR...")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@one_line_errors
def command(addrs: tuple[str, ...], as_json: bool) -> None:
    """List the runs the peers at MULTIADDR... serve."""
    main(list(addrs), as_json=as_json)
