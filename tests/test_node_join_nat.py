"""A worker behind a cone NAT joins a public run with `swarm-node start --role inference
--join MULTIADDR`, and the run's validator accepts its rollouts: real `swarm-node start`
processes on an emulated network (`bench._netlab`) -- a relay (the bootstrap peer), a
trainer and a validator on the public side, the worker behind the NAT knowing only the
relay's address and the run authority's id.

Needs root, `ip` and `iptables`: skips with the reason elsewhere, fails in CI (SWARM_CI=1).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench._netlab import PUBLIC_IP, NetLab
from node.keyfile import write_key
from node.run_file import load_run_manifest, manifest_to_toml
from protocol.identity import Identity
from tests.support.cli import ROOT, run_cli
from tests.test_node_devnet import small_run  # noqa: F401 - the fixture
from tests.test_node_nat import _need_netlab
from tests.test_node_run_discovery import _stop, _wait_status

pytestmark = [pytest.mark.network, pytest.mark.slow]

JOIN_WITHIN_S = 100.0


def _start(ns: str, tmp: Path, name: str, role: str, listen: str, *extra: str) -> subprocess.Popen[bytes]:
    log = open(tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "node.cli", "start", "--role", role,
             "--key", str(tmp / f"{name}.key"), "--data-dir", str(tmp / name), "--listen", listen,
             "--duration", "240", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                 "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    finally:
        log.close()


def _status(tmp: Path, name: str) -> dict:
    try:
        return json.loads((tmp / name / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_worker_behind_a_cone_nat_joins_with_join_and_its_rollouts_are_accepted(
    small_run: Path, tmp_path: Path  # noqa: F811
) -> None:
    _need_netlab()
    keys = {name: Identity.generate() for name in ("authority", "relay", "trainer", "validator", "worker")}
    for name, key in keys.items():
        write_key(tmp_path / f"{name}.key", key)
    ids = {name: key.peer_id_b58 for name, key in keys.items()}
    manifest = dataclasses.replace(load_run_manifest(small_run), validator_keys=(keys["validator"].peer_id,),
                                   trainer_keys=(keys["trainer"].peer_id,))
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(manifest))
    signed = run_cli("run", "sign", str(run), "--key", str(tmp_path / "authority.key"), "--version", "1")
    assert signed.returncode == 0, signed.stderr
    relay_addr = f"/ip4/{PUBLIC_IP}/tcp/4001/p2p/{ids['relay']}"
    procs: list[subprocess.Popen[bytes]] = []
    with NetLab() as net:
        try:
            home = net.add_nat("cone")
            procs.append(_start(net.wan, tmp_path, "relay", "relay", f"/ip4/{PUBLIC_IP}/tcp/4001", "--run", str(run)))
            _wait_status(tmp_path, "relay", 90)
            boot = ("--run", str(run), "--bootstrap", relay_addr)
            procs.append(_start(net.wan, tmp_path, "trainer", "trainer", f"/ip4/{PUBLIC_IP}/tcp/4002", *boot))
            procs.append(_start(net.wan, tmp_path, "validator", "validator", f"/ip4/{PUBLIC_IP}/tcp/4003", *boot,
                                "--audit-fraction", "1.0", "--batch-size", "2"))
            _wait_status(tmp_path, "trainer", 120)
            _wait_status(tmp_path, "validator", 120)
            started = time.monotonic()
            procs.append(_start(home, tmp_path, "worker", "inference", f"/ip4/{net.host_ip(home)}/tcp/4100",
                                "--join", relay_addr, "--authority", ids["authority"], "--batch-size", "2"))
            seen_private = False
            while time.monotonic() - started < JOIN_WITHIN_S:
                worker = _status(tmp_path, "worker")
                seen_private |= worker.get("reachability") == "private" and bool(worker.get("relayed_addrs"))
                if _status(tmp_path, "validator").get("role_status", {}).get("passed", 0) > 0:
                    break
                assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
                time.sleep(0.5)
            join_s = time.monotonic() - started
            validator = _status(tmp_path, "validator")["role_status"]
            log = (tmp_path / "worker.log").read_text(errors="replace")
            assert validator.get("passed", 0) > 0, (validator, log[-3000:])
            assert validator.get("failed", 0) == 0, validator
            assert _status(tmp_path, "worker")["role_status"]["produced"] > 0
            assert "Traceback" not in log, log[log.find("Traceback"):][:3000]
            # Behind the NAT it is not reachable (AutoNAT) and holds a slot on the relay.
            deadline = time.monotonic() + 30
            while not seen_private and time.monotonic() < deadline:
                worker = _status(tmp_path, "worker")
                seen_private = worker.get("reachability") == "private" and bool(worker.get("relayed_addrs"))
                time.sleep(0.5)
            assert seen_private, worker
            assert worker["relayed_addrs"][0].startswith(f"{relay_addr}/p2p-circuit/p2p/{ids['worker']}")
            print(f"join_s {join_s:.1f}")
        finally:
            _stop(*procs)
