"""`swarm-node start` stopped by SIGINT or SIGTERM exits 0 whether it was still loading
its command, still starting (here: dialing a bootstrap address that never answers) or
already running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from trainer.tiny_policy import run_manifest_table

pytestmark = pytest.mark.network

SILENT = (
    "/ip4/192.0.2.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"  # TEST-NET-1
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
# during start-up (loading the command or dialing, by the machine's load); once listening
@pytest.mark.parametrize("after", [1.5, None])
def test_a_signal_stops_start_with_exit_0(
    tmp_path: Path, sig: signal.Signals, after: float | None
) -> None:
    key = tmp_path / "node.key"
    write_key(key, Identity.generate())
    run = tmp_path / "run.toml"
    run.write_text(
        manifest_to_toml(manifest_from_table(run_manifest_table(run_id="sig-test", seed=1)))
    )
    boot = ["--bootstrap", SILENT] if after is not None else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "relay",
            "--run",
            str(run),
            "--key",
            str(key),
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--duration",
            "60",
            *boot,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    if after is not None:
        time.sleep(after)
    else:
        status = tmp_path / "d" / "status.json"
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, out[-2000:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
