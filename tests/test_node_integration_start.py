"""`swarm-node start` as a real process: start-up report, bootstrap diagnostics, status file,
one process per data directory, clean stop on SIGTERM (port released)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_to_toml
from node.testing.records import net_manifest
from protocol.identity import Identity

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    key = tmp / f"{name}.key"
    if not key.exists():
        write_key(key, Identity.generate())
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "relay",
            "--run",
            str(tmp / "run.toml"),
            "--key",
            str(key),
            "--data-dir",
            str(tmp / name),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    raise AssertionError(f"{path} never appeared")


def test_start_reports_bootstrap_failures_and_stops_cleanly(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(manifest_to_toml(net_manifest("start-test")))
    port = _free_port()
    a = _start(tmp_path, "a", "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--duration", "60")
    try:
        status_a = _wait_for(tmp_path / "a" / "status.json", 60)
        a_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{status_a['peer_id']}"
        dead = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{Identity.generate().peer_id_b58}"
        b = _start(tmp_path, "b", "--bootstrap", a_addr, "--bootstrap", dead, "--duration", "4")
        out_b, _ = b.communicate(timeout=90)
        assert b.returncode == 0, out_b
        assert "swarm-node: peer 12D3KooW" in out_b
        assert "run 'start-test'" in out_b and "listening on /ip4/127.0.0.1/tcp/" in out_b
        assert "bootstrap: 1/2 reached" in out_b
        assert f"bootstrap FAILED {dead}: " in out_b and "refused" in out_b.lower()
        assert "peers reached: 1" in out_b and "stopped cleanly" in out_b

        # a second process on the same data directory is refused with one line
        again = _start(tmp_path, "a", "--listen", "/ip4/127.0.0.1/tcp/0", "--duration", "5")
        out_again, _ = again.communicate(timeout=60)
        assert again.returncode == 2 and "in use by another swarm-node process" in out_again

        # SIGTERM: a clean stop that releases the port
        a.send_signal(signal.SIGTERM)
        out_a, _ = a.communicate(timeout=30)
        assert a.returncode == 0, out_a
        assert "SIGTERM: stopping" in out_a and "stopped cleanly" in out_a
        assert json.loads((tmp_path / "a" / "status.json").read_text())["stopped"] is True
        with socket.socket() as s:  # no listener left (TIME_WAIT connections may remain)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()


def test_start_refuses_bad_arguments_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(manifest_to_toml(net_manifest("start-test")))
    p = _start(tmp_path, "c", "--bootstrap", "/ip4/127.0.0.1/tcp/4001")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "must end in /p2p/<peer id>" in out
    p = _start(tmp_path, "d", "--listen", "not-an-addr")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "multiaddr" in out and out.count("\n") == 1


def test_log_format_json_writes_one_object_a_line(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(manifest_to_toml(net_manifest("log-json")))
    dead = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{Identity.generate().peer_id_b58}"
    key = tmp_path / "j.key"
    write_key(key, Identity.generate())
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "relay",
            "--run",
            str(tmp_path / "run.toml"),
            "--key",
            str(key),
            "--data-dir",
            str(tmp_path / "j"),
            "--bootstrap",
            dead,
            "--duration",
            "3",
            "--log-level",
            "debug",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) > 5
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    assert {x["level"] for x in lines} >= {"debug"}
    assert "stopped cleanly" in r.stdout  # what the node says to people stays on stdout


def test_metrics_endpoint_answers_with_the_named_series(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    (tmp_path / "run.toml").write_text(manifest_to_toml(net_manifest("metrics")))
    port = _free_port()
    a = _start(tmp_path, "m", "--metrics", f"127.0.0.1:{port}", "--duration", "60")
    try:
        _wait_for(tmp_path / "m" / "status.json", 60)
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        )
        for name in (
            "swarm_peers ",
            "swarm_policy_version ",
            "swarm_outbox_pending ",
            "swarm_uptime_seconds ",
            "swarm_peers_banned ",
            "# TYPE swarm_events_total counter",
        ):
            assert name in text, text
        values = [ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert values and all(float(v) == float(v) for _, v in values)  # every sample a number
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
        assert e.value.code == 404
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # garbage: no crash
            s.sendall(b"\x00" * 5000)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).status == 200
        # a second node asked to serve on the same port fails with one line, before joining
        b = _start(tmp_path, "m2", "--metrics", f"127.0.0.1:{port}", "--duration", "5")
        out_b, _ = b.communicate(timeout=60)
        assert b.returncode == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in out_b, out_b
        bad = _start(tmp_path, "m3", "--metrics", "nonsense", "--duration", "5")
        out_bad, _ = bad.communicate(timeout=60)
        assert bad.returncode == 2 and "--metrics: expected HOST:PORT" in out_bad
    finally:
        a.send_signal(signal.SIGTERM)
        out_a, _ = a.communicate(timeout=30)
    assert a.returncode == 0, out_a
