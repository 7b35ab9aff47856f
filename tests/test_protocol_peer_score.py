"""Peer scoring: decay, bans below the threshold, escalation, persistence, bounded memory."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.peer_score import PeerRecord, PeerScores, ScoreConfig

CFG = ScoreConfig(ban_threshold=-100.0, half_life_s=100.0, max_score=50.0, ban_base_s=60.0)


def test_score_halves_every_half_life():
    s = PeerScores(CFG)
    s.adjust("p", -40.0, 0.0)
    assert s.score("p", 0.0) == -40.0
    assert s.score("p", 100.0) == pytest.approx(-20.0)
    assert s.score("p", 300.0) == pytest.approx(-5.0)
    assert s.score("unknown", 300.0) == 0.0


def test_clock_going_backwards_reads_as_no_time():
    s = PeerScores(CFG)
    s.adjust("p", -40.0, 1000.0)
    assert s.score("p", 500.0) == -40.0


def test_scores_are_capped_and_floored():
    s = PeerScores(CFG)
    for _ in range(100):
        s.reward("good", 1.0, 0.0)
    assert s.score("good", 0.0) == 50.0
    change = s.adjust("bad", -1e9, 0.0)
    assert change.score >= 2 * CFG.ban_threshold


def test_crossing_the_threshold_bans_once_then_lifts():
    s = PeerScores(CFG)
    assert s.penalize("p", 60.0, 0.0).banned_until is None
    change = s.penalize("p", 50.0, 1.0)
    assert change.banned_until == 61.0
    assert s.is_banned("p", 30.0) and s.banned_until("p", 30.0) == 61.0
    # More penalties during the ban do not start a new one.
    assert s.penalize("p", 50.0, 2.0).banned_until is None
    assert s.expire(60.0) == []
    assert s.expire(61.0) == ["p"]
    assert not s.is_banned("p", 61.0)
    assert s.banned_until("p", 61.0) is None


def test_repeat_offenders_are_banned_longer():
    s = PeerScores(CFG)
    lengths = []
    now = 0.0
    for _ in range(4):
        until = s.penalize("p", 500.0, now).banned_until
        assert until is not None
        lengths.append(until - now)
        now = until + 10_000.0  # long after: the score has decayed back to about zero
        s.expire(now)
    assert lengths == [60.0, 120.0, 240.0, 480.0]
    assert CFG.ban_duration(1000) == CFG.ban_max_s


def test_manual_ban_and_unban():
    s = PeerScores(CFG)
    until = s.ban("p", 10.0, duration_s=5.0)
    assert until == 15.0 and s.is_banned("p", 14.9) and not s.is_banned("p", 15.0)
    s.unban("p")
    assert not s.is_banned("p", 11.0)
    assert s.expire(20.0) == []  # the lifted ban does not come back out of the heap


def test_snapshot_restores_scores_and_bans():
    s = PeerScores(CFG)
    s.penalize(b"bad", 500.0, 0.0)
    s.adjust("meh", -10.0, 0.0)
    recs = s.snapshot(50.0)
    assert all(isinstance(r, PeerRecord) for r in recs)
    t = PeerScores(CFG, recs)
    assert t.is_banned(b"bad", 59.0) and not t.is_banned("meh", 59.0)
    assert t.score("meh", 150.0) == pytest.approx(s.score("meh", 150.0))
    assert t.expire(60.0) == [b"bad"]
    assert t.record(b"bad", 60.0).offences == 1


def test_memory_is_bounded_and_bans_are_kept_longest():
    s = PeerScores(ScoreConfig(max_peers=10, ban_base_s=1e5))
    s.ban("banned", 0.0)
    for i in range(100):
        s.adjust(f"p{i}", -1.0, float(i))
    assert len(s) == 10
    assert s.is_banned("banned", 200.0)
    assert s.score("p99", 99.0) == -1.0  # the most recent stay
    assert s.score("p0", 99.0) == 0.0  # the oldest were forgotten


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ban_threshold=0.0),
        dict(half_life_s=0.0),
        dict(ban_base_s=10.0, ban_max_s=5.0),
        dict(max_peers=0),
        dict(max_score=math.inf),
    ],
)
def test_bad_config_is_refused(kwargs):
    with pytest.raises(ValueError):
        ScoreConfig(**kwargs)


def test_bad_inputs_are_refused():
    s = PeerScores(CFG)
    with pytest.raises(ValueError):
        s.adjust("p", math.nan, 0.0)
    with pytest.raises(ValueError):
        s.adjust("p", 1.0, math.inf)
    with pytest.raises(ValueError):
        s.penalize("p", -1.0, 0.0)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["adjust", "ban", "expire", "unban"]),
        st.sampled_from(["a", "b", b"c", "d"]),
        st.floats(-300, 100, allow_nan=False),
        st.floats(0, 500, allow_nan=False),
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(_ops)
def test_invariants_under_any_sequence(ops):
    s = PeerScores(ScoreConfig(max_peers=3, half_life_s=50.0, ban_base_s=100.0))
    now = 0.0
    for op, peer, x, dt in ops:
        now += dt
        if op == "adjust":
            ch = s.adjust(peer, x, now)
            if ch.banned_until is not None:
                assert ch.banned_until > now and s.is_banned(peer, now)
                assert ch.score <= s.config.ban_threshold
        elif op == "ban":
            assert s.ban(peer, now) > now
        elif op == "expire":
            for p in s.expire(now):
                assert not s.is_banned(p, now)
        else:
            s.unban(peer)
        assert len(s) <= 3
        for rec in s.snapshot(now):
            assert s.config.min_score <= rec.score <= s.config.max_score
            assert math.isfinite(rec.score)
    # Whatever happened, a restore from a snapshot agrees on every ban and score.
    t = PeerScores(s.config, s.snapshot(now))
    for rec in s.snapshot(now):
        assert t.is_banned(rec.peer, now) == s.is_banned(rec.peer, now)
        assert t.score(rec.peer, now + 10) == pytest.approx(s.score(rec.peer, now + 10))
