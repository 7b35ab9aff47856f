"""`protocol.catch_up`: who is asked what, watermarks and paging, receipts, accounting."""

from __future__ import annotations

import pytest

from protocol import catch_up as cu
from protocol.errors import LocalProtocolError

A, B = "peer-a", "peer-b"


def _id(i: int) -> bytes:
    return i.to_bytes(32, "big")


def test_a_puller_asks_a_joined_peer_at_once_from_zero_then_pulls_what_it_lacks() -> None:
    m = cu.CatchUp(pulls=True)
    [ask] = m.handle(cu.PeerJoined(A, 100.0))
    assert ask == cu.Ask(A, 0.0, 0, None)
    out = m.handle(cu.Answered(A, (_id(1), _id(2)), (10.0, 11.0), False, (True, False), 100.5))
    assert out == [cu.Pull(A, (_id(2),))]
    assert m.handle(cu.Tick(101.0)) == []  # next round after interval_s
    [again] = m.handle(cu.Tick(100.5 + m.config.interval_s))
    assert again.since == max(0.0, 11.0 - m.config.overlap_s)


def test_pages_continue_from_the_newest_time_until_the_round_ends() -> None:
    m = cu.CatchUp(cu.CatchUpConfig(page=2), pulls=True)
    m.handle(cu.PeerJoined(A, 0.0))
    out = m.handle(cu.Answered(A, (_id(1), _id(2)), (5.0, 6.0), True, (False, False), 1.0))
    assert out == [cu.Pull(A, (_id(1), _id(2))), cu.Ask(A, 6.0, 0, None)]
    assert m.handle(cu.Answered(A, (_id(3),), (7.0,), False, (False,), 1.1)) == [
        cu.Pull(A, (_id(3),))
    ]


def test_a_worker_asks_only_trainers_and_only_for_its_own_work() -> None:
    me = b"\x01" * 34
    m = cu.CatchUp(pulls=False, producer=me)
    assert m.handle(cu.PeerJoined(A, 0.0)) == []  # not a trainer
    [ask] = m.handle(cu.PeerJoined(B, 0.0, receipts_from=True))
    assert ask.producer == me
    out = m.handle(cu.Answered(B, (_id(1),), (3.0,), False, (False,), 0.5))
    assert out == [cu.Receipt(B, (_id(1),))]


def test_staleness_bounds_what_is_asked_for_and_failures_retry_later() -> None:
    m = cu.CatchUp(pulls=True)
    m.handle(cu.Tick(0.0, version=10, max_staleness=3))
    [ask] = m.handle(cu.PeerJoined(A, 1.0))
    assert ask.min_version == 7
    assert m.handle(cu.Failed(A, 2.0)) == []
    assert m.handle(cu.Tick(2.5)) == []
    assert len(m.handle(cu.Tick(2.0 + m.config.retry_s))) == 1


def test_answers_nobody_asked_for_are_ignored_and_bad_ones_are_our_bug() -> None:
    m = cu.CatchUp(pulls=True)
    assert m.handle(cu.Answered(A, (_id(1),), (1.0,), False, (False,), 0.0)) == []
    m.handle(cu.PeerJoined(A, 0.0))
    with pytest.raises(LocalProtocolError):
        m.handle(cu.Answered(A, (_id(1),), (), False, (False,), 0.0))


def test_classify_delivered_pending_and_too_stale() -> None:
    own = [(_id(1), 5), (_id(2), 5), (_id(3), 1)]
    d = cu.classify(own, [_id(1)], version=5, max_staleness=2)
    assert d.delivered == {_id(1)} and d.pending == {_id(2)} and d.too_stale == {_id(3)}
    assert d.counts() == {"produced": 3, "delivered": 1, "pending": 1, "too_stale": 1}


def test_a_hello_from_a_peer_already_joined_does_not_restart_its_round_from_zero() -> None:
    # Discovery re-greets connected peers every few seconds; each hello re-read the
    # peer's whole store from time 0 (every id it holds, page after page).
    m = cu.CatchUp(pulls=True)
    m.handle(cu.PeerJoined(A, 100.0))
    m.handle(cu.Answered(A, (_id(1),), (90.0,), False, (True,), 100.5))
    assert m.handle(cu.PeerJoined(A, 101.0)) == []
    [nxt] = m.handle(cu.Tick(100.5 + m.config.interval_s))
    assert nxt.since > 0.0
    # a worker learns from the hello that a connected peer is a trainer: asked at once
    me = b"\x01" * 34
    w = cu.CatchUp(pulls=False, producer=me)
    assert w.handle(cu.PeerJoined(B, 0.0)) == []
    [ask] = w.handle(cu.PeerJoined(B, 0.5, receipts_from=True))
    assert ask == cu.Ask(B, 0.0, 0, me)
    # after it leaves, a return is a rejoin: from zero again
    m.handle(cu.PeerLeft(A, 200.0))
    [back] = m.handle(cu.PeerJoined(A, 201.0))
    assert back.since == 0.0
