"""A worker behind a cone NAT joins a public run with `swarm-node start --role inference
--join MULTIADDR`, and the run's validator accepts its rollouts: real `swarm-node start`
processes on an emulated network (`node.testing.reach_join.FullStack` on `node.testing.netlab`) -- a
relay (the bootstrap peer), a trainer and a validator on the public side, the worker
behind the NAT knowing only the relay's address and the run authority's id.

Needs root, `ip` and `iptables`: skips with the reason elsewhere, fails in CI (SWARM_CI=1).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from node.testing.netlab import NetLab
from node.testing.reach_join import FullStack, read_status
from tests.test_node_nat import _need_netlab

pytestmark = [pytest.mark.network, pytest.mark.slow]

JOIN_WITHIN_S = 100.0


def test_a_worker_behind_a_cone_nat_joins_with_join_and_its_rollouts_are_accepted(
    tmp_path: Path,
) -> None:
    _need_netlab()
    with NetLab() as lab:
        stack = FullStack(lab, tmp_path)
        try:
            home = lab.add_nat("cone")
            stack.start_public()
            join_s = stack.join(home, timeout=JOIN_WITHIN_S)
            counts = stack.validator_counts()
            assert counts["passed"] > 0 and counts.get("failed", 0) == 0, counts
            worker = read_status(tmp_path / "worker")
            assert worker["role_status"]["produced"] > 0, worker
            log = stack.log_tail("worker", 100_000)
            assert "Traceback" not in log, log[log.find("Traceback") :][:3000]
            # Behind the NAT it is not reachable (AutoNAT) and holds a slot on the relay.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                worker = read_status(tmp_path / "worker")
                if worker.get("reachability") == "private" and worker.get("relayed_addrs"):
                    break
                time.sleep(0.5)
            assert worker.get("reachability") == "private", worker
            assert worker["relayed_addrs"][0].startswith(
                f"{stack.relay_addr}/p2p-circuit/p2p/{stack.ids['worker']}"
            ), worker
            print(f"join_s {join_s:.1f}")
        finally:
            stack.close()


def test_a_fresh_machine_joins_in_one_command_fetching_the_model_from_the_run(
    tmp_path: Path,
) -> None:
    """No model directory and no `init-model` on the joining machine: the worker fetches
    the run's model files and base weights from its peers (checked against the signed
    manifest's pins) and its rollouts are accepted."""
    _need_netlab()
    with NetLab() as lab:
        stack = FullStack(lab, tmp_path, fresh_joiner=True)
        try:
            home = lab.add_nat("cone")
            stack.start_public()
            join_s = stack.join(home, timeout=JOIN_WITHIN_S)
            counts = stack.validator_counts()
            assert counts["passed"] > 0 and counts.get("failed", 0) == 0, counts
            log = stack.log_tail("worker", 100_000)
            assert "fetching the run's model from its peers" in log, log[-3000:]
            assert "model: ready in " in log, log[-3000:]
            assert "Traceback" not in log, log[log.find("Traceback") :][:3000]
            # into the node's data root (its --data-dir), not the machine's empty one
            assert not (tmp_path / "fresh-machine").exists()
            fetched = list((tmp_path / "worker" / "models").glob("run-*/config.json"))
            assert len(fetched) == 1, fetched
            print(f"fresh join_s {join_s:.1f}")
        finally:
            stack.close()
