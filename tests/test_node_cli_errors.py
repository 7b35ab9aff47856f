"""First contact through the real CLI: every user error is one line on stderr and exit code 2,
and everything local (model, run file, key, output directory) is checked before the node
touches the network."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.run_file import manifest_from_table, manifest_to_toml
from node.testing.records import net_manifest
from protocol.identity import Identity
from tests.support.cli import run_cli as cli


def one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-3000:])
    assert "Traceback" not in err and "ExceptionGroup" not in err, err[-3000:]
    assert err.count("\n") == 0, err[-3000:]
    assert err.startswith("swarm-node: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    key = tmp_path / "node.key"
    write_key(key, Identity.generate())
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(net_manifest("err-test")))
    return {"key": key, "run": run, "tmp": tmp_path, "empty": tmp_path / "empty-cache"}


def _start(s: dict[str, Path], *extra: str) -> subprocess.CompletedProcess:
    # the listen address is a port nobody should hold; no network is reached in these cases
    return cli(
        "start",
        "--run",
        str(s["run"]),
        "--key",
        str(s["key"]),
        "--data-dir",
        str(s["tmp"] / "d"),
        "--duration",
        "30",
        *extra,
        # an empty matplotlib cache, as on a fresh machine (its first import logs a line)
        env={"SWARM_NODE_DATA": str(s["empty"]), "MPLCONFIGDIR": str(s["tmp"] / "mpl")},
    )


def test_start_with_missing_model_dir(setup):
    res = _start(setup, "--role", "inference", "--model", "/nonexistent/model")
    one_line_error(res, "/nonexistent/model", "does not exist")
    assert "listening" not in res.stdout


@pytest.mark.parametrize("role", ["inference", "validator"])
def test_start_before_init_model_names_init_model(setup, role):
    res = _start(setup, "--role", role)
    one_line_error(res, "init-model")
    assert "listening" not in res.stdout


def test_start_with_a_model_dir_holding_only_config(setup):
    model = setup["tmp"] / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    res = _start(setup, "--role", "validator", "--model", str(model))
    one_line_error(res, str(model))
    assert "listening" not in res.stdout


def test_devnet_with_missing_run_file(setup):
    res = cli("devnet", "--run", str(setup["tmp"] / "nope.toml"), "--out", str(setup["tmp"] / "r"))
    one_line_error(res, "nope.toml", "does not exist")


def test_devnet_with_unwritable_out_dir(setup):
    res = cli("devnet", "--out", "/proc/nope/x")
    one_line_error(res, "/proc/nope/x")


def test_start_on_a_busy_port_names_the_address(setup):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}"
        res = _start(setup, "--role", "relay", "--listen", addr)
    one_line_error(res, addr, "in use")
    assert "listening on" not in res.stdout


def test_start_on_a_non_local_address_names_it(setup):
    addr = "/ip4/192.0.2.7/tcp/4001"  # TEST-NET-1: not an address of this machine
    res = _start(setup, "--role", "relay", "--listen", addr)
    one_line_error(res, addr, "not an address of this machine")


@pytest.mark.slow
def test_a_worker_without_peers_waits_instead_of_piling_up_work(setup):
    """A lone worker makes at most one batch, says it waits for peers, and stops cleanly."""
    from trainer import tiny_policy

    if not tiny_policy.is_built(tiny_policy.policy_dir()):
        pytest.skip("built-in policy not built (swarm-node init-model)")
    run = setup["tmp"] / "tiny-run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(tiny_policy.run_manifest_table("lonely"))))
    res = cli(
        "start",
        "--role",
        "inference",
        "--run",
        str(run),
        "--key",
        str(setup["key"]),
        "--data-dir",
        str(setup["tmp"] / "w"),
        "--batch-size",
        "2",
        "--duration",
        "15",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "waiting for peers" in res.stdout, res.stdout
    status = json.loads((setup["tmp"] / "w" / "status.json").read_text())
    assert status["role_status"]["produced"] <= 2, status
