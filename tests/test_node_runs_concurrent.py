"""`swarm-node runs` asks its peers at once: a peer that hangs, listed first, cannot use up
the deadline of an honest peer listed after it."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import trio

from node import join
from node.commands import runs
from node.host import host as host_module

HONEST = "/ip4/127.0.0.1/tcp/3/p2p/honest"


async def test_a_hanging_first_peer_does_not_starve_the_honest_one(monkeypatch) -> None:
    @asynccontextmanager
    async def no_host(*_args: Any, **_kwargs: Any):
        yield object()

    async def ask(_host: Any, addr: str, **_kwargs: Any) -> join.Answer:
        if addr != HONEST:
            await trio.sleep(3600)  # a peer that never answers
        return join.Answer(addr, peer="honest")

    monkeypatch.setattr(host_module, "open_host", no_host)
    monkeypatch.setattr(join, "ask", ask)
    monkeypatch.setattr(runs, "ASK_TIMEOUT_S", 1.0)
    addrs = ["/ip4/127.0.0.1/tcp/1/p2p/hang1", "/ip4/127.0.0.1/tcp/2/p2p/hang2", HONEST]
    answers = await runs._ask_all(addrs)
    assert [a.addr for a in answers] == addrs  # in the order given
    assert [a.answered for a in answers] == [False, False, True]
    assert answers[0].cause == join.TIMED_OUT


def test_runs_prints_only_what_is_signed_and_marks_the_peers_claims(capsys) -> None:
    """A peer whose summary claims manifest version 99 and another authority, next to a
    release signed by its authority as version 5: the signed fields come from the release,
    the rest is printed as the peer's unsigned claim."""
    from node.exchange.runs import ServedRun
    from node.testing.records import net_manifest
    from protocol import run_manifest as rm
    from protocol.identity import Identity

    authority, liar = Identity.generate(), Identity.generate()
    release = rm.seal_release(authority, net_manifest("claims"), 5, 1_700_000_000_000)
    summary = {
        "run": "claims",
        "model": "builtin:tiny",
        "policy_version": 7,
        "manifest_version": 99,
        "authority": liar.peer_id_b58,
        "peers": {"trainer": 40},
        "time_ms": 0,
    }
    row = runs._row(join.Answer(HONEST), ServedRun(release, summary))
    assert row["manifest_version"] == 5 and row["authority"] == authority.peer_id_b58
    assert row["signature"] == "good" and row["claimed"]["manifest_version"] == 99
    runs._print(row)
    lines = capsys.readouterr().out.splitlines()
    signed, claim = " ".join(lines[:2]), lines[2]
    assert "manifest version 5" in signed and authority.peer_id_b58 in signed
    assert "99" not in signed and liar.peer_id_b58 not in signed and "trainer" not in signed
    assert "not signed" in claim and "manifest version 99" in claim
    assert liar.peer_id_b58 in claim and "policy version 7" in claim and "trainer 40" in claim

    forged = rm.seal_release(liar, net_manifest("claims"), 5, 1_700_000_000_000)
    env_row = runs._row(join.Answer(HONEST), ServedRun(forged[:-1] + b"\x00", summary))
    assert env_row["run"] is None and env_row["manifest_version"] is None
    runs._print(env_row)
    out = capsys.readouterr().out
    assert "signature good" not in out and "no verified release" in out and "not signed" in out
