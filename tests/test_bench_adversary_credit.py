"""`bench adversary`'s credit cases through the bench's own code: real peer processes on
loopback, the attacker a peer. A worker that claims reward 1 in every header and serves
only solved bodies, and ones that shop each counter across versions (unpublished ones, or
published ones within S), are credited at most their true mean reward (`credit_gain` <=
1.02), every attack message is without effect, no honest peer is banned, and the attacker
is penalized except for going back to a published version (free by design)."""

from __future__ import annotations

import pytest

from bench import adversary

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_credit_cases_meet_the_issue_targets() -> None:
    names = ["claimed_reward_lie", "version_shopping", "published_version_shopping"]
    # Every record audited: the credit estimate carries no sampling noise.
    out = adversary.run(True, ["--attacks", ",".join(names), "--window", "2", "--settle", "8",
                               "--audit-fraction", "1.0"])  # fmt: skip
    cases = out["attacks"]
    assert set(cases) == set(names)
    for name, c in cases.items():
        stepped = name == "published_version_shopping"  # may step up twice (see below)
        assert c["rejected_fraction"] >= (1.0 - 2 / c["lies"] if stepped else 1.0), (name, c)
        assert not c["honest_banned"], (name, c)
        # Going forward through the published versions gains at most one counter per step
        # (two here), a few percent of a quick run's true reward; nothing else gains.
        bound = 1.02 + (2 / max(1, c["true_solved"]) if stepped else 0)
        assert c["credit_gain"] is not None and c["credit_gain"] <= bound, (name, c)
        # Going back to a published version is free (an honest restart may): it earns 0.
        assert c["attacker_penalized"] or name == "published_version_shopping", (name, c)
    assert out["honest_credit_ratio"] >= 0.9, out  # honest work keeps its credit
