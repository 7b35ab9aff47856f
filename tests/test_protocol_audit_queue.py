"""protocol.audit_queue: what a validator audits next."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.audit_queue import AuditQueue


def test_the_newest_version_is_audited_first_and_oldest_first_within_it():
    q = AuditQueue(max_staleness=2, capacity=16)
    for name, version in [("a0", 0), ("b1", 1), ("c0", 0), ("d1", 1), ("e2", 2)]:
        assert q.push(name, version) == []
    assert q.take(3) == ["e2", "b1", "d1"]
    assert q.take(3) == ["a0", "c0"]
    assert len(q) == 0


def test_records_the_trainer_can_no_longer_use_are_dropped_unaudited():
    q = AuditQueue(max_staleness=2, capacity=16)
    for k, version in enumerate([0, 0, 1, 3, 5]):
        q.push(f"r{k}", version)
    q.set_newest(5)
    assert q.take(10) == ["r4", "r3"]  # 5 - 3 = 2 is still usable; 5 - 1 = 4 is not
    assert q.dropped["stale"] == 3
    assert len(q) == 0


def test_a_claimed_version_never_moves_the_newest():
    # only set_newest (the trainer's signed versions) decides what is stale
    q = AuditQueue(max_staleness=1, capacity=16)
    q.set_newest(1)
    q.push("honest", 1)
    q.push("liar", 2**32 - 1)
    assert q.take(5) == ["liar", "honest"]
    assert q.dropped["stale"] == 0
    q.set_newest(0)  # never moves back
    assert q.newest == 1


def test_rechecks_go_first_and_are_never_dropped_as_stale():
    q = AuditQueue(max_staleness=0, capacity=16)
    q.push("old", 0)
    q.push("case", 0, recheck=True)
    q.set_newest(9)
    assert q.take(5) == ["case"]
    assert q.dropped["stale"] == 1


def test_a_full_queue_evicts_the_least_useful_record():
    q = AuditQueue(max_staleness=8, capacity=3)
    assert q.push("a0", 0) == []
    assert q.push("b2", 2) == []
    assert q.push("c0", 0) == []
    assert q.push("d1", 1) == ["a0"]  # lowest version, oldest
    assert q.push("e0", 0) == ["c0"]
    assert q.push("f9", 9) == ["e0"]
    assert q.dropped["full"] == 3
    assert q.take(5) == ["f9", "b2", "d1"]


def test_a_recheck_that_finds_the_queue_full_of_rechecks_is_refused():
    q = AuditQueue(max_staleness=8, capacity=1)
    assert q.push("case1", 0, recheck=True) == []
    assert q.push("case2", 0, recheck=True) == ["case2"]
    assert q.push("r", 5) == ["r"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        AuditQueue(max_staleness=-1, capacity=4)
    with pytest.raises(ValueError):
        AuditQueue(max_staleness=0, capacity=0)


class _Reference:
    """The queue's rules written the slow, obvious way (a list scanned on every call)."""

    def __init__(self, max_staleness: int, capacity: int) -> None:
        self.s, self.cap, self.newest = max_staleness, capacity, None
        self.rechecks: list = []
        self.items: list[tuple[int, int, object]] = []  # (version, arrival, item)
        self.n = 0

    def push(self, item, version, recheck=False):  # type: ignore[no-untyped-def]
        if recheck:
            if len(self.rechecks) + len(self.items) >= self.cap and not self.items:
                return [item]
            self.rechecks.append(item)
        else:
            self.items.append((version, self.n, item))
            self.n += 1
        out = []
        while len(self.rechecks) + len(self.items) > self.cap and self.items:
            worst = min(self.items, key=lambda e: (e[0], e[1]))
            self.items.remove(worst)
            out.append(worst[2])
        return out

    def take(self, n):  # type: ignore[no-untyped-def]
        out = self.rechecks[:n]
        del self.rechecks[: len(out)]
        while len(out) < n and self.items:
            best = min(self.items, key=lambda e: (-e[0], e[1]))
            self.items.remove(best)
            if self.newest is not None and self.newest - best[0] > self.s:
                self.items.clear()
                break
            out.append(best[2])
        return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ptn"), st.integers(0, 12), st.integers(1, 5)), max_size=300)
)
def test_the_queue_takes_and_evicts_what_the_obvious_rules_say(ops) -> None:  # type: ignore[no-untyped-def]
    """Found by review: eviction scanned the whole queue per push (O(n) under overload);
    the two-heap queue must still take and evict exactly what the rules say."""
    q, ref = AuditQueue(max_staleness=2, capacity=8), _Reference(2, 8)
    for i, (op, version, n) in enumerate(ops):
        if op == "p":
            assert q.push(i, version, recheck=(i % 17 == 0)) == ref.push(i, version, i % 17 == 0)
        elif op == "t":
            assert q.take(n) == ref.take(n)
        else:
            q.set_newest(version)
            ref.newest = version if ref.newest is None else max(ref.newest, version)
        assert len(q) == len(ref.rechecks) + len(ref.items)
