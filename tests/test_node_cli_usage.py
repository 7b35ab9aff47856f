"""Usage errors through the real CLI: one line on stderr, exit 2, naming what to type."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.store.store import DB_FILENAME, Store


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


@pytest.mark.parametrize(
    "args",
    [
        ("ledger", "--bogus"),
        ("status", "--data-dir"),
        ("nonsense",),
        ("start", "--role", "priest"),
    ],
)
def test_a_usage_error_is_one_line(args: tuple[str, ...]) -> None:
    res = cli(*args)
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert err.count("\n") == 0 and err.startswith("swarm-node: error: "), err
    assert "--help" in err, err


def test_ledger_refuses_an_unknown_kind_naming_the_kinds(tmp_path: Path) -> None:
    with Store(tmp_path / DB_FILENAME):
        pass
    res = cli("ledger", "--data-dir", str(tmp_path), "--kind", "bogus")
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout, err)
    assert err.count("\n") == 0 and "bogus" in err and "rollout_header" in err, err
    assert cli("ledger", "--data-dir", str(tmp_path), "--kind", "verdict").returncode == 0
