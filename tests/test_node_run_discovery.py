"""Runs found on the network, not copied: real `swarm-node` processes on 127.0.0.1 serve
their signed run release; `runs` lists it, `start --join` checks it (pinned authority or
trust on first use), peers adopt a newer release and refuse older, unsigned and
foreign-signed ones, and `doctor` names what stands in the way."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_to_toml
from node.testing.reach_join import small_run
from node.testing.records import net_manifest
from protocol.content_id import content_id
from protocol.identity import Identity
from tests.support.cli import ROOT, run_cli

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _key(tmp: Path, name: str) -> Path:
    key = tmp / f"{name}.key"
    if not key.exists():
        write_key(key, Identity.generate())
    return key


def _peer_id(key: Path) -> str:
    return run_cli("id", str(key)).stdout.strip()


def _run_file(
    tmp: Path,
    name: str,
    run_id: str,
    authority: Path | None,
    version: int = 1,
    pin_files: bool = False,
) -> Path:
    """A run file (signed by `authority` unless None); `pin_files`: the run pins model
    files for joiners to fetch (`model_files_digest`; no peer serves them here)."""
    path = tmp / f"{name}.toml"
    manifest = net_manifest(run_id)
    if pin_files:
        manifest = dataclasses.replace(manifest, model_files_digest=content_id(b"model files"))
    path.write_text(manifest_to_toml(manifest))
    if authority is not None:
        r = run_cli("run", "sign", str(path), "--key", str(authority), "--version", str(version))
        assert r.returncode == 0, r.stderr
    return path


def _start(
    tmp: Path, name: str, *args: str, role: str = "relay"
) -> tuple[subprocess.Popen[str], str]:
    """A node process listening on a fixed port; returns it and its address."""
    port = _free_port()
    key = _key(tmp, name)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            role,
            "--key",
            str(key),
            "--data-dir",
            str(tmp / name),
            "--listen",
            f"/ip4/127.0.0.1/tcp/{port}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    return proc, f"/ip4/127.0.0.1/tcp/{port}/p2p/{_peer_id(key)}"


def _wait_status(tmp: Path, name: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads((tmp / name / "status.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    raise AssertionError(f"{name} never wrote its status")


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory):
    """Three relays of run 'found': one serving a release signed by the run authority, one
    serving the same run unsigned, one serving it signed by a rival key."""
    tmp = tmp_path_factory.mktemp("runs")
    authority = _key(tmp, "authority")
    signed = _run_file(tmp, "signed", "found", authority, pin_files=True)
    unsigned = _run_file(tmp, "unsigned", "found", None)
    rivalled = _run_file(tmp, "rivalled", "found", _key(tmp, "rival-authority"), version=5)
    good, good_addr = _start(tmp, "good", "--run", str(signed), "--duration", "300")
    bare, bare_addr = _start(tmp, "bare", "--run", str(unsigned), "--duration", "300")
    rival, rival_addr = _start(tmp, "rival", "--run", str(rivalled), "--duration", "300")
    try:
        for name in ("good", "bare", "rival"):
            _wait_status(tmp, name)
        yield {
            "tmp": tmp,
            "authority": authority,
            "good": good_addr,
            "bare": bare_addr,
            "rival": rival_addr,
        }
    finally:
        _stop(good, bare, rival)


def test_doctor_exits_0_on_a_good_bootstrap(swarm) -> None:
    r = run_cli(
        "doctor",
        "--join",
        swarm["good"],
        "--data-dir",
        str(swarm["tmp"] / "doc"),
        env={"SWARM_NODE_DATA": str(swarm["tmp"] / "fresh")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # no model on this machine, but the run pins one a joiner fetches from its peers
    assert "ok   model: none here; `start --join` fetches it from the run's peers" in r.stdout
    assert f"ok   bootstrap {swarm['good']}: answered" in r.stdout
    assert f"authority {_peer_id(swarm['authority'])}" in r.stdout and "version 1" in r.stdout
    assert "observed address: /ip4/127.0.0.1/tcp/" in r.stdout
    # The bootstrap peer dialed us back on loopback; it runs the relay service (role relay).
    assert "ok   reachable: publicly reachable: " in r.stdout, r.stdout
    assert f"ok   relay: none needed (publicly reachable); on offer: {swarm['good']}" in r.stdout
    assert "clock: " in r.stdout and "resources for inference" in r.stdout
    assert r.stdout.strip().endswith("doctor: this node could join")


@pytest.mark.parametrize("case", ["wrong peer id", "closed port", "unsigned", "run not served"])
def test_doctor_names_the_cause(swarm, case: str) -> None:
    tmp = swarm["tmp"]
    if case == "wrong peer id":
        addr = swarm["good"].rsplit("/p2p/", 1)[0] + "/p2p/" + Identity.generate().peer_id_b58
        r = run_cli("doctor", "--join", addr)
        expect = f"FAIL bootstrap {addr}: wrong peer id"
    elif case == "closed port":
        addr = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{Identity.generate().peer_id_b58}"
        r = run_cli("doctor", "--join", addr)
        expect = f"FAIL bootstrap {addr}: refused: connection refused"
    elif case == "unsigned":
        r = run_cli("doctor", "--join", swarm["bare"])
        expect = f"FAIL manifest: none this node can trust ({swarm['bare']}: unsigned"
    else:
        other = _run_file(tmp, "other", "elsewhere", swarm["authority"])
        r = run_cli("doctor", "--run", str(other), "--bootstrap", swarm["good"])
        expect = (
            f"FAIL bootstrap {swarm['good']}: run not served: it serves 'found', not 'elsewhere'"
        )
    assert r.returncode == 1, r.stdout + r.stderr
    assert expect in r.stdout, r.stdout
    assert "doctor: this node could NOT join: " in r.stdout


def test_doctor_fails_a_run_whose_model_is_neither_here_nor_pinned(swarm) -> None:
    unpinned = _run_file(swarm["tmp"], "unpinned", "found", None)
    r = run_cli(
        "doctor",
        "--run",
        str(unpinned),
        "--bootstrap",
        swarm["good"],
        "--data-dir",
        str(swarm["tmp"] / "doc2"),
        env={"SWARM_NODE_DATA": str(swarm["tmp"] / "fresh")},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL model: the built-in policy is not built yet" in r.stdout, r.stdout
    assert "does not pin its model files for joiners to fetch" in r.stdout, r.stdout
    assert "doctor: this node could NOT join: no model" in r.stdout, r.stdout


def test_doctor_usage_errors_exit_2() -> None:
    assert run_cli("doctor").returncode == 2
    r = run_cli("doctor", "--join", "/ip4/127.0.0.1/tcp/1")
    assert r.returncode == 2 and "/p2p/" in r.stderr


def test_join_refuses_foreign_unsigned_and_pins_on_first_use(swarm) -> None:
    tmp = swarm["tmp"]
    mallory = Identity.generate().peer_id_b58
    r = run_cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(_key(tmp, "j1")),
        "--data-dir",
        str(tmp / "j1"),
        "--join",
        swarm["good"],
        "--authority",
        mallory,
        "--duration",
        "1",
    )
    assert r.returncode == 2 and "foreign-signed" in r.stderr and mallory in r.stderr, (
        r.stdout + r.stderr
    )

    r = run_cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(_key(tmp, "j2")),
        "--data-dir",
        str(tmp / "j2"),
        "--join",
        swarm["bare"],
        "--duration",
        "1",
    )
    assert r.returncode == 2 and "unsigned" in r.stderr, r.stdout + r.stderr

    # trust on first use: loud, and the authority is written beside the node's data
    r = run_cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(_key(tmp, "j3")),
        "--data-dir",
        str(tmp / "j3"),
        "--join",
        swarm["good"],
        "--duration",
        "1",
    )
    authority = _peer_id(swarm["authority"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TRUST ON FIRST USE" in r.stdout and authority in r.stdout
    assert (tmp / "j3" / "run_authority").read_text().strip() == authority
    assert "run 'found'" in r.stdout

    # later, the same run released by another key is refused
    imposter_key = _key(tmp, "imposter-authority")
    forged = _run_file(tmp, "forged", "found", imposter_key, version=9)
    imposter, imposter_addr = _start(tmp, "imposter", "--run", str(forged), "--duration", "60")
    try:
        _wait_status(tmp, "imposter")
        r = run_cli(
            "start",
            "--role",
            "relay",
            "--key",
            str(_key(tmp, "j3")),
            "--data-dir",
            str(tmp / "j3"),
            "--join",
            imposter_addr,
            "--duration",
            "1",
        )
        assert r.returncode == 2 and "foreign-signed" in r.stderr, r.stdout + r.stderr
        assert "TRUST ON FIRST USE" not in r.stdout
    finally:
        _stop(imposter)


def _join(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`start --role relay --join ...` for one second, in data directory `name`."""
    return run_cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(_key(tmp, name)),
        "--data-dir",
        str(tmp / name),
        *args,
        "--duration",
        "1",
    )


def test_a_first_join_refuses_a_run_served_under_two_authorities(swarm) -> None:
    tmp, good, rival = swarm["tmp"], swarm["good"], swarm["rival"]
    honest, rival_id = _peer_id(swarm["authority"]), _peer_id(tmp / "rival-authority.key")
    for i, order in enumerate(((rival, good), (good, rival))):  # whoever is listed first
        r = _join(tmp, f"first-{i}", "--join", order[0], "--join", order[1])
        assert r.returncode == 2, r.stdout + r.stderr
        assert honest in r.stderr and rival_id in r.stderr and "--authority" in r.stderr
        assert not (tmp / f"first-{i}" / "run_authority").exists()
    # the operator chooses: the other authority is reported, not trusted
    r = _join(tmp, "chosen", "--join", rival, "--join", good, "--authority", honest)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"authority {honest}" in r.stdout and f"{rival}: foreign-signed" in r.stdout


def test_a_restart_starts_when_one_bootstrap_confirms_despite_a_bad_one(swarm) -> None:
    tmp = swarm["tmp"]
    r = _join(tmp, "restarts", "--join", swarm["good"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _join(tmp, "restarts", "--join", swarm["bare"], "--join", swarm["good"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{swarm['bare']}: unsigned" in r.stdout and f"confirmed by {swarm['good']}" in r.stdout
    # nothing confirms it: the bad bootstrap alone is still refused
    r = _join(tmp, "restarts", "--join", swarm["bare"])
    assert r.returncode == 2 and "unsigned" in r.stderr, r.stdout + r.stderr


def test_peers_adopt_a_newer_release_and_refuse_older_and_foreign(tmp_path: Path) -> None:
    authority = _key(tmp_path, "authority")
    v1 = _run_file(tmp_path, "v1", "upd", authority, version=1)
    v2 = _run_file(tmp_path, "v2", "upd", authority, version=2)
    foreign = _run_file(tmp_path, "foreign", "upd", _key(tmp_path, "mallory"), version=7)
    # stopped by the test (`_stop`): its own bound only has to outlast a slow machine
    old, old_addr = _start(tmp_path, "old", "--run", str(v1), "--duration", "120")
    try:
        _wait_status(tmp_path, "old")
        new, _ = _start(
            tmp_path, "new", "--run", str(v2), "--bootstrap", old_addr, "--duration", "8"
        )
        bad, _ = _start(
            tmp_path, "bad", "--run", str(foreign), "--bootstrap", old_addr, "--duration", "8"
        )
        out_new, _ = new.communicate(timeout=90)
        out_bad, _ = bad.communicate(timeout=90)
        listed = run_cli("runs", old_addr, "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = json.loads(listed.stdout)["runs"]
        assert row["manifest_version"] == 2 and row["signature"] == "good", row
        assert row["authority"] == _peer_id(authority)
    finally:
        _stop(old)
    out_old = old.stdout.read() if old.stdout else ""
    assert "adopted run manifest version 2 of 'upd'" in out_old, out_old[-3000:]
    assert "refused the run manifest" in out_old and "foreign-signed" in out_old, out_old[-3000:]
    assert "foreign-signed" in out_new and "adopted" not in out_new, out_new[-3000:]
    assert "Traceback" not in out_old + out_new + out_bad
    assert (tmp_path / "old" / "run_release.bin").exists()
    # the adopted release is used at the next start, over the older run file
    r = run_cli(
        "start",
        "--role",
        "relay",
        "--key",
        str(_key(tmp_path, "old")),
        "--data-dir",
        str(tmp_path / "old"),
        "--run",
        str(v1),
        "--duration",
        "1",
    )
    assert r.returncode == 0 and "using run manifest version 2 adopted earlier" in r.stdout, (
        r.stdout + r.stderr
    )
    # an older release served by a bootstrap peer is refused with its reason
    stale, stale_addr = _start(tmp_path, "stale", "--run", str(v1), "--duration", "30")
    try:
        _wait_status(tmp_path, "stale")
        r = run_cli(
            "start",
            "--role",
            "relay",
            "--key",
            str(_key(tmp_path, "old")),
            "--data-dir",
            str(tmp_path / "old"),
            "--join",
            stale_addr,
            "--duration",
            "1",
        )
    finally:
        _stop(stale)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"join: {stale_addr}: not newer: version 1, we hold 2" in r.stdout, r.stdout
    assert "using the run manifest version 2 adopted earlier" in r.stdout


def _random_model_run(tmp: Path, run_id: str, authority: Path) -> Path:
    """A run file signed by `authority` whose model is a small random-weight policy saved
    in `tmp/model` (builds in seconds, unlike the built-in policy's warm start)."""
    run = small_run(tmp, run_id, max_new_tokens=8)
    assert run_cli("run", "sign", str(run), "--key", str(authority)).returncode == 0
    return run


def test_a_worker_joins_with_only_join_and_its_rollout_is_admitted(tmp_path: Path) -> None:
    authority = _key(tmp_path, "authority")
    run = _random_model_run(tmp_path, "join-test", authority)

    trainer, trainer_addr = _start(
        tmp_path, "trainer", "--run", str(run), "--duration", "150", role="trainer"
    )
    worker = None
    try:
        _wait_status(tmp_path, "trainer", timeout=90)
        listed = run_cli("runs", trainer_addr)
        assert listed.returncode == 0, listed.stderr
        assert "run 'join-test'" in listed.stdout and "trainer 1" in listed.stdout, listed.stdout
        assert f"authority {_peer_id(authority)} (signature good)" in listed.stdout

        worker, _ = _start(
            tmp_path,
            "worker",
            "--join",
            trainer_addr,
            "--max-rollouts",
            "4",
            "--batch-size",
            "2",
            "--duration",
            "120",
            role="inference",
        )
        deadline = time.monotonic() + 120
        admitted = 0
        while time.monotonic() < deadline and not admitted and worker.poll() is None:
            time.sleep(1)
            status = _wait_status(tmp_path, "trainer")
            admitted = status["counters"].get("stored_rollout_record", 0)
        assert admitted > 0, "the trainer admitted no rollout of the joined worker"
    finally:
        _stop(*(p for p in (worker, trainer) if p is not None))
    out = worker.stdout.read() if worker.stdout else ""
    assert "TRUST ON FIRST USE" in out and "run 'join-test'" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_doctor_names_a_protocol_mismatch() -> None:
    import trio

    from node.host.host import open_host

    async def main() -> object:
        async with open_host(Identity.generate().private_bytes(), ["/ip4/127.0.0.1/tcp/0"]) as host:
            addr = host.listen_addrs()[0]  # a libp2p peer that serves no run directory
            return addr, await trio.to_thread.run_sync(lambda: run_cli("doctor", "--join", addr))

    addr, r = trio.run(main)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAIL bootstrap {addr}: protocol mismatch" in r.stdout, r.stdout
