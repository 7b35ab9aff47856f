"""Work accounting: dense assignment counters, and what a gap in them costs.

Tasks are assigned from (run seed, producer, policy version, counter), so the counter is
what keeps a worker from choosing its tasks: a worker that generates counters 0..511 and
publishes only the ones it solved ("counter shopping") would look like a perfect solver.
The rule here: a producer's counters are dense. Every counter between the lowest and the
highest one we have seen from a producer is *produced*; one we never saw, once it is more
than `GapRule.lag` counters below the highest (messages still in flight, reordered or
being caught up are not counted yet), is *withheld*. Withheld work counts as produced with reward 0, and past a small allowance
(in-flight rollouts, a lost message) the producer's rollouts are refused and it is scored
down. A shopper that stays within the allowance gains at most the allowance's share.

Pure and bounded: no IO, no clocks; at most `max_producers` producers (least recently
heard forgotten first) and at most `max_pending` out-of-order counters per producer (a
producer past that is refused: nobody honest leaves that many holes).

Public API
----------
`GapRule(allowance=16, allowance_fraction=0.02, lag=64)`
`WorkLedger(rule=GapRule(), max_producers=100_000, max_pending=65_536)`
    `.add(producer, counter, reward) -> None`    a published rollout (each counter once)
    `.standing(producer) -> Standing`            produced, published, withheld, rewards
    `.allowed(producer) -> bool`                 withheld within the allowance
    `.counted_reward(producer) -> float | None`  mean reward over *produced* work
                                                 (withheld counts 0); None if unknown
`Standing(first, last, published, withheld, reward_sum, allowed)`; `.produced`, `.weight`
(the share of produced work the producer showed).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["GapRule", "Standing", "WorkLedger"]


@dataclass(frozen=True, slots=True)
class GapRule:
    """How many withheld counters a producer may have: `allowance` plus a fraction of its
    produced work (honest losses grow with volume)."""

    allowance: int = 16
    allowance_fraction: float = 0.02
    lag: int = 64  # the newest counters are not judged yet (still in flight)

    def __post_init__(self) -> None:
        if self.allowance < 0 or not 0.0 <= self.allowance_fraction < 1.0 or self.lag < 0:
            raise ValueError("GapRule: allowance >= 0, 0 <= allowance_fraction < 1, lag >= 0")

    def limit(self, produced: int) -> float:
        return self.allowance + self.allowance_fraction * produced


@dataclass(frozen=True, slots=True)
class Standing:
    first: int
    last: int
    published: int
    withheld: int
    reward_sum: float
    allowed: bool

    @property
    def produced(self) -> int:
        return self.last - self.first + 1

    @property
    def weight(self) -> float:
        return self.published / self.produced if self.produced else 0.0


class _Producer:
    __slots__ = ("first", "floor", "last", "pending", "published", "reward_sum", "overflow")

    def __init__(self, counter: int) -> None:
        self.first = self.floor = self.last = counter
        self.pending: set[int] = set()  # counters seen at or above floor
        self.published = 0
        self.reward_sum = 0.0
        self.overflow = False


class WorkLedger:
    """Counters and rewards heard per producer (see the module docstring)."""

    def __init__(
        self, rule: GapRule | None = None, max_producers: int = 100_000, max_pending: int = 65_536
    ) -> None:
        self.rule = rule if rule is not None else GapRule()
        self.max_producers = max_producers
        self.max_pending = max_pending
        self._producers: OrderedDict[bytes, _Producer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def add(self, producer: bytes, counter: int, reward: float) -> bool:
        """Count one published rollout; False when this counter was counted before."""
        p = self._producers.get(producer)
        if p is None:
            p = self._producers[producer] = _Producer(counter)
            if len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(producer)
        if counter < p.first:
            # Heard late (gossip reorders): the range grows downwards; the counters
            # between are gaps until they arrive. Re-base the dense floor.
            p.pending.update(range(p.first, p.floor))
            p.first = p.floor = counter
        elif counter < p.floor or counter in p.pending:
            return False
        p.pending.add(counter)
        while p.floor in p.pending:
            p.pending.discard(p.floor)
            p.floor += 1
        p.last = max(p.last, counter)
        p.published += 1
        p.reward_sum += float(reward)
        if len(p.pending) > self.max_pending:
            p.overflow = True
            p.pending.clear()
        return True

    def standing(self, producer: bytes) -> Standing | None:
        p = self._producers.get(producer)
        if p is None:
            return None
        produced = p.last - p.first + 1
        withheld = produced - p.published
        # Judged only below `last - lag`: missing counters there (the pending set holds
        # what was seen above the dense floor).
        horizon = p.last - self.rule.lag
        judged_missing = 0
        if horizon > p.floor:
            seen_below = sum(1 for c in p.pending if c < horizon)
            judged_missing = (horizon - p.floor) - seen_below
        judged = max(0, horizon - p.first)
        allowed = not p.overflow and judged_missing <= self.rule.limit(judged)
        return Standing(p.first, p.last, p.published, withheld, p.reward_sum, allowed)

    def allowed(self, producer: bytes) -> bool:
        s = self.standing(producer)
        return s is None or s.allowed

    def counted_reward(self, producer: bytes) -> float | None:
        """Mean reward over the producer's produced work, withheld counters scoring 0;
        0.0 for a producer past its allowance (its rollouts are refused)."""
        s = self.standing(producer)
        if s is None:
            return None
        if not s.allowed:
            return 0.0
        return s.reward_sum / s.produced
