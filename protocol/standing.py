"""A producer's standing: what its audits so far let its unaudited work do.

Validators audit a sample of the records (`protocol.audit_sample`), so most honest work
never gets a verdict of its own. Two rules decide what the rest of a producer's work is
worth, and both peers that care apply them to what they saw themselves:

The window statistic (`window_failed`). A producer's records are judged in windows of its
task counters (`protocol.producer_cases`); a window fails when at least `WINDOW_OVER` of
its records are over the limit (the largest statistic an honest record reached in
calibration), a record whose body never arrived counting as over (`MISSING`; at most
`WINDOW_OVER` - 1 of them, so missing bodies alone never fail a window). Not the
median: a worker that changes only a minority of each window keeps the median honest, but
not the count of records over the limit; and one withheld body per window does not keep
the window from being judged. A worker changing fewer than `WINDOW_OVER` records of every
window is caught by the sequential rule over all of its audited records
(`protocol.producer_cases.SequentialTest`), which bans like a failed window.

Standing (`StandingBook`), per producer key, from the audits heard about it:

    probation   fewer than `probation_passes` audits passed, none failed. Audited at
                `PROBATION_AUDIT_FRACTION` (every record: the validator pays for a fresh
                key's audits, so a Sybil splitting its work over many keys buys each key
                that many audits); credited at `PROBATION_CREDIT` (of a credit that, for a
                young key, is at most the swarm's mean: `protocol.credit`); only records with a pass
                verdict of their own train.
    good        passed its probation, no audit failed: its records train once the cheap
                checks the trainer runs itself passed (signature, counter density, task
                binding, re-scored reward) and they waited `hold_s` for an audit of them
                or of an earlier record to land; audited at the run's fraction.
    banned      an audit failed (a verdict, or a window over the limit): nothing of it
                trains from then on, its waiting records are dropped and its credit is 0
                (`Banned` says so once).

Spot-check economics: with audit fraction f, a producer in good standing that changes a
fraction c of its records is caught by the first audit of a changed record, after about
1 / (f c) records, and loses everything it had been credited (`PROBATION_CREDIT` of its
probation and all since) plus the key's probation. Cheating pays only if what it saves on
those 1 / (f c) records exceeds that: `g / (f c) > C`, g the gain per changed record and C
the credit at stake; docs/PROTOCOL.md gives the default numbers.

A validator holds the pass verdicts of a producer on probation (`HeldPasses`) until the
window of the record is judged: a slightly changed model whose records pass one by one
gets none of them trained before its windows are judged, however it splits or withholds.

Time is passed in; nothing here does I/O. The book is bounded (`max_producers`; a producer
forgotten starts again on probation, which costs it, never an honest peer).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from protocol.producer_cases import (
    MISSING,
    PRODUCER_WINDOW,
    WINDOW_OVER,
    window_failed,
    window_statistic,
)

__all__ = [
    "MISSING",
    "PROBATION_AUDIT_FRACTION",
    "PROBATION_CREDIT",
    "PROBATION_WINDOWS",
    "WINDOW_OVER",
    "Banned",
    "Decision",
    "HeldPasses",
    "State",
    "StandingBook",
    "cleared_passes",
    "window_failed",
    "window_statistic",
]

# Windows of audits a fresh key passes before its unaudited records train.
PROBATION_WINDOWS = 2
PROBATION_AUDIT_FRACTION = 1.0
PROBATION_CREDIT = 0.5
# How long a good-standing producer's unaudited record waits before it trains: long enough
# for a validator's audit of the record, or of an earlier one, to be heard.
HOLD_S = 20.0


class State(enum.StrEnum):
    """A producer's standing: on probation, good, or banned."""

    PROBATION = "probation"
    GOOD = "good"
    BANNED = "banned"


class Decision(enum.StrEnum):
    """What to do with a producer's rollout: train on it, wait, or drop it."""

    TRAIN = "train"
    WAIT = "wait"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class Banned:
    """`producer` just lost its standing: drop its waiting records, claw back its credit."""

    producer: bytes
    reason: str


@dataclass(slots=True)
class _Record:
    passed: int = 0
    banned: bool = False


class StandingBook:
    """Per producer key, the audits heard and the standing they give (module docstring)."""

    def __init__(
        self,
        probation_passes: int = PROBATION_WINDOWS * PRODUCER_WINDOW,
        *,
        hold_s: float = HOLD_S,
        max_producers: int = 65_536,
    ) -> None:
        if probation_passes < 0 or hold_s < 0 or max_producers < 1:
            raise ValueError("StandingBook: probation_passes, hold_s >= 0 and max_producers >= 1")
        self.probation_passes = probation_passes
        self.hold_s = hold_s
        self.max_producers = max_producers
        self._book: OrderedDict[bytes, _Record] = OrderedDict()

    def _get(self, producer: bytes) -> _Record:
        rec = self._book.pop(producer, None) or _Record()
        self._book[producer] = rec
        while len(self._book) > self.max_producers:
            self._book.popitem(last=False)
        return rec

    def audited(self, producer: bytes, passed: bool, reason: str = "failed audit") -> list[Banned]:
        """An audit of one of `producer`'s records (a verdict of a key that may judge, or
        our own); a failure bans it."""
        rec = self._get(producer)
        if passed:
            rec.passed += 1
            return []
        return self.ban(producer, reason)

    def ban(self, producer: bytes, reason: str) -> list[Banned]:
        """A failed audit or window: `Banned` the first time."""
        rec = self._get(producer)
        if rec.banned:
            return []
        rec.banned = True
        return [Banned(producer, reason)]

    def state(self, producer: bytes) -> State:
        """`producer`'s standing."""
        rec = self._book.get(producer)
        if rec is not None and rec.banned:
            return State.BANNED
        if (0 if rec is None else rec.passed) < self.probation_passes:
            return State.PROBATION
        return State.GOOD

    def count(self, state: State) -> int:
        """How many producers of the book are in `state` (probation: those heard of)."""
        return sum(self.state(p) is state for p in self._book)

    def audit_fraction(self, producer: bytes, base: float) -> float:
        """The share of `producer`'s records a validator audits: all of a key on probation
        (or banned: its records are evidence), `base` of one in good standing."""
        return base if self.state(producer) is State.GOOD else max(base, PROBATION_AUDIT_FRACTION)

    def credit_weight(self, producer: bytes) -> float:
        """What one unit of `producer`'s credited work counts: 0 banned, capped on probation."""
        return {State.BANNED: 0.0, State.PROBATION: PROBATION_CREDIT, State.GOOD: 1.0}[
            self.state(producer)
        ]

    def decide(
        self, producer: bytes, verified: bool | None, arrived_at: float, now: float
    ) -> Decision:
        """Whether a record of `producer` whose cheap checks passed trains now: `verified`
        is its own verdict (True passed, False failed, None none yet)."""
        state = self.state(producer)
        if state is State.BANNED or verified is False:
            return Decision.DROP
        if verified:
            return Decision.TRAIN
        if state is State.GOOD and now - arrived_at >= self.hold_s:
            return Decision.TRAIN
        return Decision.WAIT


class HeldPasses:
    """A validator's pass verdicts on records of producers on probation, held per
    (producer, window) until the window is judged: `cleared` hands them out to publish,
    `failed` drops every one of the producer's. At most `max_held` (oldest dropped)."""

    def __init__(self, max_held: int = 65_536) -> None:
        if max_held < 1:
            raise ValueError("HeldPasses: max_held must be >= 1")
        self.max_held = max_held
        self._held: OrderedDict[tuple[bytes, int], list[Any]] = OrderedDict()
        self._count = 0
        self.dropped = 0

    def __len__(self) -> int:
        return self._count

    def hold(self, producer: bytes, window: int, verdict: Any) -> None:
        """Hold a passing verdict about `producer`'s `window` until the window is judged."""
        self._held.setdefault((producer, window), []).append(verdict)
        self._count += 1
        while self._count > self.max_held:
            _key, old = self._held.popitem(last=False)
            self._count -= len(old)
            self.dropped += len(old)

    def cleared(self, producer: bytes, window: int) -> list[Any]:
        """The window passed: its held verdicts, released."""
        out = self._held.pop((producer, window), [])
        self._count -= len(out)
        return out

    def failed(self, producer: bytes) -> int:
        """The producer failed: drop its held verdicts; returns how many."""
        keys = [k for k in self._held if k[0] == producer]
        n = sum(len(self._held.pop(k)) for k in keys)
        self._count -= n
        return n


def cleared_passes(
    cleared: list[tuple[bytes, int]], held: HeldPasses, standing: StandingBook
) -> list[Any]:
    """The held pass verdicts of the windows judged clean (`cleared`: (producer, window)),
    each counted towards its producer's probation in `standing`: the verdicts to publish."""
    out = []
    for producer, window in cleared:
        for verdict in held.cleared(producer, window):
            standing.audited(producer, True)
            out.append(verdict)
    return out
