"""The body-pull schedule (`protocol.body_pull`), driven with explicit times."""

from __future__ import annotations

import pytest

from protocol import body_pull as bp

PRODUCER, SENDER, OTHER = "producer", "sender", "other"
ORIGIN = (b"signer", SENDER)


def _want(s: bp.PullSchedule, rid: str = "r1", now: float = 0.0, producer: str = PRODUCER) -> None:
    s.handle(bp.Want(rid, (producer, SENDER), now, ORIGIN))


def _due(s: bp.PullSchedule, now: float, connected=(PRODUCER, SENDER), known=()) -> list:
    return s.handle(bp.Due(now, frozenset(connected), frozenset(known)))


def _fetches(actions: list) -> list[bp.Fetch]:
    return [a for a in actions if isinstance(a, bp.Fetch)]


def test_producer_is_asked_first_and_ids_are_batched_per_source() -> None:
    s = bp.PullSchedule(bp.PullConfig(batch=2))
    for i in range(3):
        _want(s, f"r{i}")
    fetches = _fetches(_due(s, 0.0))
    assert [f.source for f in fetches] == [PRODUCER, PRODUCER]
    assert [len(f.ids) for f in fetches] == [2, 1]
    assert s.in_flight() == 3
    assert _due(s, 0.0) == []  # nothing goes out twice while in flight


def test_served_ends_the_pull() -> None:
    s = bp.PullSchedule()
    _want(s)
    _due(s, 0.0)
    assert s.handle(bp.Answered("r1", PRODUCER, bp.Outcome.SERVED, 0.1)) == [bp.Done("r1")]
    assert "r1" not in s and s.in_flight() == 0 and s.next_due() is None


def test_producer_that_lacks_its_own_body_is_charged_and_the_sender_is_tried() -> None:
    s = bp.PullSchedule(bp.PullConfig(retry_s=1.0))
    _want(s)
    _due(s, 0.0)
    acts = s.handle(bp.Answered("r1", PRODUCER, bp.Outcome.EMPTY, 0.1))
    assert acts == [bp.Charge(PRODUCER, bp.PRODUCER_LACKS_BODY)]
    assert s.next_due() == pytest.approx(1.1)
    assert _fetches(_due(s, 1.1)) == [bp.Fetch(SENDER, ("r1",))]
    # A forwarder that lacks the body is not charged for it.
    assert s.handle(bp.Answered("r1", SENDER, bp.Outcome.EMPTY, 1.2)) == []


def _exhaust(s: bp.PullSchedule, outcome: bp.Outcome) -> list:
    """Answer every fetch with `outcome` until the pull ends; the last actions."""
    now, acts = 0.0, []
    for _ in range(100):
        acts = _due(s, now)
        for f in _fetches(acts):
            acts = s.handle(bp.Answered("r1", f.source, outcome, now))
        if "r1" not in s:
            return acts
        now = s.next_due() or now + 1
    raise AssertionError("the pull never ended")


def test_unreachable_sources_are_no_evidence() -> None:
    s = bp.PullSchedule(bp.PullConfig(attempts=3))
    _want(s)
    acts = _exhaust(s, bp.Outcome.UNREACHABLE)
    give_up = [a for a in acts if isinstance(a, bp.GiveUp)]
    assert give_up and give_up[0].answered == 0 and give_up[0].origin == ORIGIN


def test_silence_of_the_producer_on_an_open_stream_is_evidence() -> None:
    s = bp.PullSchedule(bp.PullConfig(attempts=4))
    _want(s)
    acts = _exhaust(s, bp.Outcome.SILENT)
    # Sources alternate producer, sender: only the producer's two silences count.
    assert [a.answered for a in acts if isinstance(a, bp.GiveUp)] == [2]


def test_forwarders_that_lack_the_body_are_no_evidence() -> None:
    s = bp.PullSchedule(bp.PullConfig(attempts=3))
    s.handle(bp.Want("r1", (PRODUCER, SENDER), 0.0, ORIGIN))
    acts = []
    now = 0.0
    while "r1" in s:
        acts = _due(s, now, connected=(SENDER, OTHER))  # the producer is not connected
        for f in _fetches(acts):
            acts = s.handle(bp.Answered("r1", f.source, bp.Outcome.EMPTY, now))
        now = s.next_due() or now + 1
    assert [a.answered for a in acts if isinstance(a, bp.GiveUp)] == [0]


def test_our_own_store_failing_blames_nobody() -> None:
    s = bp.PullSchedule(bp.PullConfig(attempts=2))
    _want(s)
    acts = _exhaust(s, bp.Outcome.LOCAL_FAILURE)
    assert [a.answered for a in acts if isinstance(a, bp.GiveUp)] == [0]
    assert not [a for a in acts if isinstance(a, bp.Charge)]


def test_a_pull_waits_for_a_known_source_without_spending_attempts() -> None:
    s = bp.PullSchedule(bp.PullConfig(park_s=1.0, max_parks=5, attempts=2))
    _want(s)
    for t in range(5):
        assert _due(s, float(t), connected=(), known=(PRODUCER,)) == []
    assert s.stats.parked == 5 and "r1" in s
    # Out of parks: now it spends attempts (and, with no one to ask, gives up).
    acts = _due(s, 5.0, connected=(), known=(PRODUCER,))
    acts += _due(s, s.next_due() or 6.0, connected=(), known=(PRODUCER,))
    assert any(isinstance(a, bp.GiveUp) and a.answered == 0 for a in acts)


def test_sources_nobody_can_reach_spend_attempts_at_once() -> None:
    s = bp.PullSchedule(bp.PullConfig(attempts=1))
    _want(s)
    acts = _due(s, 0.0, connected=(), known=())
    assert acts == [bp.GiveUp("r1", ORIGIN, 0, 0.0)]


def test_other_connected_peers_are_asked_after_widen_after_attempts() -> None:
    s = bp.PullSchedule(bp.PullConfig(widen_after=2, widen_to=1, retry_s=0.5))
    _want(s)
    connected = (PRODUCER, SENDER, OTHER)
    asked = []
    now = 0.0
    for _ in range(3):
        (f,) = _fetches(_due(s, now, connected=connected))
        asked.append(f.source)
        s.handle(bp.Answered("r1", f.source, bp.Outcome.EMPTY, now))
        now = s.next_due()
    assert asked == [PRODUCER, SENDER, PRODUCER]
    (f,) = _fetches(_due(s, now, connected=connected))
    assert OTHER in s.sources("r1")


def test_the_pull_window_ends_a_pull() -> None:
    s = bp.PullSchedule(bp.PullConfig(window_s=10.0, attempts=100, retry_max_s=4.0))
    _want(s)
    acts = _exhaust(s, bp.Outcome.EMPTY)
    (g,) = [a for a in acts if isinstance(a, bp.GiveUp)]
    assert g.now <= 10.0 + 4.0


def test_pending_pulls_are_bounded_per_producer() -> None:
    s = bp.PullSchedule(bp.PullConfig(per_producer=2))
    for i in range(5):
        _want(s, f"r{i}")
    _want(s, "x", producer="another")
    assert len(s) == 3 and s.stats.refused_full == 3
    _due(s, 0.0)
    s.handle(bp.Answered("r0", PRODUCER, bp.Outcome.SERVED, 0.1))
    _want(s, "r9")
    assert "r9" in s


def test_ids_in_flight_are_bounded() -> None:
    s = bp.PullSchedule(bp.PullConfig(max_in_flight=4))
    for i in range(10):
        _want(s, f"r{i}", producer=f"p{i}")
    fetched = sum(
        len(f.ids) for f in _fetches(_due(s, 0.0, connected=[f"p{i}" for i in range(10)]))
    )
    assert fetched == 4


def test_a_late_answer_from_a_source_no_longer_asked_is_ignored() -> None:
    s = bp.PullSchedule()
    _want(s)
    _due(s, 0.0)
    s.handle(bp.Answered("r1", PRODUCER, bp.Outcome.SILENT, 5.0))
    assert s.handle(bp.Answered("r1", PRODUCER, bp.Outcome.SERVED, 5.1)) == []
    assert "r1" in s


def test_config_is_checked() -> None:
    with pytest.raises(Exception, match="attempts"):
        bp.PullConfig(attempts=0)
