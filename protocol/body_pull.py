"""The body-pull schedule: whom to ask for the body of an admitted header, when to ask
again, when to give up, and whom a missing body costs.

Pure (no IO, no clock): the node (`node.peer.body_puller`) and the simulator
(`swarm_sim.swarm`) feed it events with the current time and carry out its actions.

    Want(rollout_id, sources, now, origin)   a header was admitted; its body is wanted
    Due(now, connected, known)               -> Fetch(source, ids) for the pulls due now
    Answered(rollout_id, source, outcome, now)  what came of one id of a Fetch
    Forget(rollout_id)                        we hold the body another way (catch-up)

Actions: `Fetch` (ask `source` for these ids, at most `PullConfig.batch` per request),
`Charge` (a source answered in a way only a faulty or lying peer does: the node scores it
down), `GiveUp` (no source served the body: carry it to admission as `BodyMissing`, which
charges the signer and sender only when some source answered), `Done` (the body is held).

Sources are tried in order: the producer (an honest producer stores a record before it
gossips the header), then the peer that forwarded the header, then, after `widen_after`
attempts or when no source is connected, up to `widen_to` other connected peers (relays,
trainers and validators hold every body they pulled). A pull whose every source is away
waits for one to come back (`park_s`, at most `max_parks` times) without spending an
attempt, so a pull outlives its source's restart; one whose sources nobody knows how to
reach spends attempts at once. A pull ends after `attempts` answers or failures, or
`window_s` after it began, whichever comes first; per producer at most `per_producer`
pulls are pending, so a flood of headers from one key costs a bounded number of tries.

Blame. Only the producer promised the body (it signed the header after storing the
record), so only the producer's own answers count as evidence for `GiveUp.answered`: an
empty "not held" reply, a bad body, another rollout than asked, and silence on an open
stream past the deadline (`SILENT`). A forwarder or any other peer that lacks the body is
not at fault (most peers do not pull bodies). A source that could not be reached
(`UNREACHABLE`) and our own store failing (`LOCAL_FAILURE`) are no evidence against
anyone; a producer that was never reached pays nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Collection, Container, Hashable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from protocol import penalties
from protocol.errors import LocalProtocolError

__all__ = [
    "Answered",
    "Charge",
    "Done",
    "Due",
    "Fetch",
    "Forget",
    "GiveUp",
    "Outcome",
    "PullConfig",
    "PullSchedule",
    "Want",
]

Source = Hashable


class Outcome(StrEnum):
    """How one attempt to pull a body ended (what it says about the source)."""

    SERVED = "served"  # the body arrived and was admitted (or was a duplicate)
    EMPTY = "empty"  # the source answered that it does not hold the body
    BAD_BODY = "bad_body"  # a body that admission refused (the source paid there)
    WRONG_RECORD = "wrong_record"  # another rollout than the one asked for
    SILENT = "silent"  # an open stream, no answer before the deadline
    UNREACHABLE = "unreachable"  # could not connect or open a stream: no evidence
    LOCAL_FAILURE = "local_failure"  # our own store failed: no evidence
    HELD = "held"  # we already hold the body


_ANSWERS = frozenset({Outcome.EMPTY, Outcome.BAD_BODY, Outcome.WRONG_RECORD, Outcome.SILENT})

# Offences found by the schedule itself: names in `protocol.penalties`, which prices them.
PRODUCER_LACKS_BODY = penalties.PRODUCER_LACKS_BODY.name
WRONG_RECORD = penalties.WRONG_RECORD.name


@dataclass(frozen=True, slots=True)
class PullConfig:
    """Limits and timing of body pulls."""

    attempts: int = 8  # answers or failures before a pull gives up
    retry_s: float = 1.0  # first retry delay; doubles per attempt ...
    retry_max_s: float = 8.0  # ... up to this
    widen_after: int = 2  # attempts after which other connected peers become sources
    widen_to: int = 3  # ... this many of them
    park_s: float = 1.0  # a pull whose every source is away looks again this often ...
    max_parks: int = 300  # ... at most this many times (not attempts)
    max_pending: int = 8192  # pulls held at once
    per_producer: int = 512  # pulls pending at once for one producer
    window_s: float = 300.0  # a pull ends this long after it began (and its header is forgotten)
    batch: int = 32  # ids per request
    max_in_flight: int = 96  # ids being fetched at once

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.batch < 1 or self.max_in_flight < 1 or self.per_producer < 1:
            raise LocalProtocolError("attempts, batch, max_in_flight, per_producer are >= 1")
        if min(self.retry_s, self.park_s, self.window_s) <= 0:
            raise LocalProtocolError("retry_s, park_s and window_s are > 0")


@dataclass(frozen=True, slots=True)
class Want:
    """A header was admitted: pull its body from `sources` (producer first)."""

    rollout_id: Hashable
    sources: tuple[Source, ...]
    now: float
    origin: tuple[Hashable, Source] | None = None  # (signer, sender) of the header, to blame


@dataclass(frozen=True, slots=True)
class Due:
    """Time passed: which pulls go out now. `connected`: peers with a live connection;
    `known`: peers we hold an address for (a pull may wait for those to come back)."""

    now: float
    connected: Collection[Source]
    known: Container[Source] = frozenset()


@dataclass(frozen=True, slots=True)
class Answered:
    """An attempt at `source` for `rollout_id` ended with `outcome`."""

    rollout_id: Hashable
    source: Source
    outcome: Outcome
    now: float


@dataclass(frozen=True, slots=True)
class Forget:
    """The body is held (it came another way): stop pulling it."""

    rollout_id: Hashable


@dataclass(frozen=True, slots=True)
class Fetch:
    """Ask `source` for the bodies of `ids` (action)."""

    source: Source
    ids: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class Charge:
    """`peer` answered as only a faulty or lying peer does; `offence` names its line in
    `protocol.penalties` (the cost)."""

    peer: Source
    offence: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No source served the body: admission's `BodyMissing(rollout_id, signer, sender,
    now, answered)` judges it (nobody pays when `answered` is 0)."""

    rollout_id: Hashable
    origin: tuple[Hashable, Source] | None
    answered: int
    now: float


@dataclass(frozen=True, slots=True)
class Done:
    """The pull of `rollout_id` ended (its body came, or it gave up)."""

    rollout_id: Hashable


Event = Want | Due | Answered | Forget
Action = Fetch | Charge | GiveUp | Done


@dataclass(slots=True)
class _Pull:
    rollout_id: Hashable
    sources: list[Source]
    started: float
    origin: tuple[Hashable, Source] | None
    producer: Source | None
    due: float
    attempts: int = 0
    answered: int = 0
    parked: int = 0
    widened: bool = False
    asked: Source | None = None  # the source of the fetch in flight (None: waiting)


@dataclass
class PullStats:
    """Counters of what the schedule did, for status and benches."""

    wanted: int = 0
    refused_full: int = 0  # not taken: too many pending (in all or for the producer)
    fetched: int = 0
    served: int = 0
    parked: int = 0
    gave_up: int = 0
    expired: int = 0  # ended by the window, not by attempts


@dataclass
class PullSchedule:
    """Every body pull of one peer (see the module docstring)."""

    config: PullConfig = field(default_factory=PullConfig)
    stats: PullStats = field(default_factory=PullStats)

    def __post_init__(self) -> None:
        self._pulls: dict[Hashable, _Pull] = {}
        self._per_producer: dict[Source, int] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._tie = itertools.count()
        self._in_flight = 0

    # -- queries ----------------------------------------------------------------------

    def __contains__(self, rollout_id: Hashable) -> bool:
        return rollout_id in self._pulls

    def __len__(self) -> int:
        return len(self._pulls)

    def in_flight(self) -> int:
        """Fetches sent and not yet answered."""
        return self._in_flight

    def sources(self, rollout_id: Hashable) -> tuple[Source, ...]:
        """The sources the pull of `rollout_id` may ask now (empty if it is not pending)."""
        p = self._pulls.get(rollout_id)
        return () if p is None else tuple(p.sources)

    def next_due(self) -> float | None:
        """The earliest time a waiting pull becomes due (None: nothing waits)."""
        while self._heap:
            due, _, rid = self._heap[0]
            p = self._pulls.get(rid)
            if p is not None and p.asked is None and p.due == due:
                return due
            heapq.heappop(self._heap)
        return None

    # -- events -----------------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; returns the actions to carry out, in order."""
        if isinstance(event, Want):
            return self._on_want(event)
        if isinstance(event, Due):
            return self._on_due(event)
        if isinstance(event, Answered):
            return self._on_answered(event)
        if isinstance(event, Forget):
            return self._end(event.rollout_id, [])
        raise LocalProtocolError(f"not a body-pull event: {type(event).__name__}")

    def _on_want(self, ev: Want) -> list[Action]:
        if ev.rollout_id in self._pulls:
            return []
        cfg = self.config
        producer = ev.sources[0] if ev.sources else None
        if len(self._pulls) >= cfg.max_pending or (
            producer is not None and self._per_producer.get(producer, 0) >= cfg.per_producer
        ):
            self.stats.refused_full += 1
            return []
        p = _Pull(
            ev.rollout_id, list(dict.fromkeys(ev.sources)), ev.now, ev.origin, producer, ev.now
        )
        self._pulls[ev.rollout_id] = p
        if producer is not None:
            self._per_producer[producer] = self._per_producer.get(producer, 0) + 1
        self._schedule(p)
        self.stats.wanted += 1
        return []

    def _on_due(self, ev: Due) -> list[Action]:
        cfg, out = self.config, []
        by_source: dict[Source, list[Hashable]] = {}
        while self._heap and self._heap[0][0] <= ev.now and self._in_flight < cfg.max_in_flight:
            due, _, rid = heapq.heappop(self._heap)
            p = self._pulls.get(rid)
            if p is None or p.asked is not None or p.due != due:
                continue  # ended, in flight, or rescheduled since
            if ev.now - p.started >= cfg.window_s:
                self.stats.expired += 1
                out += self._give_up(p, ev.now)
                continue
            source = self._source(p, ev)
            if source is None:
                if p.parked < cfg.max_parks and any(s in ev.known for s in p.sources):
                    p.parked += 1
                    self.stats.parked += 1
                    self._schedule(p, ev.now + cfg.park_s)
                else:
                    out += self._failed(p, answered=False, now=ev.now)
                continue
            p.asked = source
            self._in_flight += 1
            by_source.setdefault(source, []).append(rid)
        for source, ids in by_source.items():
            for i in range(0, len(ids), cfg.batch):
                chunk = tuple(ids[i : i + cfg.batch])
                self.stats.fetched += len(chunk)
                out.append(Fetch(source, chunk))
        return out

    def _on_answered(self, ev: Answered) -> list[Action]:
        p = self._pulls.get(ev.rollout_id)
        if p is None or p.asked != ev.source:
            return []  # ended meanwhile, or an answer to a fetch we no longer wait for
        p.asked = None
        self._in_flight -= 1
        if ev.outcome in (Outcome.SERVED, Outcome.HELD):
            if ev.outcome is Outcome.SERVED:
                self.stats.served += 1
            return self._end(p.rollout_id, [Done(p.rollout_id)])
        out: list[Action] = []
        if ev.outcome is Outcome.EMPTY and p.producer is not None and ev.source == p.producer:
            out.append(Charge(ev.source, PRODUCER_LACKS_BODY))
        elif ev.outcome is Outcome.WRONG_RECORD:
            out.append(Charge(ev.source, WRONG_RECORD))
        answered = ev.outcome in _ANSWERS and ev.source == p.producer
        return out + self._failed(p, answered=answered, now=ev.now)

    # -- rules ------------------------------------------------------------------------

    def _source(self, p: _Pull, ev: Due) -> Source | None:
        """The first connected source; widened to other connected peers once the
        announcers are away or after `widen_after` attempts."""
        source = next((s for s in p.sources if s in ev.connected), None)
        if p.widened or (source is not None and p.attempts < self.config.widen_after):
            return source
        p.widened = True
        # Deterministic pick (a hash of the id orders the candidates): replayable in tests
        # and spread over peers for different ids.
        others = sorted(
            (x for x in ev.connected if x not in p.sources),
            key=lambda x: _stable_hash(p.rollout_id, x),
        )
        p.sources += others[: self.config.widen_to]
        return (
            source
            if source is not None
            else next((s for s in p.sources if s in ev.connected), None)
        )

    def _failed(self, p: _Pull, *, answered: bool, now: float) -> list[Action]:
        cfg = self.config
        p.attempts += 1
        p.answered += int(answered)
        if p.attempts >= cfg.attempts or now - p.started >= cfg.window_s:
            return self._give_up(p, now)
        if p.sources:
            p.sources = p.sources[1:] + p.sources[:1]
        self._schedule(p, now + min(cfg.retry_max_s, cfg.retry_s * 2 ** (p.attempts - 1)))
        return []

    def _give_up(self, p: _Pull, now: float) -> list[Action]:
        self.stats.gave_up += 1
        return self._end(p.rollout_id, [GiveUp(p.rollout_id, p.origin, p.answered, now)])

    def _schedule(self, p: _Pull, at: float | None = None) -> None:
        if at is not None:
            p.due = at
        heapq.heappush(self._heap, (p.due, next(self._tie), p.rollout_id))

    def _end(self, rollout_id: Hashable, out: list[Action]) -> list[Action]:
        p = self._pulls.pop(rollout_id, None)
        if p is None:
            return []
        if p.asked is not None:
            self._in_flight -= 1
        if p.producer is not None:
            left = self._per_producer.get(p.producer, 1) - 1
            if left > 0:
                self._per_producer[p.producer] = left
            else:
                self._per_producer.pop(p.producer, None)
        return out


def _stable_hash(*parts: Hashable) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()


def answers_for(
    ids: Iterable[Hashable], source: Source, outcome: Outcome, now: float
) -> list[Answered]:
    """The same outcome for every id of a fetch (a failed request)."""
    return [Answered(rid, source, outcome, now) for rid in ids]
