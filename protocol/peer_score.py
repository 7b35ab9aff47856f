"""Peer scoring: a score per peer that decays toward zero, and bans below a threshold.

What this module owns: the arithmetic of scores (penalties, rewards, exponential decay
with a half-life), the rule that a peer whose score falls below `ban_threshold` is banned,
and how long (doubling with each offence, capped). What it never touches: sockets, clocks,
threads, storage, libp2p types. The caller passes `now` (seconds; the node passes
`time.time()` so that bans keep their meaning across a restart, the simulator its virtual
time) and turns the returned changes into disconnects, bans and database writes.

Peers are opaque hashable ids (`bytes` or `str`); nothing here looks inside them.

Public API
----------
`ScoreConfig(ban_threshold=-100.0, half_life_s=600.0, max_score=100.0,
ban_base_s=3600.0, ban_max_s=7 * 86400.0, max_peers=100_000)`
    Frozen settings, validated when built (ValueError on nonsense).

`PeerScores(config=ScoreConfig(), records=())`
    The table. `records` is an iterable of `PeerRecord` (from `snapshot()`, or read back
    from storage after a restart) to start from.

    `score(peer, now) -> float`            decayed score (0.0 for an unknown peer)
    `adjust(peer, delta, now) -> ScoreChange`  add `delta` (negative = penalty); when the
                                           score ends below `ban_threshold` and the peer
                                           is not already banned it is banned, and the
                                           change says until when (`ScoreChange.banned_until`)
    `penalize(peer, penalty, now)`         `adjust(peer, -penalty, now)`, penalty >= 0
    `reward(peer, amount, now)`            `adjust(peer, +amount, now)`, amount >= 0
    `ban(peer, now, duration_s=None) -> float`  ban now (operator or protocol decision);
                                           returns the end time
    `unban(peer)`                          lift a ban at once
    `is_banned(peer, now) -> bool`
    `banned_until(peer, now) -> float | None`
    `expire(now) -> list[peer]`            lift bans whose time has come; returns those peers
    `record(peer, now) -> PeerRecord | None`   the persistent state of one peer
    `snapshot(now) -> list[PeerRecord]`    every tracked peer, for storage
    `len(scores)`                          tracked peers (bounded by `max_peers`)

`PeerRecord(peer, score, updated_at, banned_until, offences)` is what storage keeps;
`banned_until` is 0.0 when the peer is not banned.

Rules
-----
- Decay: a score s written at time t0 reads s * 2 ** (-(now - t0) / half_life_s) at
  `now`; a clock that goes backwards reads as no time passing.
- Scores are capped at `max_score`, so good behaviour cannot bank unlimited credit, and
  floored at `2 * ban_threshold` so a single enormous penalty does not keep a peer out
  for days after its ban ends.
- A ban lasts `ban_base_s * 2 ** (offences - 1)` capped at `ban_max_s`, where `offences`
  counts bans of that peer (it is kept after the ban ends, so repeat offenders stay out
  longer). When a ban starts the score is set to `ban_threshold`, so the peer comes back
  near zero after a ban of a few half-lives.
- Memory is bounded: past `max_peers` the least recently touched peer that is not banned
  is forgotten (it comes back as a fresh peer with score 0).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

PeerId = bytes | str

__all__ = ["PeerId", "PeerRecord", "PeerScores", "ScoreChange", "ScoreConfig"]


@dataclass(frozen=True, slots=True)
class ScoreConfig:
    """Settings of peer scoring (see the module docstring for the rules)."""

    ban_threshold: float = -100.0
    half_life_s: float = 600.0
    max_score: float = 100.0
    ban_base_s: float = 3600.0
    ban_max_s: float = 7 * 86400.0
    max_peers: int = 100_000

    def __post_init__(self) -> None:
        for name in ("ban_threshold", "half_life_s", "max_score", "ban_base_s", "ban_max_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"ScoreConfig.{name} must be finite")
        if self.ban_threshold >= 0:
            raise ValueError("ScoreConfig.ban_threshold must be negative")
        if self.half_life_s <= 0:
            raise ValueError("ScoreConfig.half_life_s must be positive")
        if self.max_score < 0:
            raise ValueError("ScoreConfig.max_score must be >= 0")
        if not 0 < self.ban_base_s <= self.ban_max_s:
            raise ValueError("ScoreConfig needs 0 < ban_base_s <= ban_max_s")
        if self.max_peers < 1:
            raise ValueError("ScoreConfig.max_peers must be >= 1")

    @property
    def min_score(self) -> float:
        """The floor of a score (twice the ban threshold)."""
        return 2.0 * self.ban_threshold

    def ban_duration(self, offences: int) -> float:
        """Length of the `offences`-th ban (1-based): doubling, capped at `ban_max_s`."""
        if offences < 1:
            raise ValueError("offences counts from 1")
        # 2 ** 64 already exceeds any sane cap; avoid float overflow for huge counts.
        return min(self.ban_max_s, self.ban_base_s * 2.0 ** min(offences - 1, 64))


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """The persistent state of one peer; `banned_until` is 0.0 when not banned."""

    peer: PeerId
    score: float
    updated_at: float
    banned_until: float
    offences: int


@dataclass(frozen=True, slots=True)
class ScoreChange:
    """Result of one adjustment.

    `banned_until` is set only when this very change started a ban: the caller should
    then disconnect the peer and persist the ban.
    """

    peer: PeerId
    delta: float
    score: float
    banned_until: float | None = None


class _State:
    __slots__ = ("banned_until", "offences", "score", "updated_at")

    def __init__(self, score: float, updated_at: float, banned_until: float, offences: int):
        self.score = score
        self.updated_at = updated_at
        self.banned_until = banned_until
        self.offences = offences


def _check_time(now: float) -> None:
    if not math.isfinite(now):
        raise ValueError("now must be a finite number of seconds")


class PeerScores:
    """Scores and bans of many peers (see the module docstring)."""

    def __init__(self, config: ScoreConfig | None = None, records: Iterable[PeerRecord] = ()):
        self.config = config if config is not None else ScoreConfig()
        self._peers: OrderedDict[PeerId, _State] = OrderedDict()
        self._ban_heap: list[tuple[float, int, PeerId]] = []  # (until, tiebreak, peer), lazy
        self._tiebreak = 0
        for rec in records:
            _check_time(rec.updated_at)
            score = min(self.config.max_score, max(self.config.min_score, float(rec.score)))
            if not math.isfinite(score):
                score = 0.0
            st = _State(score, rec.updated_at, float(rec.banned_until), max(0, int(rec.offences)))
            self._peers[rec.peer] = st
            if st.banned_until > 0:
                self._push_ban(rec.peer, st.banned_until)
            self._evict_if_full(None)

    def __len__(self) -> int:
        return len(self._peers)

    # -- reading -----------------------------------------------------------------

    def _decayed(self, st: _State, now: float) -> float:
        dt = now - st.updated_at
        if dt <= 0 or st.score == 0.0:
            return st.score
        return st.score * 0.5 ** (dt / self.config.half_life_s)

    def score(self, peer: PeerId, now: float) -> float:
        """The decayed score of `peer` at `now` (0.0 for a peer never seen)."""
        _check_time(now)
        st = self._peers.get(peer)
        return 0.0 if st is None else self._decayed(st, now)

    def is_banned(self, peer: PeerId, now: float) -> bool:
        """Whether `peer` is banned at `now`."""
        _check_time(now)
        st = self._peers.get(peer)
        return st is not None and st.banned_until > now

    def banned_until(self, peer: PeerId, now: float) -> float | None:
        """End of the peer's current ban, or None when it is not banned at `now`."""
        _check_time(now)
        st = self._peers.get(peer)
        if st is None or st.banned_until <= now:
            return None
        return st.banned_until

    def record(self, peer: PeerId, now: float) -> PeerRecord | None:
        """`peer`'s record at `now` (score decayed to it), or None if unknown."""
        _check_time(now)
        st = self._peers.get(peer)
        if st is None:
            return None
        return PeerRecord(peer, self._decayed(st, now), now, st.banned_until, st.offences)

    def snapshot(self, now: float) -> list[PeerRecord]:
        """Every known peer's record at `now`."""
        _check_time(now)
        return [
            PeerRecord(p, self._decayed(st, now), now, st.banned_until, st.offences)
            for p, st in self._peers.items()
        ]

    # -- changing ----------------------------------------------------------------

    def _touch(self, peer: PeerId, now: float) -> _State:
        st = self._peers.get(peer)
        if st is None:
            st = _State(0.0, now, 0.0, 0)
            self._peers[peer] = st
            self._evict_if_full(now, keep=peer)
        else:
            st.score = self._decayed(st, now)
            st.updated_at = max(st.updated_at, now)
            self._peers.move_to_end(peer)
        return st

    def adjust(self, peer: PeerId, delta: float, now: float) -> ScoreChange:
        """Add `delta` to the peer's score; ban it if the score ends below the threshold."""
        _check_time(now)
        if not math.isfinite(delta):
            raise ValueError("score delta must be finite")
        cfg = self.config
        st = self._touch(peer, now)
        st.score = min(cfg.max_score, max(cfg.min_score, st.score + delta))
        if st.score < cfg.ban_threshold and st.banned_until <= now:
            until = self._start_ban(peer, st, now, None)
            return ScoreChange(peer, delta, st.score, until)
        return ScoreChange(peer, delta, st.score, None)

    def penalize(self, peer: PeerId, penalty: float, now: float) -> ScoreChange:
        """Lower `peer`'s score by `penalty` (>= 0)."""
        if penalty < 0:
            raise ValueError("penalty must be >= 0")
        return self.adjust(peer, -penalty, now)

    def reward(self, peer: PeerId, amount: float, now: float) -> ScoreChange:
        """Raise `peer`'s score by `amount` (>= 0)."""
        if amount < 0:
            raise ValueError("reward must be >= 0")
        return self.adjust(peer, amount, now)

    def ban(self, peer: PeerId, now: float, duration_s: float | None = None) -> float:
        """Ban `peer` from `now` (an offence like any other); returns the end time."""
        _check_time(now)
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError("ban duration must be a positive number of seconds")
        st = self._touch(peer, now)
        return self._start_ban(peer, st, now, duration_s)

    def unban(self, peer: PeerId) -> None:
        """Lift `peer`'s ban, if any."""
        st = self._peers.get(peer)
        if st is not None:
            st.banned_until = 0.0

    def expire(self, now: float) -> list[PeerId]:
        """Lift every ban that ended by `now`; returns the peers, oldest ban first."""
        _check_time(now)
        lifted: list[PeerId] = []
        while self._ban_heap and self._ban_heap[0][0] <= now:
            until, _, peer = heapq.heappop(self._ban_heap)
            st = self._peers.get(peer)
            # Lazy deletion: skip entries of bans since lifted, extended or forgotten.
            if st is not None and st.banned_until == until:
                st.banned_until = 0.0
                lifted.append(peer)
        return lifted

    # -- internals ---------------------------------------------------------------

    def _start_ban(self, peer: PeerId, st: _State, now: float, duration: float | None) -> float:
        st.offences += 1
        if duration is None:
            duration = self.config.ban_duration(st.offences)
        until = max(st.banned_until, now + duration)
        st.banned_until = until
        st.score = min(st.score, self.config.ban_threshold)
        self._push_ban(peer, until)
        return until

    def _push_ban(self, peer: PeerId, until: float) -> None:
        self._tiebreak += 1
        heapq.heappush(self._ban_heap, (until, self._tiebreak, peer))
        # The heap keeps stale entries until they surface; rebuild when it grows
        # well past the number of live bans so it stays bounded.
        if len(self._ban_heap) > 2 * len(self._peers) + 64:
            self._ban_heap = [
                (s.banned_until, i, p)
                for i, (p, s) in enumerate(self._peers.items())
                if s.banned_until > 0
            ]
            heapq.heapify(self._ban_heap)
            self._tiebreak = len(self._peers)

    def _evict_if_full(self, now: float | None, keep: PeerId | None = None) -> None:
        limit = self.config.max_peers
        while len(self._peers) > limit:
            victim = None
            # Oldest-touched first; prefer one that is not banned (look at a few).
            for i, (p, st) in enumerate(self._peers.items()):
                if i >= 64:
                    break
                if p != keep and st.banned_until <= (st.updated_at if now is None else now):
                    victim = p
                    break
            if victim is None:
                victim = next(p for p in self._peers if p != keep)
            del self._peers[victim]
