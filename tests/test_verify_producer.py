"""Per-producer evidence (verify.producer): the median rule over a worker's window."""

import pytest

from verify.producer import ProducerTally, window_median

LIMIT = 1e-6


def feed(tally: ProducerTally, producer: bytes, values: list[float]) -> list:
    out = []
    for i, v in enumerate(values):
        f = tally.add(producer, producer + i.to_bytes(4, "big"), {"logprob_err_mean": v})
        if f is not None:
            out.append(f)
    return out


def test_an_honest_window_with_a_few_spikes_is_no_finding() -> None:
    tally = ProducerTally(LIMIT, window=16)
    # 7 of 16 records above the limit: single records may be noisy, the median is not
    values = [5e-6] * 7 + [3e-7] * 9
    assert feed(tally, b"honest", values * 4) == []


def test_a_window_whose_median_is_over_the_limit_is_a_finding_naming_its_records() -> None:
    tally = ProducerTally(LIMIT, window=16)
    values = [2e-6] * 8 + [1e-7] * 8  # half above: the median is their mean, 1.05e-6
    found = feed(tally, b"stale", values)
    assert len(found) == 1
    f = found[0]
    assert f.producer == b"stale" and f.limit == LIMIT
    assert f.median == pytest.approx(window_median(values))
    assert f.rollout_ids == tuple(b"stale" + i.to_bytes(4, "big") for i in range(16))
    # the window starts afresh: the next finding needs 16 new records
    assert tally.held(b"stale") == 0
    assert feed(tally, b"stale", [2e-6] * 15) == []


def test_producers_are_judged_apart_and_records_without_the_statistic_do_not_count() -> None:
    tally = ProducerTally(LIMIT, window=4)
    for i in range(3):
        assert tally.add(b"a", bytes([i]), {"logprob_err_mean": 1e-3}) is None
        assert tally.add(b"b", bytes([i]), {"logprob_err_mean": 1e-9}) is None
        assert tally.add(b"a", bytes([100 + i]), {"drift": 1.0}) is None  # no statistic
    assert tally.held(b"a") == 3
    assert tally.add(b"b", b"x", {"logprob_err_mean": 1e-9}) is None
    assert tally.add(b"a", b"y", {"logprob_err_mean": 1e-3}) is not None


def test_the_tally_forgets_the_least_recent_producer_when_full() -> None:
    tally = ProducerTally(LIMIT, window=4, max_producers=2)
    tally.add(b"a", b"1", {"logprob_err_mean": 1.0})
    tally.add(b"b", b"1", {"logprob_err_mean": 1.0})
    tally.add(b"a", b"2", {"logprob_err_mean": 1.0})  # a seen again: b is the oldest
    tally.add(b"c", b"1", {"logprob_err_mean": 1.0})
    assert (tally.held(b"a"), tally.held(b"b"), tally.held(b"c")) == (2, 0, 1)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ProducerTally(0.0)
    with pytest.raises(ValueError):
        ProducerTally(LIMIT, window=0)
    with pytest.raises(ValueError):
        window_median([])


def test_calibration_sets_the_producer_limit_at_the_largest_honest_record() -> None:
    import json

    from verify.calibration import decode_calibration, encode_calibration
    from verify.thresholds import BF16_FLOOR, STRICT, STRICT_FLOOR, calibrate

    rows = [{"logprob_err_mean": v} for v in (1e-7, 3e-6, 2e-7)]
    assert calibrate(rows, STRICT_FLOOR).producer_logprob_err_median == 3e-6
    assert calibrate(rows[:1], STRICT_FLOOR).producer_logprob_err_median == 1e-6  # the floor
    assert calibrate([], BF16_FLOOR).producer_logprob_err_median == BF16_FLOOR.producer_logprob_err_median
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
