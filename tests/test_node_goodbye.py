"""`node.host.goodbye`: a peer that bans us says why and until when; what it says is shown
(log, status, metrics) and never acted on. Garbage, replayed or unsolicited goodbyes cost
nobody anything."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest
import trio

from node import metrics
from node.host.goodbye import (
    GOODBYE_PROTOCOL,
    GOODBYE_S,
    MAX_UNTIL_S,
    REPEAT_S,
    goodbye_message,
    parse_goodbye,
)
from node.peer.dropped_by import DroppedBy
from node.peer.peer import PeerConfig, open_peer
from node.testing.peer_process import PeerProcess
from node.testing.records import net_manifest
from protocol.identity import Identity
from tests.support.polling import until


def test_a_goodbye_reads_back_only_from_its_signer_for_its_receiver() -> None:
    b, a, c = Identity.generate(), Identity.generate(), Identity.generate()
    now = 1_000_000.0
    data = goodbye_message(b, a.peer_id_b58, "banned: flooding", now + 3600)
    told = parse_goodbye(data, b.peer_id_b58, a.peer_id_b58, now)
    assert told is not None and told.reason == "banned: flooding" and told.until == now + 3600
    assert parse_goodbye(data, c.peer_id_b58, a.peer_id_b58, now) is None  # c replays b's
    assert parse_goodbye(data, b.peer_id_b58, c.peer_id_b58, now) is None  # meant for a
    for junk in (
        b"",
        b"\xc1",
        msgpack.packb([1, "x"]),
        msgpack.packb([2, "x", 1, b"s" * 64]),
        msgpack.packb({"a": 1}),
        data[:-1],
        msgpack.packb([1, "x", -1, b"s" * 64]),
    ):
        assert parse_goodbye(junk, b.peer_id_b58, a.peer_id_b58, now) is None
    far = parse_goodbye(
        goodbye_message(b, a.peer_id_b58, "ban\x1b[2J", now + 1e9),
        b.peer_id_b58,
        a.peer_id_b58,
        now,
    )
    assert far is not None and far.until == now + MAX_UNTIL_S and far.reason == "ban?[2J"


def test_what_a_peer_told_is_shown_until_its_end_and_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = DroppedBy(keep=4)
    for i in range(20):  # a peer changing its story cannot flood our log
        d.told("X", f"banned: {i}", 500.0, 100.0 + i)
    assert d.status(130.0)["X"]["reason"] == "banned: 19"
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(500.0))
    logged = [r.getMessage() for r in caplog.records]
    assert logged.count(f"peer X refuses us: banned: 0, until {at} (400 s more; as it says)") == 1
    assert sum("refuses us" in r.getMessage() for r in caplog.records) == 1
    d = DroppedBy(keep=4)
    d.on_event("told", "B", "banned: x", 100.0, until=200.0)
    assert d.status(150.0) == {
        "B": {"closes": 0, "reason": "banned: x", "until": 200.0, "told": True}
    }
    assert d.status(201.0) == {}
    d.told("C", "banned: y", 50.0, 100.0)  # an end already past: nothing to show
    assert d.status(100.0) == {}
    for i in range(50):
        d.told(f"p{i}", "banned", 1000.0, 100.0)
    assert len(d.status(100.0)) == 4


def _cfg(tmp: Path, name: str, manifest, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest, identity=Identity.generate(), data_dir=tmp / name, roles=("relay",), **kw
    )


@pytest.mark.network
@pytest.mark.slow
async def test_a_banned_peer_is_told_and_a_replayed_goodbye_costs_nothing(tmp_path: Path) -> None:
    manifest = net_manifest("goodbye")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest)) as a,
        open_peer(_cfg(tmp_path, "c", manifest)) as c,
    ):
        addr_b, addr_a = b.host.listen_addrs()[0], a.host.listen_addrs()[0]
        await a.host.connect(addr_b)
        await c.host.connect(addr_a)
        await until(
            "b and c connected to a",
            lambda: {b.host.peer_id, c.host.peer_id} <= set(a.host.connected_peers()),
        )
        banned_at = time.time()
        await b.host.ban(a.host.peer_id, 3600, "test")
        await until("a told", lambda: b.host.peer_id in a.stats()["dropped_by"])  # type: ignore[operator]
        d = a.stats()["dropped_by"][b.host.peer_id]  # type: ignore[index]
        assert d["told"] is True and d["reason"] == "banned: test"
        assert banned_at + 3590 < d["until"] < time.time() + 3610
        assert "swarm_refused_by_peers 1" in metrics.render(a.stats())
        # redialling gets the same answer, but no more than one goodbye a REPEAT_S
        said = b.host.goodbyes.said
        for _ in range(5):
            await a.host.connect(addr_b)
            await trio.sleep(0.2)
        assert said == 1 and b.host.goodbyes.said == 1 and REPEAT_S > 5

        # c replays b's goodbye, and sends garbage and one of its own: only c's own shows,
        # nobody is charged or disconnected
        replay = goodbye_message(b.identity, a.host.peer_id, "banned: forged", time.time() + 99)
        own = goodbye_message(c.identity, a.host.peer_id, "banned: unsolicited", time.time() + 99)
        for data in (replay, b"\x00garbage", own):
            stream = await c.host.open_stream(a.host.peer_id, GOODBYE_PROTOCOL)
            await stream.send(data)
            await stream.close()
        await until("c's own goodbye shown", lambda: c.host.peer_id in a.stats()["dropped_by"])  # type: ignore[operator]
        shown = a.stats()["dropped_by"]
        assert shown[b.host.peer_id]["reason"] == "banned: test"  # type: ignore[index]
        assert shown[c.host.peer_id]["reason"] == "banned: unsolicited"  # type: ignore[index]
        assert (
            c.host.peer_id in a.host.connected_peers()
            and a.host.peer_id in c.host.connected_peers()
        )
        for p in (a, c):
            assert not p.rejects and p.host.banned_count() == 0, p.rejects


@pytest.mark.network
async def test_a_goodbye_is_heard_before_saying_it_returns(tmp_path: Path) -> None:
    """`ban` closes the connection as soon as `say` returns: a goodbye still in flight then
    would be lost with the connection (and a redial within `REPEAT_S` is not told again)."""
    manifest = net_manifest("goodbye-heard")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest)) as a,
    ):

        async def busy_serve(stream: object) -> None:  # a receiver slow to read (a busy loop)
            await trio.sleep(0.3)
            await a.host.goodbyes.serve(stream)

        a.host.set_stream_handler(GOODBYE_PROTOCOL, busy_serve)
        for i in range(3):
            await a.host.connect(b.host.listen_addrs()[0])
            await until("connected", lambda: a.host.peer_id in b.host.connected_peers())
            heard = a.host.goodbyes.heard
            await b.host.goodbyes.say(a.host.peer_id, f"banned: {i}", time.time() + 60)
            assert a.host.goodbyes.heard == heard + 1, i
            b.host.goodbyes._said.clear()  # so that the next round is told again


@pytest.mark.network
async def test_a_receiver_that_never_closes_gets_one_goodbye_per_repeat_window(
    tmp_path: Path,
) -> None:
    manifest = net_manifest("goodbye-stall")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest)) as a,
    ):

        async def stalling_serve(stream: object) -> None:  # reads nothing, never closes
            await trio.sleep_forever()

        a.host.set_stream_handler(GOODBYE_PROTOCOL, stalling_serve)
        await a.host.connect(b.host.listen_addrs()[0])
        await until("connected", lambda: a.host.peer_id in b.host.connected_peers())
        with trio.fail_after(GOODBYE_S + 2):  # the wait for its close is bounded
            await b.host.goodbyes.say(a.host.peer_id, "banned: 1", time.time() + 60)
        assert b.host.goodbyes.said == 1
        with trio.fail_after(0.5):  # told within REPEAT_S: no second goodbye, no wait
            await b.host.goodbyes.say(a.host.peer_id, "banned: 2", time.time() + 60)
        assert b.host.goodbyes.said == 1


@pytest.mark.network
@pytest.mark.slow
async def test_a_peer_process_banned_for_garbage_says_who_refused_it_why_and_until_when(
    tmp_path: Path,
) -> None:
    procs: list[PeerProcess] = []

    async def spawn(name: str, *extra: str) -> PeerProcess:
        p = await PeerProcess.start(
            "--data-dir",
            str(tmp_path / name),
            "--max-life",
            "120",
            *extra,
            module="node.testing.net_peer",
            stderr_path=str(tmp_path / f"{name}.log"),
            timeout=90,
        )
        procs.append(p)
        return p

    try:
        honest = await spawn("honest")
        evil = await spawn("evil", "--bootstrap", honest.addrs[0])
        with trio.fail_after(30):
            while honest.peer_id not in (await evil.ask({"cmd": "stats"}))["connected"]:
                await trio.sleep(0.2)
        assert (await evil.ask({"cmd": "evil"}, timeout=60))["evil_sent"] > 0
        with trio.fail_after(30):
            while honest.peer_id not in (s := await evil.ask({"cmd": "stats"}))["dropped_by"]:
                await trio.sleep(0.3)
        d = s["dropped_by"][honest.peer_id]
        assert d["told"] is True and d["reason"].startswith("banned: score below threshold"), d
        assert d["until"] > time.time() + 600, d  # the ban's end, not a reporting window
        assert "swarm_refused_by_peers 1" in metrics.render(s)
        assert (await honest.ask({"cmd": "stats"}))["counters"]["bans"] >= 1
    finally:
        for p in procs:
            await p.stop()
    log = (tmp_path / "evil.log").read_text()
    assert f"peer {honest.peer_id} refuses us: banned: score below threshold" in log, log[-3000:]


def test_status_shows_who_refused_us_why_and_until_when(tmp_path: Path) -> None:
    import json

    from node.store.store import Store
    from tests.support.cli import run_cli

    Store.open(tmp_path).close()
    until = time.time() + 3000
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "pid": 999_999_999,
                "time": time.time(),
                "peers": 0,
                "dropped_by": {
                    "12D3KooWB": {
                        "closes": 0,
                        "reason": "banned: score below threshold",
                        "until": until,
                        "told": True,
                    },
                    "12D3KooWC": {"closes": 4, "reason": "connection closed", "until": until},
                },
            }
        )
    )
    r = run_cli("status", "--data-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    at = time.strftime("%H:%M:%S", time.localtime(until))
    assert (
        f"refused by      12D3KooWB: banned: score below threshold, until {at} (as it told us)"
        in r.stdout
    )
    assert "dropped by      12D3KooWC: closed our connections 4 times" in r.stdout, r.stdout
