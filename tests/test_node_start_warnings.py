"""`swarm-node start` says at start-up when its key cannot do what its role is for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from trainer import tiny_policy

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.mark.skipif(
    not tiny_policy.is_built(tiny_policy.policy_dir()),
    reason="built-in policy not built (swarm-node init-model)",
)
def test_a_trainer_whose_key_is_not_in_trainer_keys_is_warned(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    write_key(key, Identity.generate())
    table = tiny_policy.run_manifest_table("warn-test")
    table["run"].pop("trainer_keys", None)
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "trainer",
            "--run",
            str(run),
            "--key",
            str(key),
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--duration",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "not in the run's trainer_keys" in res.stdout, res.stdout[-3000:]
