"""A worker's budget of rollouts per published version, the devnet's share of it per
worker, and the devnet report's rollout fates (cheap: no nodes start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.commands.devnet import NodeProc, _Plan
from node.commands.devnet_report import fates_line, rollout_fates
from node.errors import CommandError
from node.roles.inference import at_budget
from node.run_file import manifest_from_table
from trainer.tiny_policy import run_manifest_table


def test_a_worker_makes_its_share_per_version_at_most_lead_versions_ahead() -> None:
    # 48 a version, 2 versions ahead: 96 before the first version is published
    assert not at_budget(95, 0, 48, 2)
    assert at_budget(96, 0, 48, 2)
    assert not at_budget(96, 1, 48, 2)  # a version went by: 48 more
    assert at_budget(144, 1, 48, 2)
    assert not at_budget(10_000, 0, 0, 2)  # 0: no bound
    assert at_budget(96, -3, 48, 2)  # a version number going back never widens it


def _plan(inference: int, pace: float) -> _Plan:
    return _Plan(inference, 1, 1, 0, 60.0, 0.25, 16, 0.0, pace)


def test_the_devnet_splits_what_the_trainer_trains_per_version_among_its_workers() -> None:
    manifest = manifest_from_table(run_manifest_table("budget-test"))
    per_version = manifest.rl_publish_every * manifest.group_size
    for workers in (1, 3, 7):
        q = _plan(workers, 1.25).rollouts_per_version(manifest)
        assert q * workers >= 1.25 * per_version > (q - 1) * workers
    assert _plan(3, 0).rollouts_per_version(manifest) == 0  # flat out
    with pytest.raises(CommandError, match="--pace"):
        _plan(3, -1).check()


def _trainer(fates: dict[str, int]) -> NodeProc:
    node = NodeProc("trainer", "trainer", Path("."), None, Path("log"))  # type: ignore[arg-type]
    node.status = {"role_status": {"fates": fates}}
    return node


def test_the_report_s_fates_add_up_to_the_rollouts_produced() -> None:
    got = rollout_fates(
        [_trainer({"trained": 70, "stale": 20, "unverified": 5, "incomplete_group": 1})], 100
    )
    assert got["counts"] == {
        "trained": 70,
        "stale": 20,
        "unverified": 5,
        "incomplete_group": 1,
        "other": 4,
    }
    assert sum(got["counts"].values()) == got["produced"] == 100
    assert got["trained"] == 0.7 and abs(sum(got[k] for k in got["counts"]) - 1) < 1e-9
    assert "70 trained (70%)" in fates_line(got)
    # a trainer's counts that explain more than was produced: an error, no shares
    bad = rollout_fates([_trainer({"trained": 90, "stale": 20})], 100)
    assert "error" in bad and "trained" not in bad
    assert "accounts for 110 rollouts, 100 were produced" in fates_line(bad)


def test_the_held_out_gain_is_paired_over_the_same_tasks() -> None:
    from node.commands.devnet_report import gain_text, heldout_gain

    first = {"solved": "0" * 60 + "1" * 40}
    # 20 tasks newly solved and 5 lost: gain +0.15, every task's change counted once
    last = {"solved": "1" * 20 + "0" * 40 + "0" * 5 + "1" * 35}
    got = heldout_gain([first, {"solved": "1" * 100}, last])
    assert got["gain"] == 0.15
    low, high = got["gain_ci95"]
    assert 0 < low < 0.15 < high < 0.3
    assert heldout_gain([first]) == {} and heldout_gain([first, {"solved": "1"}]) == {}
    assert heldout_gain([{"solve_rate": 0.2}, {"solve_rate": 0.3}]) == {}  # no outcomes kept
    text = gain_text(
        {
            **{f"checks_{k}": v for k, v in got.items()},
            "checks_first_solve_rate": 0.4,
            "checks_last_solve_rate": 0.55,
            "checks_tasks": 100,
        }
    )
    assert "+0.150" in text and "(100 tasks, 1 sample)" in text
