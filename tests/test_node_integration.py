"""Integration: real peer processes on 127.0.0.1 (py-libp2p, SQLite), synthetic signed records.

One scenario, step by step, every wait bounded: 5 peers join through one bootstrap peer
(peer exchange finds the rest); two produce and every peer gets every header and body;
one is frozen (SIGSTOP) and dropped while the others carry on; one is killed with -9
mid-run and restarted from its data directory (what it had acknowledged is still there,
and it receives new work); a peer that sends malformed and oversized messages and garbage
requests is disconnected and banned, and the others are unaffected.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from node.testing.peer_process import PeerProcess

pytestmark = [pytest.mark.network, pytest.mark.slow]


async def _spawn(tmp: Path, name: str, *extra: str, key: str = "") -> PeerProcess:
    args = ["--data-dir", str(tmp / name), "--dead-after", "4", "--max-life", "240"]
    if key:
        args += ["--key", key]
    return await PeerProcess.start(
        *args,
        *extra,
        module="node.testing.net_peer",
        stderr_path=str(tmp / f"{name}.log"),
        timeout=90,
    )


async def _stats(p: PeerProcess) -> dict:
    return await p.ask({"cmd": "stats"}, timeout=60)


async def _wait(what: str, check: Callable, timeout: float, every: float = 0.5):  # type: ignore[no-untyped-def]
    """Poll `await check()` until it returns a truthy value; fail with `what` after `timeout`."""
    last = None
    with trio.move_on_after(timeout):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")


async def _ids(p: PeerProcess) -> set[str]:
    return set((await p.ask({"cmd": "ids"}, timeout=60))["ids"])


async def test_five_peers_delivery_freeze_kill_restart_and_a_malicious_peer(tmp_path: Path) -> None:
    procs: list[PeerProcess] = []
    try:
        boot = await _spawn(tmp_path, "p0")
        procs.append(boot)
        keys = [os.urandom(32).hex() for _ in range(4)]
        async with trio.open_nursery() as nursery:
            started: dict[int, PeerProcess] = {}

            async def start(i: int) -> None:
                started[i] = await _spawn(
                    tmp_path, f"p{i}", "--bootstrap", boot.addrs[0], key=keys[i - 1]
                )

            for i in range(1, 5):
                nursery.start_soon(start, i)
        p1, p2, p3, p4 = (started[i] for i in range(1, 5))
        procs += [p1, p2, p3, p4]
        peers = [boot, p1, p2, p3, p4]

        async def meshed() -> bool:
            return all([len((await _stats(p))["connected"]) >= 3 for p in peers])

        await _wait("every peer connected to >= 3 others", meshed, 60)

        # 1. delivery: two producers, every peer stores every header and body
        await p1.ask({"cmd": "produce", "n": 10, "rate": 4})
        await p2.ask({"cmd": "produce", "n": 10, "rate": 4})

        async def all_have(group: list[PeerProcess], n: int) -> bool:
            return all([len(await _ids(p)) >= n for p in group])

        await _wait("20 records everywhere", lambda: all_have(peers, 20), 90)
        reference = await _ids(p1)
        for p in peers:
            assert await _ids(p) == reference

        # 2. freeze p3: it is dropped within 10 s, the others keep delivering
        os.kill(p3.proc.pid, signal.SIGSTOP)
        try:
            await p1.ask({"cmd": "produce", "n": 10, "rate": 4})
            live = [boot, p1, p2, p4]

            async def p3_dropped() -> bool:
                return all([p3.peer_id not in (await _stats(p))["connected"] for p in live])

            await _wait("everyone dropped the frozen peer", p3_dropped, 20)
            await _wait("30 records at the live peers", lambda: all_have(live, 30), 90)
        finally:
            os.kill(p3.proc.pid, signal.SIGCONT)
        p3.proc.kill()
        await p3.proc.wait()
        procs.remove(p3)

        # 3. kill -9 p4 mid-run, then restart it from its data directory
        p4_before = await _ids(p4)
        await p2.ask({"cmd": "produce", "n": 10, "rate": 4})
        await trio.sleep(1.0)
        p4.proc.kill()
        await p4.proc.wait()
        procs.remove(p4)
        live = [boot, p1, p2]
        await _wait("40 records at the live peers", lambda: all_have(live, 40), 90)
        p4 = await _spawn(tmp_path, "p4", "--bootstrap", boot.addrs[0], key=keys[3])
        procs.append(p4)
        assert p4_before <= await _ids(p4), "records acknowledged before kill -9 are kept"
        assert [ok for _, ok, _ in p4.hello["bootstrap"]] == [True]
        await _wait("restarted peer rejoined", lambda: _connected_to(p4, 2), 30)
        await p1.ask({"cmd": "produce", "n": 5, "rate": 4})
        live = [boot, p1, p2, p4]
        await _wait("45 records at the live peers", lambda: all_have(live[:3], 45), 90)
        new_ids = (await _ids(p1)) - reference
        await _wait(
            "restarted peer receives new records",
            lambda: _has_at_least(p4, 5, exclude=p4_before | reference),
            60,
        )

        # 4. a malicious peer: malformed + oversized gossip and garbage requests
        evil = await _spawn(tmp_path, "evil", "--bootstrap", boot.addrs[0])
        procs.append(evil)
        await _wait("evil peer connected", lambda: _connected_to(evil, 2), 30)
        answer = await evil.ask({"cmd": "evil"}, timeout=60)
        assert answer["evil_sent"] >= 30

        async def evil_banned() -> bool:
            for p in live:
                s = await _stats(p)
                if evil.peer_id in s["connected"]:
                    return False
            return True

        await _wait("every honest peer disconnected the malicious one", evil_banned, 30)
        stats = [await _stats(p) for p in live]
        assert any(s["rejected"].get("malformed", 0) > 0 for s in stats)
        assert any(s["counters"].get("bans", 0) > 0 for s in stats)
        # the ban holds: the malicious peer cannot get back in
        await trio.sleep(3)
        for p in live:
            assert evil.peer_id not in (await _stats(p))["connected"]
        # and the others are unaffected
        before = await _ids(p2)
        await p2.ask({"cmd": "produce", "n": 5, "rate": 4})
        fresh = await _wait("p2 produced 5 more", lambda: _new_ids(p2, before, 5), 30)

        async def everyone_has_fresh() -> bool:
            return all([fresh <= await _ids(p) for p in live])

        await _wait("honest traffic after the attack", everyone_has_fresh, 90)
        assert new_ids  # p1 produced after the restart
    finally:
        for p in procs:
            await p.stop(grace=5)


async def _connected_to(p: PeerProcess, n: int) -> bool:
    return len((await _stats(p))["connected"]) >= n


async def _has_at_least(p: PeerProcess, n: int, exclude: set[str]) -> bool:
    return len((await _ids(p)) - exclude) >= n


async def _new_ids(p: PeerProcess, before: set[str], n: int) -> set[str] | None:
    new = (await _ids(p)) - before
    return new if len(new) >= n else None
