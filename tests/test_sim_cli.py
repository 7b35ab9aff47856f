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
    assert "sim: cold start: every peer meets every other for the first time" in first.stderr
    second = sim(str(scn), "--out", str(b), "--seed", "5", "--quiet")
    assert second.returncode == 0, second.stderr
    # quiet: no banner, no closing lines; at most a progress line at each quarter
    quiet_lines = second.stderr.splitlines()
    assert len(quiet_lines) <= 4 and all("%  virtual" in line for line in quiet_lines), (
        second.stderr
    )
    assert (a / "results.json").read_bytes() == (b / "results.json").read_bytes()
    report = (a / "report.md").read_text()
    for png in ("latency_cdf.png", "delivery_over_time.png", "bytes_per_peer.png"):
        assert (a / png).stat().st_size > 1000
        assert f"]({png})" in report
    assert "delivery_ratio" in report
    assert "Cold start: every peer meets every other" in report


def test_sim_bad_scenario_file_is_one_line(tmp_path):
    scn = tmp_path / "bad.toml"
    scn.write_text("[workload]\npeers = 1\n")
    result = sim(str(scn), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bad.toml" in result.stderr


DEFAULT_KEYS = {
    "peers",
    "virtual_s",
    "wall_s",
    "events",
    "events_per_s",
    "delivery_ratio",
    "latency_p50_ms",
    "latency_p99_ms",
    "lower_bound_ratio_p50",
    "lower_bound_ratio_p99",
    "duplicates_per_delivery",
}
BROADCAST_KEYS = {"completion_max_s", "lower_bound_s", "lower_bound_ratio", "star_s", "tree_s"}


def test_bench_sim_prints_the_issues_keys(monkeypatch):
    from swarm_node_bench import sim as bench
    from swarm_sim.swarm import Workload

    monkeypatch.setattr(bench, "QUICK_WORKLOAD", Workload(peers=20, duration_s=30))
    monkeypatch.setattr(bench, "QUICK_SCALE", Workload(peers=30, duration_s=20))
    out = bench.run(quick=True, args=[])
    assert DEFAULT_KEYS | BROADCAST_KEYS <= set(out)
    assert out["completion_max_s"] >= out["lower_bound_s"] > 0
    assert out["events"] > 0 and out["peers"] == 20
    # each latency is at least its bound, so their p99s are ordered the same way
    assert out["latency_p99_over_bound"] >= 1.0 and out["latency_p99_bound_ms"] > 0
    assert out["cold_start"]["peers"] == 20 and 0 < out["cold_start"]["delivery_ratio"] <= 1
    only = bench.run(quick=True, args=["broadcast"])
    assert BROADCAST_KEYS <= set(only) and not DEFAULT_KEYS & set(only)
    big = bench.run(quick=True, args=["--scale"])
    assert {"wall_s", "peak_rss_mb"} <= set(big) and big["peak_rss_mb"] > 0


def test_bench_sim_fidelity_reads_the_real_benchs_json(tmp_path):
    import json

    from swarm_node_bench import sim as bench

    real = {
        "delivery_ratio": 1.0,
        "latency_p50_ms": 50.0,
        "latency_p99_ms": 400.0,
        "params": {
            "peers": 8,
            "producers": 4,
            "rate_per_producer_per_s": 2.0,
            "duration_s": 10,
            "record_bytes": 20500,
            "header_bytes": 700,
            "loopback_rtt_ms_median": 0.3,
            "cpus": 2,
        },
    }
    path = tmp_path / "gossip.json"
    path.write_text("progress line\n" + json.dumps(real) + "\n")
    out = bench.run(quick=True, args=["--fidelity", "--gossip-json", str(path)])
    assert out["latency_p50_ms"] == 50.0 and out["latency_p99_ms"] == 400.0
    assert out["sim_latency_p50_ms"] > 0 and out["sim_delivery_ratio"] == 1.0
    assert out["p50_ratio"] == round(out["sim_latency_p50_ms"] / 50.0, 3)
    assert out["cpu_per_header_ms"] > 0
