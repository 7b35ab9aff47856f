"""Our node against peers that run no patch of ours: js-libp2p 2.x (from the npm registry,
installed by `.ci/run` into `tests/interop/js/node_modules`) and a py-libp2p process that
never imports `node.host.libp2p_patches`. Each connects, identifies, pings and follows gossip
both ways with our host (every patch of ours applied on this side). The two peers follow
at the same time, each against a host of its own."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from node.host.host import HostSettings, open_host

pytestmark = [pytest.mark.network, pytest.mark.slow]

JS_DIR = Path(__file__).parent / "interop" / "js"
PY_PEER = Path(__file__).parent / "interop" / "py_unpatched_peer.py"
IN_CI = os.environ.get("SWARM_CI") == "1"
FOLLOW_S = 65  # the unpatched peer follows our gossip at least this long


def _js_ready() -> str | None:
    """None if the js peer can run, else why not."""
    if shutil.which("node") is None:
        return "node (Node.js) is not installed"
    if not (JS_DIR / "node_modules" / "libp2p").is_dir():
        return f"{JS_DIR}/node_modules is missing: run `npm ci` there (.ci/run does)"
    return None


class _Lines:
    """JSON lines of a child process's stdout, read in a thread-free trio task."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    async def read(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        buf = b""
        async for chunk in proc.stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace").strip()
                self.raw.append(text)
                if text.startswith("{"):
                    try:
                        self.events.append(json.loads(text))
                    except ValueError:
                        pass


async def _follow(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run the unpatched peer `command` against our host for FOLLOW_S seconds and check
    connect, identify, ping and gossip both ways."""
    settings = HostSettings(heartbeat_interval_s=0.5, peer_dead_after_s=4.0)
    topic = "interop/t"
    async with open_host(secrets.token_bytes(32), settings=settings) as host:
        ours = await host.subscribe(topic)
        lines = _Lines()
        got: list[bytes] = []
        published = 0
        drops: list[str] = []
        host.on_peer_event(lambda e: drops.append(e.kind) if e.kind != "connected" else None)
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(
                lambda task_status=trio.TASK_STATUS_IGNORED: trio.run_process(
                    [*command, host.listen_addrs()[0], topic, str(FOLLOW_S)],
                    cwd=str(cwd),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    check=False,
                    task_status=task_status,
                )
            )
            nursery.start_soon(lines.read, proc)

            async def receive() -> None:
                async for msg in ours:
                    got.append(msg.data)

            nursery.start_soon(receive)
            with trio.fail_after(30):
                while not lines.of("connected"):
                    assert proc.returncode is None, "\n".join(lines.raw[-30:])
                    await trio.sleep(0.1)
            remote = lines.of("started")[0]["peer"]
            with trio.fail_after(15):
                while remote not in host.topic_peers(topic):
                    await trio.sleep(0.1)
            started = time.monotonic()
            deadline = started + FOLLOW_S - 5
            while time.monotonic() < deadline:
                await host.publish(topic, f"py {published}".encode())
                published += 1
                assert remote in host.connected_peers(), "\n".join(lines.raw[-30:])
                await trio.sleep(1.0)
            followed_s = time.monotonic() - started
            with trio.fail_after(FOLLOW_S):
                await proc.wait()
            nursery.cancel_scope.cancel()
    tail = "\n".join(lines.raw[-30:])
    assert proc.returncode == 0, tail
    identify = [e for e in lines.of("identify") if e.get("peer") == host.peer_id]
    assert identify and identify[0]["agent"].startswith("swarm-node/"), tail
    assert "/ipfs/ping/1.0.0" in identify[0]["protocols"], tail
    assert len(lines.of("ping")) >= FOLLOW_S // 4, tail
    assert not lines.of("ping_failed"), tail
    heard = {e["data"] for e in lines.of("message") if e.get("from") == host.peer_id}
    assert followed_s >= 60 - 5
    assert len(heard) >= published * 0.95, f"{len(heard)} of {published} heard\n{tail}"
    theirs = {d for d in got if d.startswith(b"js ") or d.startswith(b"peer ")}
    assert len(theirs) >= len(lines.of("published")) * 0.8 >= 10, tail
    assert drops == [] or set(drops) <= {"disconnected"}, drops


def _py_peer_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def followed() -> dict[str, BaseException | None]:
    """Each unpatched peer (js where it can run, and py) follows its own host of ours: the
    two follows run at once, and each peer's outcome (None, or what it raised) is kept for
    its test."""
    follows = {"py": ([sys.executable, str(PY_PEER)], PY_PEER.parent, _py_peer_env())}
    if _js_ready() is None:
        follows["js"] = (["node", "peer.mjs"], JS_DIR, None)
    outcome: dict[str, BaseException | None] = {}

    async def one(name: str, command: list[str], cwd: Path, env: dict[str, str] | None) -> None:
        try:
            await _follow(command, cwd, env)
        except Exception as e:  # kept for that peer's test; the other follow goes on
            outcome[name] = e
        else:
            outcome[name] = None

    async def all_at_once() -> None:
        async with trio.open_nursery() as nursery:
            for name, args in follows.items():
                nursery.start_soon(one, name, *args)

    trio.run(all_at_once)
    return outcome


def _check(outcome: BaseException | None) -> None:
    if outcome is not None:
        raise outcome


@pytest.mark.skipif(
    _js_ready() is not None and not IN_CI, reason=f"js-libp2p peer unavailable: {_js_ready()}"
)
def test_an_unpatched_js_libp2p_peer_follows_our_gossip(
    followed: dict[str, BaseException | None],
) -> None:
    reason = _js_ready()
    if reason is not None:  # only in CI (SWARM_CI=1): elsewhere the test is skipped
        pytest.fail(f"the js-libp2p interop peer is required in CI: {reason}")
    _check(followed["js"])


def test_an_unpatched_py_libp2p_peer_interoperates(
    followed: dict[str, BaseException | None],
) -> None:
    _check(followed["py"])
