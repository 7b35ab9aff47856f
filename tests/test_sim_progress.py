"""The simulator's progress lines: an ETA from the recent pace, and quarter steps when quiet."""

from __future__ import annotations

import re

import pytest

from swarm_sim import runner


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(runner.time, "monotonic", c)
    return c


def _etas(text: str) -> list[str]:
    return re.findall(r"ETA (estimating|[\d,]+ s)", text)


def test_the_eta_follows_the_recent_pace_not_the_fast_start(clock: _Clock, capsys) -> None:
    show = runner.progress_printer(1000.0)
    # the first 100 virtual seconds take 2 wall seconds, then 10 virtual s per wall s
    clock.t = 1.0
    show(10.0, 1)
    clock.t = 2.0
    show(100.0, 2)
    for i in range(1, 61):
        clock.t = 2.0 + i
        show(100.0 + 10 * i, 3)
    etas = _etas(capsys.readouterr().err)
    assert etas[0] == "estimating"
    # 300 virtual s left at 10 per wall s: 30 s (the pace since the start says ~24 s)
    assert etas[-1] == "30 s", etas[-3:]


def test_quiet_prints_a_line_at_each_quarter_only(clock: _Clock, capsys) -> None:
    show = runner.progress_printer(100.0, every_fraction=0.25)
    for t in range(1, 101):
        clock.t = float(t)
        show(float(t), t)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("%")[0].split()[-1] for line in lines] == ["25.0", "50.0", "75.0", "100.0"]


def test_progress_never_passes_100_percent_and_names_the_phase(clock: _Clock, capsys) -> None:
    """A run publishes for 60 s and drains for 30 s: the progress is of all 90 s, and an
    event loop that overshoots its end (its last tick) still shows 100% and 90/90 s."""
    show = runner.progress_printer(90.0, publish_s=60.0)
    for t, wall in ((30.0, 1.0), (73.0, 2.0), (95.0, 3.0)):
        clock.t = wall
        show(t, 1)
    lines = capsys.readouterr().err.splitlines()
    assert "publishing" in lines[0] and "draining" in lines[1], lines
    assert "virtual 73/90 s" in lines[1], lines
    assert lines[2].startswith("sim: 100.0%") and "virtual 90/90 s" in lines[2], lines
