"""`swarm-node doctor` on an emulated network (`node.testing.netlab`): real `swarm-node start`
bootstrap peers on the public side, the doctor run behind a cone NAT. It names the causes
that need a network: no route to the bootstrap address, and not publicly reachable with no
relay on offer; behind the NAT with a relay bootstrap it says the node is not publicly
reachable and names the relay it would use.

Needs root, `ip` and `iptables`: skips with the reason elsewhere, fails in CI (SWARM_CI=1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.keyfile import write_key
from node.testing.netlab import PUBLIC_IP, NetLab
from protocol.identity import Identity
from tests.support.cli import ROOT, run_cli
from tests.test_node_nat import _need_netlab
from tests.test_node_run_discovery import _random_model_run, _stop, _wait_status

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _in_ns(ns: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _start_in(
    ns: str, tmp: Path, name: str, role: str, port: int, run: Path
) -> tuple[subprocess.Popen[str], str]:
    key = tmp / f"{name}.key"
    write_key(key, Identity.generate())
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            role,
            "--key",
            str(key),
            "--data-dir",
            str(tmp / name),
            "--listen",
            f"/ip4/{PUBLIC_IP}/tcp/{port}",
            "--run",
            str(run),
            "--duration",
            "300",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    return proc, f"/ip4/{PUBLIC_IP}/tcp/{port}/p2p/{run_cli('id', str(key)).stdout.strip()}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A public relay and a public validator (no relay service) of one signed run, and a
    host behind a cone NAT."""
    _need_netlab()
    tmp = tmp_path_factory.mktemp("doctor-nat")
    authority = tmp / "authority.key"
    write_key(authority, Identity.generate())
    run = _random_model_run(tmp, "natted", authority)
    net = NetLab()
    procs: list[subprocess.Popen[str]] = []
    try:
        relay, relay_addr = _start_in(net.wan, tmp, "relay", "relay", 4001, run)
        procs.append(relay)
        validator, validator_addr = _start_in(net.wan, tmp, "validator", "validator", 4002, run)
        procs.append(validator)
        home = net.add_nat("cone")
        _wait_status(tmp, "relay", 90)
        _wait_status(tmp, "validator", 120)
        yield {
            "home": home,
            "listen": f"/ip4/{net.host_ip(home)}/tcp/0",
            "relay": relay_addr,
            "validator": validator_addr,
        }
    finally:
        _stop(*procs)
        net.close()


def test_doctor_behind_a_nat_is_not_reachable_and_names_the_relay_it_would_use(lab) -> None:
    r = _in_ns(lab["home"], "doctor", "--join", lab["relay"], "--listen", lab["listen"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "info reachable: not publicly reachable: " in r.stdout, r.stdout
    assert f"ok   relay: would use {lab['relay']} (announced through identify)" in r.stdout, (
        r.stdout
    )
    assert r.stdout.strip().endswith("doctor: this node could join")


def test_doctor_names_no_relay(lab) -> None:
    r = _in_ns(lab["home"], "doctor", "--join", lab["validator"], "--listen", lab["listen"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"ok   bootstrap {lab['validator']}: answered" in r.stdout, r.stdout
    assert "info reachable: not publicly reachable: " in r.stdout, r.stdout
    assert (
        "FAIL relay: no relay: not publicly reachable and no bootstrap peer announces a relay"
        in r.stdout
    )
    assert r.stdout.strip().endswith("doctor: this node could NOT join: no relay"), r.stdout


def test_doctor_names_no_route(lab) -> None:
    nowhere = f"/ip4/10.78.0.1/tcp/4001/p2p/{Identity.generate().peer_id_b58}"  # the router has no route there
    r = _in_ns(lab["home"], "doctor", "--join", nowhere, "--listen", lab["listen"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAIL bootstrap {nowhere}: no route: " in r.stdout, r.stdout
    assert "doctor: this node could NOT join: no route at " in r.stdout, r.stdout
