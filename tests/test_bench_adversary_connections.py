"""`bench adversary`'s connection cases, reduced, through the bench's own code:
real peer processes on loopback, the attacks from plain py-libp2p hosts against the
trainer, then a fresh honest peer. The issue's targets: an honest peer connects after
every case, the attacker is penalized where it can be (the relay of `relay_copy_quota`
did nothing punishable; there the honest signer must pay nothing instead), no honest
peer is banned, and the trainer's RSS grows at most 50 MB per case."""

from __future__ import annotations

import pytest

from node.testing.conn_attacks import CONN_ATTACKS
from swarm_node_bench import adversary

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_connection_cases_meet_the_issue_targets() -> None:
    out = adversary.run(
        True,
        [
            "--attacks",
            ",".join(CONN_ATTACKS),
            "--window",
            "0.5",
            "--settle",
            "0",
            "--churn",
            "100",
            "--flood",
            "80",
            "--trainer-cap",
            "60",
            "--topics",
            "5000",
            "--graft-prune",
            "1000",
            "--ihave",
            "20",
            "--oversize",
            "2",
        ],
    )
    cases = out["connection_attacks"]
    assert set(cases) == set(CONN_ATTACKS)
    details = out["connection_details"]
    for name, c in cases.items():
        assert c["honest_connect_after"], (name, details[name])
        assert not c["honest_banned"], (name, details[name])
        assert c["rss_mb_growth"] <= 50.0, (name, details[name])
        if name != "relay_copy_quota":
            assert c["attacker_penalized"], (name, details[name])
    relay = cases["relay_copy_quota"]
    assert relay["signer_penalty"] == 0.0, details["relay_copy_quota"]
    assert "replay" not in details["relay_copy_quota"]["refusals_own_phase"]
    flood = details["connection_flood"]
    assert flood["closed_by_target"] + flood["refused"] >= 80 - 60  # the excess went
    assert out["connection_targets_met"]
