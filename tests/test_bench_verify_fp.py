"""`bench verify --fp N`: the false-fail count over honest records and its upper 95 % bound."""

from __future__ import annotations

import math

import pytest

from node.errors import CommandError
from swarm_node_bench import verify as bench_verify


def test_upper_bound_is_the_exact_one_sided_95_percent_bound():
    # none of n failed: the bound solves (1 - p)^n = 0.05
    for n in (10, 64, 1000):
        assert bench_verify.upper_bound_95(0, n) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
    # one of 100: P(X <= 1) at the bound is 0.05
    p = bench_verify.upper_bound_95(1, 100)
    assert (1 - p) ** 100 + 100 * p * (1 - p) ** 99 == pytest.approx(0.05, rel=1e-6)
    assert bench_verify.upper_bound_95(5, 5) == 1.0
    assert math.isclose(bench_verify.upper_bound_95(0, 1), 0.95)


def test_fp_argument_is_checked():
    assert bench_verify._parse(["--fp", "16"], quick=True).fp == 16
    with pytest.raises(CommandError, match="--fp"):
        bench_verify._parse(["--fp", "0"], quick=True)


@pytest.mark.slow
def test_fp_run_audits_honest_records_over_producers():
    out = bench_verify.run(True, ["--fp", "6", "--seeds", "2", "--hidden", "32", "--no-calibrate"])
    assert out["fp_records"] == 6 and out["fp_producers"] == 2
    assert out["fp_false_fails"] == sum(out["fp_reasons"].values())
    assert 0 < out["fp_rate_upper95"] <= 1
