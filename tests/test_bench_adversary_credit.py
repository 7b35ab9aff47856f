"""`bench adversary`'s credit cases through the bench's own code: real peer processes on
loopback, the attacker a peer. A worker that claims reward 1 in every header and serves
only solved bodies, and one that shops each counter across versions the trainer has not
published, are credited at most their true mean reward (`credit_gain` <= 1.02), every
attack message is without effect, the attacker is penalized and no honest peer banned."""

from __future__ import annotations

import pytest

from bench import adversary

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_credit_cases_meet_the_issue_targets() -> None:
    out = adversary.run(True, ["--attacks", "claimed_reward_lie,version_shopping", "--window", "2",
                               "--settle", "8"])  # fmt: skip
    cases = out["attacks"]
    assert set(cases) == {"claimed_reward_lie", "version_shopping"}
    for name, c in cases.items():
        assert c["rejected_fraction"] == 1.0, (name, c)
        assert c["attacker_penalized"] and not c["honest_banned"], (name, c)
        assert c["credit_gain"] is not None and c["credit_gain"] <= 1.02, (name, c)
