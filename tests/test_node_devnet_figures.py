"""The devnet's figures read at a glance: the live table fits 80 columns and shows the
policy version, the held-out solve rate and a legend; the closing summary is at most 10
lines, led by what became of the rollouts and the closing paired evaluation; report.json
names the trainer's checks and the closing evaluation apart; learning.png's headline is
the closing result; the plots show trained, stale and refused work."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from node.commands import devnet
from node.commands.devnet_nodes import NodeProc
from node.commands.devnet_report import learning, summary_lines, write_report


class _Running:
    returncode = None

    def poll(self) -> None:
        return None


SERIES = [
    {
        "t": 10.0 * i,
        "version": i,
        "solve_rate": 0.2 + 0.01 * i,
        "reward_mean": 0.25,
        "solved": "1" * (20 + i) + "0" * (108 - i),
    }
    for i in range(30)
]
FINAL = {
    "version": 29,
    "tasks": 512,
    "samples_per_task": 2,
    "warm_start_solve_rate": 0.21,
    "final_solve_rate": 0.3,
    "gain": 0.09,
    "gain_ci95": [0.07, 0.11],
}


def _nodes(tmp: Path) -> list[NodeProc]:
    def node(name: str, role: str, status: dict) -> NodeProc:
        return NodeProc(name, role, tmp, _Running(), tmp / f"{name}.log", status=status)  # type: ignore[arg-type]

    trainer = {
        "policy_version": 29,
        "peers": 4,
        "role_status": {
            "verified": 900,
            "rejected": 3,
            "learning": SERIES,
            "fates": {"trained": 1800, "stale": 90, "unverified": 20},
        },
        "counters": {"stored_rollout_record": 2000},
    }
    worker = {
        "policy_version": 28,
        "peers": 4,
        "role_status": {"produced": 666, "reward_mean": 0.3},
        "delivery": {"produced": 666, "trained": 600, "too_stale": 30, "refused": 1},
    }
    validator = {
        "policy_version": 29,
        "peers": 4,
        "role_status": {"passed": 400, "failed": 1, "sampled": 500, "queued": 12},
    }
    return [
        node("trainer", "trainer", trainer),
        *(node(f"worker{i}", "inference", worker) for i in (1, 2, 3)),
        node("validator1", "validator", validator),
    ]


def test_the_live_table_fits_80_columns_with_version_solve_rate_and_legend(tmp_path) -> None:
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(
        devnet._table(_nodes(tmp_path), 120.0, 300.0)
    )
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "version 29" in text and "held-out 0.490" in text, text
    assert "1800 trained" in text and "q12" in text, text
    assert "made: rollouts generated" in text and "loading:" in text, text


def test_the_closing_summary_is_at_most_10_lines_led_by_fates_and_the_final_result(
    tmp_path: Path,
) -> None:
    nodes = _nodes(tmp_path)
    report = write_report(tmp_path, {}, nodes, [], FINAL)
    lines = summary_lines(report, nodes, tmp_path)
    assert len(lines) <= 10, lines
    assert lines[0].startswith("devnet: of 1998 rollouts produced: ")
    final = next(i for i, x in enumerate(lines) if "final evaluation (512 held-out tasks" in x)
    during = next(i for i, x in enumerate(lines) if "during the run (128 tasks" in x)
    assert final < during, lines
    assert lines[-1].startswith(f"devnet: report in {tmp_path} (report.json; ")


def test_report_names_each_measurement_apart_and_the_plots_show_fates(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path)
    report = write_report(tmp_path, {}, nodes, [{"t": 1.0, "produced": 1}], FINAL)
    learned = report["learning"]
    assert "final_solve_rate" not in learned and "warm_start_solve_rate" not in learned
    assert learned["checks_last_solve_rate"] == SERIES[-1]["solve_rate"]
    assert learned["final"]["final_solve_rate"] == 0.3
    totals = report["totals"]
    assert (totals["trained"], totals["stale"], totals["refused"]) == (1800, 90, 4)
    assert {"progress.png", "workers.png", "learning.png"} <= set(report["plots"])


def test_learning_headline_is_the_closing_result(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.figure

    titles: list[str] = []
    original = matplotlib.figure.Figure.suptitle

    def spy(self, text, **kw):  # type: ignore[no-untyped-def]
        titles.append(text)
        return original(self, text, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", spy)
    learning(tmp_path, _nodes(tmp_path), FINAL)
    assert titles and titles[0].startswith("final evaluation (512 held-out tasks x 2 samples)")
