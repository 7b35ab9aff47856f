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
