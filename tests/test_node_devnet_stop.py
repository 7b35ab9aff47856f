"""`swarm-node devnet` stopped by signals: SIGTERM once, SIGINT twice, or SIGKILL. Every node
process stops and (unless the devnet was killed) the report of what ran is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.devnet_model import small_run_file

pytestmark = [pytest.mark.network, pytest.mark.slow]

NODES = 3  # trainer, validator, one worker


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_run_file(tmp_path_factory.mktemp("devnet-stop-model"), "devnet-stop", 16)


def _children(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_devnet(run: Path, out: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A devnet in its own process, returned once every node is listening, with its nodes' pids."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "devnet",
            "--inference",
            "1",
            "--validators",
            "1",
            "--duration",
            "120",
            "--batch-size",
            "2",
            "--run",
            str(run),
            "--out",
            str(out),
            "--no-live",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        logs = list((out / "nodes").glob("*/node.log")) if (out / "nodes").exists() else []
        up = [p for p in logs if "listening on " in p.read_text(errors="replace")]
        if len(up) == NODES:
            break
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the devnet's nodes did not start")
    pids = _children(proc.pid)
    assert len(pids) == NODES, pids
    return proc, pids


def _assert_stopped(proc: subprocess.Popen[bytes], pids: list[int], code: int, out: Path) -> None:
    output = proc.communicate(timeout=120)[0].decode(errors="replace")
    assert proc.returncode == code, output[-3000:]
    assert not [p for p in pids if _alive(p)], "node processes outlived the devnet"
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is True
    assert len(report["nodes"]) == NODES
    assert f"report in {out}" in output, output[-3000:]  # piped output is not wrapped


def test_sigterm_stops_every_node_and_writes_the_report(small_run: Path, tmp_path: Path) -> None:
    proc, pids = _start_devnet(small_run, tmp_path / "out")
    proc.send_signal(signal.SIGTERM)
    _assert_stopped(proc, pids, 128 + signal.SIGTERM, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stopped_by"] == "SIGTERM"


def _spawn_devnet(run: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "devnet",
            "--inference",
            "1",
            "--validators",
            "1",
            "--duration",
            "120",
            "--batch-size",
            "2",
            "--run",
            str(run),
            "--out",
            str(out),
            "--no-live",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("when", ["first log", "first listening"])
def test_sigterm_during_start_up_stops_every_node_cleanly(
    small_run: Path, tmp_path: Path, when: str
) -> None:
    """Signalled while its nodes are still starting (importing, loading the model, or some
    already listening), the devnet stops them all without killing any (no -9)."""
    out = tmp_path / "out"
    proc = _spawn_devnet(small_run, out)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        logs = list((out / "nodes").glob("*/node.log")) if (out / "nodes").exists() else []
        texts = [p.read_text(errors="replace") for p in logs]
        if when == "first log" and logs:
            break
        if when == "first listening" and any("listening on " in x for x in texts):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    report = json.loads((out / "report.json").read_text())
    codes = {n["name"]: n["exit_code"] for n in report["nodes"]}
    assert all(c == 0 for c in codes.values()), (codes, output[-3000:])
    assert not _children(proc.pid)


def test_two_sigints_stop_every_node_and_write_the_report(small_run: Path, tmp_path: Path) -> None:
    proc, pids = _start_devnet(small_run, tmp_path / "out")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _assert_stopped(proc, pids, 130, tmp_path / "out")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_killed_devnet_leaves_no_node_running(small_run: Path, tmp_path: Path) -> None:
    proc, pids = _start_devnet(small_run, tmp_path / "out")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and [p for p in pids if _alive(p)]:
        time.sleep(0.2)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, "node processes outlived a killed devnet"


def test_the_version_summary_says_what_happened() -> None:
    from node.commands.devnet_report import version_line

    done = {
        "version": 3,
        "published_at": 100.0,
        "workers": 3,
        "workers_reached": 3,
        "spread_s": 1.5,
        "per_worker_s": {},
    }
    assert (
        version_line(done, 200.0)
        == "devnet: version 3: all 3 workers generating with it within 1.5 s of its publication"
    )
    late = {**done, "version": 16, "workers_reached": 0, "spread_s": None}
    line = version_line(late, 104.0)
    assert (
        "None" not in line and "0/3 workers" in line and "when the swarm stopped, 4 s after" in line
    )


def test_the_learning_plot_zooms_to_the_data_with_intervals(tmp_path: Path) -> None:
    from node.commands.devnet_nodes import NodeProc
    from node.commands.devnet_report import learning, solve_rate_ci95

    series = [
        {"t": 10.0 * i, "version": i, "solve_rate": 0.2 + 0.02 * i, "reward_mean": 0.25, "steps": i}
        for i in range(4)
    ]
    trainer = NodeProc(
        "trainer",
        "trainer",
        tmp_path,
        None,
        tmp_path / "log",  # type: ignore[arg-type]
        status={"role_status": {"learning": series}},
    )
    summary = learning(tmp_path, [trainer])
    assert summary["plot"] == "learning.png" and (tmp_path / "learning.png").stat().st_size > 1000
    lo, hi = summary["solve_rate_ci95"][0]
    assert (
        lo < 0.2 < hi and abs((hi - lo) / 2 - solve_rate_ci95(0.2, summary["checks_tasks"])) < 1e-3
    )
