"""`swarm-node start --listen`: an address the node cannot listen on is one line on stderr and
exit 2, through the real CLI, before the node touches the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from trainer.tiny_policy import run_manifest_table


@pytest.mark.parametrize(
    "addr",
    [
        "/ip4/127.0.0.1/udp/52010/quic-v1",  # a transport the node does not listen on
        "/ip4/127.0.0.1",  # no port
        "/ip4/127.0.0.1/udp/52010",
        "/dns4/localhost/tcp/4001",  # a name, not an address of this machine
        "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
    ],
)
def test_start_refuses_an_address_it_cannot_listen_on(tmp_path: Path, addr: str) -> None:
    key = tmp_path / "node.key"
    write_key(key, Identity.generate())
    run = tmp_path / "run.toml"
    run.write_text(
        manifest_to_toml(manifest_from_table(run_manifest_table(run_id="listen-test", seed=1)))
    )
    res = subprocess.run(
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
            "--duration",
            "20",
            "--listen",
            addr,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")},
    )
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-2000:])
    assert err.count("\n") == 0 and err.startswith("swarm-node: error: --listen"), err[-2000:]
    assert addr in err, err
    assert "listening on" not in res.stdout
