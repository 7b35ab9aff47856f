"""Per-producer evidence (verify.producer): the count of records over the limit in a worker's window."""

import random

import pytest

from protocol.producer_cases import WINDOW_OVER, window_statistic
from verify.producer import ProducerTally

LIMIT = 1e-6


def feed(tally: ProducerTally, producer: bytes, values: list[float], counter0: int = 0) -> list:
    out = []
    for i, v in enumerate(values):
        c = counter0 + i
        f = tally.add(producer, c, producer + c.to_bytes(4, "big"), {"logprob_err_mean": v})
        if f is not None:
            out.append(f)
    return out


def test_an_honest_window_with_a_few_spikes_is_no_finding() -> None:
    tally = ProducerTally(LIMIT, window=16)
    # fewer than WINDOW_OVER of 16 records above the limit: a rare honest outlier is no finding
    values = [5e-6] * (WINDOW_OVER - 1) + [3e-7] * (17 - WINDOW_OVER)
    assert feed(tally, b"honest", values + [3e-7] * 48) == []


def test_a_minority_change_in_every_window_is_a_sequential_finding() -> None:
    """WINDOW_OVER - 1 records of every window over the limit never fail a window; the
    sequential rule over the producer's audited records finds it, naming those records."""
    from protocol.producer_cases import sequential_failed

    tally = ProducerTally(LIMIT, window=16)
    window = [5e-6 if k in (2, 7, 11) else 3e-7 for k in range(16)]
    found = feed(tally, b"minority", window * 8)
    assert found, "never found"
    f = found[0]
    assert f.rule == "sequential" and f.producer == b"minority"
    counters = [int.from_bytes(r[-4:], "big") for r in f.rollout_ids]
    assert all(window[c % 16] > LIMIT for c in counters)  # only records over the limit
    assert sequential_failed(counters)  # the claim is its own evidence
    assert max(counters) < 16 * 8


def test_a_window_with_enough_records_over_the_limit_is_a_finding_naming_its_records() -> None:
    tally = ProducerTally(LIMIT, window=16, sequential=False)
    values = [2e-6] * WINDOW_OVER + [1e-7] * (16 - WINDOW_OVER)  # a minority above
    found = feed(tally, b"stale", values)
    assert len(found) == 1
    f = found[0]
    assert f.producer == b"stale" and f.limit == LIMIT
    assert f.statistic == pytest.approx(window_statistic(values)) == 2e-6
    assert f.rollout_ids == tuple(b"stale" + i.to_bytes(4, "big") for i in range(16))
    # the next window is the next block of counters
    assert tally.held(b"stale", 16) == 0
    assert feed(tally, b"stale", [2e-6] * 15, counter0=16) == []


def test_windows_are_blocks_of_counters_in_any_audit_order() -> None:
    """A window is [16k, 16k + 16) of the producer's counters, whatever order the audits
    come in: records 8..23 are two half windows, not one."""
    tally = ProducerTally(LIMIT, window=16, sequential=False)
    assert feed(tally, b"p", [1e-3] * 16, counter0=8) == []
    assert (tally.held(b"p", 0), tally.held(b"p", 16)) == (8, 8)
    order = list(range(8)) + list(range(24, 32))
    random.Random(1).shuffle(order)
    found = [
        f
        for c in order
        if (f := tally.add(b"p", c, b"p" + c.to_bytes(4, "big"), {"logprob_err_mean": 1e-3}))
        is not None
    ]
    assert len(found) == 2
    assert sorted(found[0].rollout_ids + found[1].rollout_ids) == [
        b"p" + c.to_bytes(4, "big") for c in range(32)
    ]


def test_producers_are_judged_apart_and_records_without_the_statistic_do_not_count() -> None:
    tally = ProducerTally(LIMIT, window=4, sequential=False)
    for i in range(3):
        assert tally.add(b"a", i, bytes([i]), {"logprob_err_mean": 1e-3}) is None
        assert tally.add(b"b", i, bytes([i]), {"logprob_err_mean": 1e-9}) is None
    assert tally.add(b"a", 3, bytes([3]), {"drift": 1.0}) is None  # no statistic
    assert tally.held(b"a", 0) == 3
    assert tally.add(b"b", 3, b"x", {"logprob_err_mean": 1e-9}) is None
    assert tally.add(b"a", 3, b"y", {"logprob_err_mean": 1e-3}) is not None


def test_the_tally_forgets_the_least_recent_window_when_full() -> None:
    tally = ProducerTally(LIMIT, window=4, max_windows=2)
    tally.add(b"a", 0, b"1", {"logprob_err_mean": 1.0})
    tally.add(b"b", 0, b"1", {"logprob_err_mean": 1.0})
    tally.add(b"a", 1, b"2", {"logprob_err_mean": 1.0})  # a's window used again: b's is oldest
    tally.add(b"c", 0, b"1", {"logprob_err_mean": 1.0})
    assert (tally.held(b"a", 0), tally.held(b"b", 0), tally.held(b"c", 0)) == (2, 0, 1)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ProducerTally(0.0)
    with pytest.raises(ValueError):
        ProducerTally(LIMIT, window=0)
    with pytest.raises(ValueError):
        window_statistic([])


def test_calibration_sets_the_producer_limit_at_the_largest_honest_record() -> None:
    import json

    from verify.calibration import decode_calibration, encode_calibration
    from verify.thresholds import BF16_FLOOR, STRICT, STRICT_FLOOR, calibrate

    rows = [{"logprob_err_mean": v} for v in (1e-7, 3e-6, 2e-7)]
    assert calibrate(rows, STRICT_FLOOR).producer_logprob_err_median == 3e-6
    assert calibrate(rows[:1], STRICT_FLOOR).producer_logprob_err_median == 1e-6  # the floor
    assert (
        calibrate([], BF16_FLOOR).producer_logprob_err_median
        == BF16_FLOOR.producer_logprob_err_median
    )
    # A file written before the limit existed: what calibrate would set, from the file's
    # own measurements; without them, its regime's default (not bf16's).
    measured = {"fp32": {"max": {"logprob_err_mean": 3e-6}}}
    data = encode_calibration({"fp32": calibrate(rows, STRICT_FLOOR)}, measured, model="m")
    doc = json.loads(data)
    del doc["regimes"]["fp32"]["producer_logprob_err_median"]
    old = decode_calibration(json.dumps(doc).encode())
    assert old.regimes["fp32"].producer_logprob_err_median == 3e-6
    del doc["measured"]["fp32"]
    older = decode_calibration(json.dumps(doc).encode())
    assert older.regimes["fp32"].producer_logprob_err_median == STRICT.producer_logprob_err_median
