"""The node's status page (`node.dashboard`): its history, the HTTP routes beside
`/metrics`, and the page itself drawn by headless Chromium against a running devnet."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from node import metrics
from node.dashboard import MAX_FIGURES, History
from tests.support.devnet_model import small_run_file


def test_history_keeps_numeric_figures_and_the_trainers_learning_curve() -> None:
    history = History(max_samples=3)
    for i in range(5):
        history.record(
            100.0 + i,
            {
                "roles": ["trainer"],
                "peers": i,
                "peer_id": "not a number",
                "reachability": "public",
                "delivery": {"delivered": 2 * i},
                "role_status": {
                    "produced": 3 * i,
                    "ok": True,
                    "nan": float("nan"),
                    "learning": [{"t": 1.0, "version": 1, "solve_rate": 0.25, "solved": "0100"}],
                },
            },
        )
    data = json.loads(history.to_json())
    assert data["role"] == "trainer"
    assert [s["t"] for s in data["samples"]] == [102.0, 103.0, 104.0]  # bounded, oldest dropped
    last = data["samples"][-1]
    assert last["peers"] == 4 and last["delivery.delivered"] == 8
    assert last["role_status.produced"] == 12 and last["role_status.ok"] == 1.0
    assert "peer_id" not in last and "role_status.nan" not in last
    assert data["learning"] == [{"t": 1.0, "version": 1, "solve_rate": 0.25, "reward_mean": None}]


def test_a_huge_status_keeps_a_bounded_sample() -> None:
    history = History()
    history.record(0.0, {"role_status": {f"k{i}": i for i in range(10 * MAX_FIGURES)}})
    assert len(history.samples[0]) <= MAX_FIGURES + 1  # the figures and the time


async def _get(port: int, path: str) -> tuple[str, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


def test_the_metrics_port_serves_the_page_its_history_and_metrics() -> None:
    history = History()
    status = {"roles": ["inference"], "peers": 3, "policy_version": 2}
    history.record(time.time(), status)

    async def main() -> None:
        with trio.fail_after(20):
            [listener] = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[:1]
            port = listener.socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(metrics.serve, listener, lambda: status, history)
                line, page = await _get(port, "/")
                assert line.endswith("200 OK") and b'id="throughput"' in page
                for external in (b"src=", b"href=", b"url(", b"@import"):  # nothing fetched
                    assert external not in page, external
                line, body = await _get(port, "/history.json?x=1")
                assert line.endswith("200 OK")
                assert json.loads(body)["samples"][0]["peers"] == 3
                line, body = await _get(port, "/metrics")
                assert line.endswith("200 OK") and b"swarm_peers 3" in body
                line, _ = await _get(port, "/elsewhere")
                assert line.endswith("404 Not Found")
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_without_a_history_only_metrics_are_served() -> None:
    async def main() -> None:
        with trio.fail_after(20):
            [listener] = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[:1]
            port = listener.socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(metrics.serve, listener, lambda: {"peers": 1})
                assert (await _get(port, "/"))[0].endswith("404 Not Found")
                assert (await _get(port, "/metrics"))[0].endswith("200 OK")
                nursery.cancel_scope.cancel()

    trio.run(main)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _chart_points(url: str) -> dict[str, int]:
    """Load `url` in headless Chromium (letting its script poll for a few seconds) and
    return each chart's `data-points` by chart id."""
    browser = _chromium()
    assert browser
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=6000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    ).stdout
    found = re.findall(r'<div id="(\w+)"><svg [^>]*data-points="(\d+)"', dom)
    return {chart: int(n) for chart, n in found}


def _drawn(url: str, charts: tuple[str, ...], tries: int = 4) -> dict[str, int]:
    """`_chart_points(url)` once every chart named has points; a loaded machine may need
    a few page loads (each lets the page's script run for its virtual-time budget)."""
    points: dict[str, int] = {}
    for _ in range(tries):
        points = _chart_points(url)
        if all(points.get(c, 0) > 0 for c in charts):
            return points
        time.sleep(5)
    raise AssertionError(f"charts not drawn at {url}: {points}")


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(
    _chromium() is None and not os.environ.get("SWARM_CI"),
    reason="headless Chromium (Debian package chromium) not installed",
)
def test_the_status_page_of_a_running_devnet_draws_its_charts_in_chromium(
    tmp_path: Path,
) -> None:
    run = small_run_file(tmp_path / "model", "devnet-page", 16)
    out = tmp_path / "out"
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
            "150",
            "--batch-size",
            "2",
            "--publish-every",
            "5",
            "--eval-tasks",
            "0",
            "--run",
            str(run),
            "--out",
            str(out),
            "--no-live",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline and "status pages" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the devnet exited before its nodes started"
        pages = dict(re.findall(r"(trainer|validator1|worker1) (http://\S+/)", line))
        assert "trainer" in pages, line
        worker_status = out / "nodes" / "worker1" / "data" / "status.json"
        while time.monotonic() < deadline:  # until the worker has produced under a version
            try:
                status = json.loads(worker_status.read_text())
            except (OSError, ValueError):
                status = {}
            role = status.get("role_status") or {}
            if role.get("produced", 0) >= 4 and status.get("policy_version", 0) >= 1:
                break
            assert proc.poll() is None, "the devnet stopped early"
            time.sleep(2)
        else:
            pytest.fail("the worker produced no rollouts under a published version")
        worker_page = next(
            u for name, u in re.findall(r"(\w+) (http://\S+/)", line) if name.startswith("worker")
        )
        _drawn(worker_page, ("version", "peers", "throughput", "credit"))
        _drawn(pages["trainer"], ("version", "peers"))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
