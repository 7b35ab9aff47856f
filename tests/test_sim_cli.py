"""`swarm-node sim`: a TOML scenario in, results.json + plots + report.md out, twice the same."""

from __future__ import annotations

import subprocess
import sys

SCENARIO = """
name = "tiny"
[workload]
peers = 20
duration_s = 40
publish_interval_s = 10
version_interval_s = 15
[churn]
churn_per_hour = 30
offline_mean_s = 10
[adversary.fractions]
spam = 0.05
"""


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sim_writes_identical_results_plots_and_report(tmp_path):
    scn = tmp_path / "tiny.toml"
    scn.write_text(SCENARIO)
    a, b = tmp_path / "a", tmp_path / "b"
    first = sim(str(scn), "--out", str(a), "--seed", "5")
    assert first.returncode == 0, first.stderr
    assert "sim: done" in first.stderr
    second = sim(str(scn), "--out", str(b), "--seed", "5", "--quiet")
    assert second.returncode == 0, second.stderr
    assert second.stderr == ""
    assert (a / "results.json").read_bytes() == (b / "results.json").read_bytes()
    report = (a / "report.md").read_text()
    for png in ("latency_cdf.png", "delivery_over_time.png", "bytes_per_peer.png"):
        assert (a / png).stat().st_size > 1000
        assert f"]({png})" in report
    assert "delivery_ratio" in report


def test_sim_bad_scenario_file_is_one_line(tmp_path):
    scn = tmp_path / "bad.toml"
    scn.write_text("[workload]\npeers = 1\n")
    result = sim(str(scn), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bad.toml" in result.stderr
