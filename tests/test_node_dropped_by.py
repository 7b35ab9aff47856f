"""`node.peer.dropped_by`: a node notices peers that keep closing its connections."""

from __future__ import annotations

from node.peer.dropped_by import DroppedBy


def test_repeated_closes_are_reported_once_with_reason_and_until() -> None:
    d = DroppedBy(window_s=60.0, threshold=3)
    assert [d.closed("A", t, "connection closed") for t in (0.0, 1.0, 2.0, 3.0)] == [
        False,
        False,
        True,
        False,
    ]
    assert d.status(3.0) == {
        "A": {"closes": 4, "reason": "connection closed", "until": 61.0}
    }  # then fewer than 3 in the window
    assert d.status(70.0) == {}  # the closes stopped: the report lapsed
    assert d.closed("A", 200.0) is False


def test_one_close_is_not_a_refusal_and_our_own_bans_do_not_count() -> None:
    d = DroppedBy(threshold=2)
    d.closed("B", 0.0)
    assert d.status(1.0) == {}
    d.closed("C", 0.0)
    d.forget("C")
    assert d.closed("C", 1.0) is False and d.status(1.0) == {}


def test_bounded() -> None:
    d = DroppedBy(threshold=1, keep=4)
    for i in range(100):
        d.closed(f"p{i}", float(i))
    assert len(d.status(100.0)) == 4
