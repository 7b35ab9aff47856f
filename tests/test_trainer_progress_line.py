"""The trainer's progress line shows the reward figures its `status` shows."""

from __future__ import annotations

from node.roles.trainer import progress_line


def _status(**last: float) -> dict:
    return {"train_tokens_per_s": 12.5, "refused": {}, "last": last}


def test_the_progress_line_shows_the_usable_reward_mean_status_shows() -> None:
    summary = {"verified": 40, "usable_reward_mean": 0.3125}
    line = progress_line(3, 7, summary, _status(reward_mean=0.25))
    assert "reward mean 0.312" in line, line
    assert "last batch 0.250" in line, line
    assert "40 verified" in line and "version 3" in line


def test_before_any_usable_rollout_or_step_it_says_so_instead_of_zero() -> None:
    line = progress_line(0, 0, {"verified": 0, "usable_reward_mean": None}, _status())
    assert "reward mean n/a" in line and "last batch n/a" in line, line
    assert "0.000" not in line
