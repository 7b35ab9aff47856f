"""Work accounting: dense assignment counters, and what a gap in them costs.

Tasks are assigned from (run seed, producer, counter), so the counter is
what keeps a worker from choosing its tasks: a worker that generates counters 0..511 and
publishes only the ones it solved ("counter shopping") would look like a perfect solver.
The rule here: a producer's counters are dense. Every counter between the lowest and the
highest one we have seen from a producer is *produced*; one we never saw, once it is more
than `GapRule.lag` counters below the highest (messages still in flight, reordered or
being caught up are not counted yet), is *withheld*. Withheld work counts as produced
with reward 0, and past a small allowance (in-flight rollouts, a lost message) the
producer's rollouts are refused and it is scored down. A shopper that stays within the allowance gains at most the allowance's share.

Judged late, not early: a gap is judged only once the range it lies in has been known for
`GapRule.grace_s` (time passed in). A peer that (re)joins hears a worker's live counters
first and the older ones from catch-up seconds later; judging the gap in between at once
charged honest workers. Per producer a few snapshots of (time, first, last) remember what
the range was `grace_s` ago (at most one per `grace_s / 16`); only that range is judged.
`now=math.inf` (the default of the queries) judges everything heard: the final account.

Pure and bounded: no IO, no clocks; at most `max_producers` producers (least recently
heard forgotten first) and at most `max_pending` out-of-order counters per producer (a
producer past that is refused: nobody honest leaves that many holes).

Public API
----------
`GapRule(allowance=16, allowance_fraction=0.02, lag=64, grace_s=30.0)`
`WorkLedger(rule=GapRule(), max_producers=100_000, max_pending=65_536)`
    `.add(producer, counter, reward, now=0.0) -> bool`  a published rollout (each counter once)
    `.standing(producer, now=inf) -> Standing`      produced, published, withheld, rewards
    `.allowed(producer, now=inf) -> bool`           withheld within the allowance
    `.counted_reward(producer, now=inf) -> float | None`  mean reward over *produced* work
                                                 (withheld counts 0); None if unknown
`Standing(first, last, published, withheld, reward_sum, allowed)`; `.produced`, `.weight`
(the share of produced work the producer showed).
`GapCharges(ledger=None, sweep_every_s=1.0, max_suspects=4096, max_charged=100_000)`
    when to charge a producer for its gaps: `.on_rollout(producer, counter, reward, now)`
    and `.on_time(now)` return the producers that just went past their allowance (charge
    each once per offence, `WITHHELD_PENALTY`). Gaps are judged a grace after they open, so that can happen
    between two of a producer's rollouts or after its last: producers with open gaps
    ("suspects") are judged again at most every `sweep_every_s`, on any event, so one
    that publishes its solved counters and falls silent is charged all the same.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from protocol import penalties

__all__ = ["WITHHELD_PENALTY", "GapCharges", "GapRule", "Standing", "WorkLedger"]

# Score change each time a producer's withheld counters pass its allowance.
WITHHELD_PENALTY = penalties.WITHHELD.cost


@dataclass(frozen=True, slots=True)
class GapRule:
    """How many withheld counters a producer may have: `allowance` plus a fraction of its
    produced work (honest losses grow with volume)."""

    allowance: int = 16
    allowance_fraction: float = 0.02
    lag: int = 64  # the newest counters are not judged yet (still in flight)
    grace_s: float = 30.0  # a range is judged once known this long (catch-up fills it first)

    def __post_init__(self) -> None:
        if self.allowance < 0 or not 0.0 <= self.allowance_fraction < 1.0 or self.lag < 0:
            raise ValueError("GapRule: allowance >= 0, 0 <= allowance_fraction < 1, lag >= 0")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError("GapRule: grace_s must be a finite number >= 0")

    def limit(self, produced: int) -> float:
        """The number of withheld counters allowed after `produced` counters."""
        return self.allowance + self.allowance_fraction * produced


@dataclass(frozen=True, slots=True)
class Standing:
    """A producer's work record: counters first..last, how many were published or withheld, their
    reward sum, and whether it is still allowed."""

    first: int
    last: int
    published: int
    withheld: int
    reward_sum: float
    allowed: bool

    @property
    def produced(self) -> int:
        """Counters from the first to the last seen, inclusive."""
        return self.last - self.first + 1

    @property
    def weight(self) -> float:
        """The published share of the produced counters (0 when none)."""
        return self.published / self.produced if self.produced else 0.0


class _Producer:
    __slots__ = (
        "first",
        "floor",
        "last",
        "pending",
        "published",
        "reward_sum",
        "overflow",
        "snaps",
    )

    def __init__(self, counter: int) -> None:
        self.first = self.floor = self.last = counter
        self.pending: set[int] = set()  # counters seen at or above floor
        self.published = 0
        self.reward_sum = 0.0
        self.overflow = False
        self.snaps: deque[tuple[float, int, int]] = deque()  # (time, first, last), oldest first

    def snapshot(self, now: float, grace_s: float) -> None:
        """Remember the range at `now`: one snapshot per `grace_s / 16` (the newest of
        a slot wins; its time is when it held), none older than needed."""
        slot = grace_s / 16
        if self.snaps and slot > 0 and now // slot == self.snaps[-1][0] // slot:
            self.snaps[-1] = (now, self.first, self.last)
        else:
            self.snaps.append((now, self.first, self.last))
        while len(self.snaps) >= 2 and self.snaps[1][0] <= now - grace_s:
            self.snaps.popleft()

    def judged_range(self, now: float, grace_s: float) -> tuple[int, int] | None:
        """(first, last) as it was `grace_s` before `now`; None if not known that long."""
        if now == math.inf:
            return self.first, self.last
        held = None
        for t, first, last in self.snaps:
            if t > now - grace_s:
                break
            held = (first, last)
        return held


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

    def add(self, producer: bytes, counter: int, reward: float, now: float = 0.0) -> bool:
        """Count one published rollout heard at `now`; False when counted before."""
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
        p.snapshot(now, self.rule.grace_s)
        return True

    def standing(self, producer: bytes, now: float = math.inf) -> Standing | None:
        """`producer`'s record as judged at `now` (None if never seen)."""
        p = self._producers.get(producer)
        if p is None:
            return None
        produced = p.last - p.first + 1
        withheld = produced - p.published
        allowed = not p.overflow
        judged_range = p.judged_range(now, self.rule.grace_s)
        if allowed and judged_range is not None:
            # Judged: the range known `grace_s` ago, below its `last - lag`; missing
            # counters there (below the dense floor all were seen; the pending set holds
            # what was seen above it).
            first, last = judged_range
            horizon, start = last - self.rule.lag, max(first, p.floor)
            judged_missing = 0
            if horizon > start:
                seen = sum(1 for c in p.pending if start <= c < horizon)
                judged_missing = (horizon - start) - seen
            allowed = judged_missing <= self.rule.limit(max(0, horizon - first))
        return Standing(p.first, p.last, p.published, withheld, p.reward_sum, allowed)

    def allowed(self, producer: bytes, now: float = math.inf) -> bool:
        """Whether `producer` may still be trained on (an unknown producer is)."""
        s = self.standing(producer, now)
        return s is None or s.allowed

    def counted_reward(self, producer: bytes, now: float = math.inf) -> float | None:
        """Mean reward over the producer's produced work, withheld counters scoring 0;
        0.0 for a producer past its allowance (its rollouts are refused)."""
        s = self.standing(producer, now)
        if s is None:
            return None
        if not s.allowed:
            return 0.0
        return s.reward_sum / s.produced


class GapCharges:
    """Who to charge for withheld counters, and when (see the module docstring)."""

    def __init__(
        self,
        ledger: WorkLedger | None = None,
        *,
        sweep_every_s: float = 1.0,
        max_suspects: int = 4096,
        max_charged: int = 100_000,
    ) -> None:
        self.ledger = ledger if ledger is not None else WorkLedger()
        self.sweep_every_s, self.max_suspects, self.max_charged = (
            sweep_every_s,
            max_suspects,
            max_charged,
        )
        self.charged: set[bytes] = set()  # producers charged for their current gaps
        self.suspects: OrderedDict[bytes, None] = OrderedDict()  # gaps at their last rollout
        self.swept_at = -math.inf

    def on_rollout(self, producer: bytes, counter: int, reward: float, now: float) -> list[bytes]:
        """A published rollout heard at `now`; the producers to charge now."""
        self.ledger.add(producer, counter, reward, now)
        return self._judge(producer, now) + self.on_time(now)

    def on_time(self, now: float) -> list[bytes]:
        """Time passed (any event will do): suspects judged again, at most every
        `sweep_every_s`; the producers to charge now."""
        if now - self.swept_at < self.sweep_every_s:
            return []
        self.swept_at = now
        out: list[bytes] = []
        for producer in list(self.suspects):
            out += self._judge(producer, now)
        return out

    def _judge(self, producer: bytes, now: float) -> list[bytes]:
        standing = self.ledger.standing(producer, now)
        if standing is None or standing.allowed:
            self.charged.discard(producer)
            if standing is None or not standing.withheld:
                self.suspects.pop(producer, None)
            elif len(self.suspects) < self.max_suspects:
                self.suspects[producer] = None
            return []
        self.suspects.pop(producer, None)  # charged now; a new rollout brings it back
        if producer not in self.charged and len(self.charged) < self.max_charged:
            self.charged.add(producer)
            return [producer]
        return []
