"""`bench adversary`'s credit cases through the bench's own code: real peer processes on
loopback, the attacker a peer. A worker that claims reward 1 in every header and serves
only solved bodies, one that shops each counter across published versions within S (going
back), and one that stays on the oldest published version that solved (never going back)
are credited at most their true mean reward (`credit_gain` <= 1.02) at the node's default
audit fraction (credit counts every held body, not the audited sample), every attack
message is without effect, no honest peer is banned, honest work keeps its credit, and
the attacker is penalized except for staying low (a slow honest worker may be that late:
its stale claims earn 0, free). Shopping ahead of the published version is refused at
admission (`tests/test_protocol_credit.py`)."""

from __future__ import annotations

import pytest

from swarm_node_bench import adversary

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_credit_cases_meet_the_issue_targets() -> None:
    names = ["claimed_reward_lie", "published_version_shopping", "stay_low_version_shopping"]
    out = adversary.run(
        True,
        [
            "--attacks",
            ",".join(names),
            "--window",
            "2",
            "--settle",
            "8",
            "--audit-fraction",
            "0.25",
        ],
    )
    cases = out["attacks"]
    assert set(cases) == set(names)
    for name, c in cases.items():
        assert c["rejected_fraction"] == 1.0, (name, c)
        assert not c["honest_banned"], (name, c)
        assert c["credit_gain"] is not None and c["credit_gain"] <= 1.02, (name, c)
        assert c["attacker_penalized"] or name == "stay_low_version_shopping", (name, c)
    assert out["honest_credit_ratio"] >= 0.98, out  # honest work keeps its credit


def test_the_second_credit_rounds_cases_gain_nothing_and_cost_honest_workers_nothing() -> None:
    """A minority change per window, partial windows over many keys, a thief naming a
    worker's body digest, key shopping and a relay holding a restart batch: none is
    credited above what its work was worth, and no honest key (nor the victim the case
    plays) pays anything at any honest peer."""
    names = [
        "minority_change_per_window",
        "partial_window_keys",
        "bound_digest_theft",
        "key_shopping",
        "delayed_restart_batch",
    ]
    out = adversary.run(True, ["--attacks", ",".join(names), "--settle", "8"])
    cases = out["attacks"]
    assert set(cases) == set(names)
    for name, c in cases.items():
        assert c["honest_penalty"] == 0, (name, c)
        assert not c["honest_banned"], (name, c)
        assert c["credit_gain"] is not None and c["credit_gain"] <= 1.02, (name, c)
