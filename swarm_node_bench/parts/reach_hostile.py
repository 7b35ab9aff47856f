"""`swarm-node bench reach --hostile`: the join path under attack, one case each.

    dcutr_dials_per_message_max  the most dials one DCUtR CONNECT caused: eight CONNECTs, each
                                 listing 400 addresses of a third party (`node.testing.
                                 dcutr_flood`: the library's handler, patched as a node runs
                                 it, on a stand-in host whose network counts dial attempts)
    dcutr_amplification          dials caused / CONNECT messages received, in that case
    dcutr_redials_within_minute  dials to an address already dialled less than 60 s before
    autonat_liars_flipped        a public node (real hosts on loopback) asks three peers that
                                 answer every dial-back request "dial failed" and two honest
                                 ones: whether its verdict became "private"
    relay_reservations_one_ip    150 reservation requests at once from one IP to the relay's
                                 reservation handler (`node.testing.relay_flood`: `node.host.
                                 relay.CountingRelay`, the library's reserve step answering
                                 after 50 ms): slots granted (the per-IP cap: `relay_per_ip_cap`)
    tofu_conflict_refused        `swarm-node start --join RIVAL --join HONEST` on a fresh data
                                 directory, the two serving run 'found' signed by different
                                 keys (real processes on loopback): exit 2 naming both
    restart_with_bad_bootstrap_ok  a node that pinned the honest authority restarts with
                                 `--join BARE --join HONEST` (BARE serves the run unsigned):
                                 exit 0
    runs_answer_s_with_slow_peers  wall seconds from starting `swarm-node runs HANG DRIP
                                 HONEST` (HANG accepts TCP and says nothing, DRIP sends a byte
                                 every 2 s) to the line of the honest peer's run, process
                                 start included; `runs_total_s_with_slow_peers`: to its exit
    attackers_penalized          per case: whether the attacker was charged (None where the
                                 attack is refused and nobody is charged: the relay's cap, the
                                 conflicting join, the slow peers)
    tracebacks                   Python tracebacks in the output of every process run

Everything runs on 127.0.0.1 or in process: no namespaces are needed for these cases.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = "198.51.100.7"  # the flood's victim (a documentation address)
FLOOD_MESSAGES = 8
FLOOD_ADDRS = 400
RESERVATIONS_AT_ONCE = 150
START_TIMEOUT_S = 90.0


def run_hostile() -> dict[str, Any]:
    """Every case; the `hostile` section of `bench reach`."""
    from node.join import quiet_library_logs  # deferred: heavy import

    quiet_library_logs()  # the flood's failed dials are the library's ERROR lines
    out: dict[str, Any] = {}
    penalized: dict[str, bool | None] = {}
    # the handler's waits (5 s rounds, 2 s between) on a virtual clock that jumps ahead
    out.update(trio.run(_dcutr_case, penalized, clock=trio.testing.MockClock(autojump_threshold=0)))
    out.update(trio.run(_autonat_case, penalized))
    out.update(trio.run(_relay_case, penalized))
    with tempfile.TemporaryDirectory(prefix="bench-reach-hostile-") as tmp:
        out.update(_join_cases(Path(tmp), penalized))
    out["attackers_penalized"] = penalized
    return out


async def _dcutr_case(penalized: dict[str, bool | None]) -> dict[str, Any]:
    from node.host import libp2p_patches  # deferred: heavy import
    from node.testing.dcutr_flood import connect_stream, flood_target, new_peer  # deferred

    libp2p_patches.apply()
    attacker = new_peer()
    dcutr, network = flood_target([attacker])
    charged: list[str] = []
    libp2p_patches.set_punch_reporter(dcutr, lambda peer, _reason: charged.append(peer))
    victim = [f"/ip4/{THIRD_PARTY}/tcp/{port}" for port in range(1000, 1000 + FLOOD_ADDRS)]
    per_message = []
    for i in range(FLOOD_MESSAGES):
        before = len(network.dials)
        offered = victim[i * 50 :] + victim[: i * 50]
        with trio.move_on_after(30):
            await dcutr._handle_dcutr_stream(connect_stream(attacker, offered))
        per_message.append(len(network.dials) - before)
    penalized["dcutr"] = attacker.to_base58() in charged
    return {
        "dcutr_dials_per_message_max": max(per_message),
        "dcutr_amplification": round(len(network.dials) / FLOOD_MESSAGES, 3),
        "dcutr_redials_within_minute": network.again_within_a_minute,
    }


async def _autonat_case(penalized: dict[str, bool | None]) -> dict[str, Any]:
    from node.host.gossip_guard import Misbehaviour  # deferred: heavy import
    from node.host.host import open_host  # deferred: heavy import
    from node.host.reachability import DialBackAutoNAT, Reachability  # deferred

    async def never_dials(_peer: object, _addrs: object) -> None:
        return None

    async with contextlib.AsyncExitStack() as stack:
        node = await stack.enter_async_context(open_host(os.urandom(32)))
        liars = [await stack.enter_async_context(open_host(os.urandom(32))) for _ in range(3)]
        honest = [await stack.enter_async_context(open_host(os.urandom(32))) for _ in range(2)]
        for liar in liars:
            lying = DialBackAutoNAT(liar.libp2p, serve=True)
            lying._try_dial = never_dials  # type: ignore[method-assign]
        for h in honest:
            DialBackAutoNAT(h.libp2p, serve=True)
        charged: list[Misbehaviour] = []
        node.on_misbehaviour(charged.append)
        reach = Reachability(node)
        for peer in (*liars, *honest):
            await node.connect(peer.listen_addrs()[0])
        with trio.move_on_after(60):
            await reach.check([p.peer_id for p in (*liars, *honest)], 12.0)
        penalized["autonat"] = {m.peer for m in charged} == {p.peer_id for p in liars}
        return {
            "autonat_liars_flipped": reach.status != "public",
            "autonat_agreed": None if reach.last is None else reach.last.agreed,
            "autonat_proven": None if reach.last is None else reach.last.proven,
        }


async def _relay_case(penalized: dict[str, bool | None]) -> dict[str, Any]:
    from node.testing.relay_flood import reservations_at_once  # deferred: heavy import

    granted, cap = await reservations_at_once(RESERVATIONS_AT_ONCE)
    penalized["relay"] = None
    return {"relay_reservations_one_ip": granted, "relay_per_ip_cap": cap}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def _key(tmp: Path, name: str) -> tuple[Path, str]:
    from node.keyfile import write_key  # deferred: heavy import
    from protocol.identity import Identity  # deferred: with the key file writer

    key, ident = tmp / f"{name}.key", Identity.generate()
    write_key(key, ident)
    return key, ident.peer_id_b58


def _run_file(tmp: Path, name: str, signer: Path | None, version: int) -> Path:
    from node.run_file import manifest_to_toml  # deferred: heavy import
    from node.testing.records import net_manifest  # deferred: heavy import

    path = tmp / f"{name}.toml"
    path.write_text(manifest_to_toml(net_manifest("found")))
    if signer is not None:
        r = _cli("run", "sign", str(path), "--key", str(signer), "--version", str(version))
        if r.returncode != 0:
            raise RuntimeError(f"run sign failed: {r.stderr}")
    return path


def _serve(tmp: Path, name: str, run: Path) -> tuple[subprocess.Popen[str], str]:
    key, peer = _key(tmp, name)
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "relay",
            "--key",
            str(key),
            "--data-dir",
            str(tmp / name),
            "--listen",
            f"/ip4/127.0.0.1/tcp/{port}",
            "--run",
            str(run),
            "--duration",
            "240",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (tmp / name / "status.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{name} did not start")
        time.sleep(0.2)
    return proc, f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def _join(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    key = tmp / f"{name}.key"
    if not key.exists():
        _key(tmp, name)
    return _cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(key),
        "--data-dir",
        str(tmp / name),
        *args,
        "--duration",
        "1",
    )


class _SlowPeer:
    """A TCP listener that accepts and says nothing (`drip_s` None) or one byte every
    `drip_s` seconds; its address names a random peer id."""

    def __init__(self, drip_s: float | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.drip_s, self.stop = drip_s, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.peer = _random_peer()
        self.addr = f"/ip4/127.0.0.1/tcp/{self.sock.getsockname()[1]}/p2p/{self.peer}"

    def _serve(self) -> None:
        conns = []
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = self.sock.accept()
                conns.append(conn)
            if self.drip_s is not None:
                for c in conns:
                    with contextlib.suppress(OSError):
                        c.send(b"\x00")
                self.stop.wait(self.drip_s)
        for c in conns:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def _random_peer() -> str:
    from protocol.identity import Identity  # deferred: keeps the module light to import

    return Identity.generate().peer_id_b58


def _time_runs(*addrs: str) -> tuple[float | None, float, str]:
    """`swarm-node runs ADDRS`: seconds from its start to the line of run 'found' (None if
    it never came), seconds to its exit, and its output."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "runs", *addrs],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )
    seen: float | None = None
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when the command exits (its own deadline: 30 s)
        lines.append(line)
        if seen is None and line.startswith("run 'found'"):
            seen = time.monotonic() - started
    proc.wait(timeout=60)
    return seen, time.monotonic() - started, "".join(lines)


def _join_cases(tmp: Path, penalized: dict[str, bool | None]) -> dict[str, Any]:
    honest_key, honest_id = _key(tmp, "honest-authority")
    rival_key, rival_id = _key(tmp, "rival-authority")
    signed = _run_file(tmp, "signed", honest_key, 1)
    rivalled = _run_file(tmp, "rivalled", rival_key, 5)
    unsigned = _run_file(tmp, "unsigned", None, 1)
    procs: list[subprocess.Popen[str]] = []
    outputs: list[str] = []
    slow: list[_SlowPeer] = []
    try:
        good, good_addr = _serve(tmp, "good", signed)
        rival, rival_addr = _serve(tmp, "rival", rivalled)
        bare, bare_addr = _serve(tmp, "bare", unsigned)
        procs += [good, rival, bare]

        first = _join(tmp, "fresh", "--join", rival_addr, "--join", good_addr)
        outputs.append(first.stdout + first.stderr)
        refused = first.returncode == 2 and honest_id in first.stderr and rival_id in first.stderr

        pinned = _join(tmp, "restarts", "--join", good_addr)
        restart = _join(tmp, "restarts", "--join", bare_addr, "--join", good_addr)
        outputs += [pinned.stdout + pinned.stderr, restart.stdout + restart.stderr]

        slow = [_SlowPeer(None), _SlowPeer(2.0)]
        runs_s, runs_total_s, listed_out = _time_runs(slow[0].addr, slow[1].addr, good_addr)
        outputs.append(listed_out)
    finally:
        for s in slow:
            s.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                out, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outputs.append(out or "")
    penalized["tofu"] = None
    penalized["restart"] = None
    penalized["runs"] = None
    return {
        "tofu_conflict_refused": refused,
        "restart_with_bad_bootstrap_ok": pinned.returncode == 0 and restart.returncode == 0,
        "runs_answer_s_with_slow_peers": None if runs_s is None else round(runs_s, 2),
        "runs_total_s_with_slow_peers": round(runs_total_s, 2),
        "tracebacks": sum(o.count("Traceback (most recent call last)") for o in outputs),
    }
