"""`swarm-node status` through the real CLI on the folders a user has: a node's data
directory, the devnet's node folder (`<report>/nodes/<name>`) and a devnet report folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from node.store.store import DB_FILENAME, Store


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def _report(tmp: Path) -> Path:
    report = tmp / "report"
    for name in ("trainer", "worker1"):
        (report / "nodes" / name / "data").mkdir(parents=True)
        with Store(report / "nodes" / name / "data" / DB_FILENAME):
            pass
    return report


def test_status_on_a_node_folder_and_its_data(tmp_path: Path) -> None:
    report = _report(tmp_path)
    for d in (report / "nodes" / "worker1", report / "nodes" / "worker1" / "data"):
        res = cli("status", "--data-dir", str(d))
        assert res.returncode == 0, res.stderr
        assert (
            f"store           {report / 'nodes' / 'worker1' / 'data' / DB_FILENAME}" in res.stdout
        )


def test_status_on_a_report_folder_shows_every_node(tmp_path: Path) -> None:
    report = _report(tmp_path)
    res = cli("status", "--data-dir", str(report))
    assert res.returncode == 0, res.stderr
    assert "== trainer" in res.stdout and "== worker1" in res.stdout, res.stdout
    # the ledger needs one node: it names them
    res = cli("ledger", "--data-dir", str(report))
    assert res.returncode == 2 and "trainer" in res.stderr and "worker1" in res.stderr, res.stderr
    assert cli("ledger", "--data-dir", str(report / "nodes" / "trainer")).returncode == 0
