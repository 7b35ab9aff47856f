"""Peers that refuse this node: what they told us, and what we can see.

A peer that bans us, or refuses us at its connection cap, tells us so before it closes
(`node.host.goodbye`: a signed goodbye with the reason and until when); `DroppedBy.told`
records it at once (logged, in `status.json` under `dropped_by` with `"told": true`, in
metrics as `swarm_refused_by_peers`) until the time it gave (clamped to a week). What a
peer tells us is shown, never acted on. A peer that finds us over its other limits, or an
older node, closes our connections without a word: `DroppedBy` also counts the
connections each remote peer closed within `window_s`; from `threshold` closes in a
window on, the peer is reported (in the node's log once, in `status.json` under
`dropped_by`, in metrics as `swarm_dropped_by_peers`) with the count, the last reason the
host saw, and the time the report lapses if the closes stop. Peers we banned ourselves
are not counted (we closed those).

Pure bookkeeping: no IO; bounded to `keep` peers (the oldest forgotten first).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["DroppedBy"]


log = logging.getLogger("swarm.peer")

LOG_EVERY_S = 60.0


@dataclass
class _Told:
    reason: str
    until: float
    logged: float  # when we last logged what it said


@dataclass
class _Closes:
    times: deque[float] = field(default_factory=deque)
    reason: str = ""
    reported: bool = False


class DroppedBy:
    """Closes of our connections by each remote peer within a sliding window."""

    def __init__(self, window_s: float = 120.0, threshold: int = 3, keep: int = 256) -> None:
        self.window_s = window_s
        self.threshold = threshold
        self.keep = keep
        self._peers: dict[str, _Closes] = {}
        self._told: dict[str, _Told] = {}  # peer -> what it said, the latest last

    def closed(self, peer: str, now: float, reason: str = "") -> bool:
        """Record that `peer` closed a connection; True the first time it crosses the
        threshold within a window (the moment to log it)."""
        c = self._peers.pop(peer, None) or _Closes()
        self._peers[peer] = c  # most recent last
        c.times.append(now)
        c.reason = reason or c.reason
        self._expire(c, now)
        while len(self._peers) > self.keep:
            del self._peers[next(iter(self._peers))]
        if len(c.times) >= self.threshold and not c.reported:
            c.reported = True
            return True
        return False

    def told(self, peer: str, reason: str, until: float, now: float) -> None:
        """`peer` said it refuses us for `reason` until `until` (unix time): shown until
        then; logged when it is news (a new reason or a later end), at most once a
        `LOG_EVERY_S` per peer."""
        before = self._told.pop(peer, None)
        if until <= now:
            return
        news = before is None or before.reason != reason or until > before.until + LOG_EVERY_S
        log_it = news and (before is None or now - before.logged >= LOG_EVERY_S)
        self._told[peer] = _Told(reason, until, now if log_it else before.logged)  # type: ignore[union-attr]
        while len(self._told) > self.keep:
            del self._told[next(iter(self._told))]
        if log_it:
            log.warning(
                "peer %s refuses us: %s, until %s (%.0f s more; as it says)",
                peer,
                reason,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(until)),
                until - now,
            )

    def on_event(self, kind: str, peer: str, reason: str, now: float, until: float = 0.0) -> None:
        """A host peer event: a remote close counts (logged once past the threshold); a
        peer's goodbye is recorded; our own ban of the peer clears its record."""
        if kind == "told":
            self.told(peer, reason, until, now)
        elif kind == "banned":
            self.forget(peer)
        elif kind == "disconnected" and self.closed(peer, now, reason):  # ours are "dropped"
            log.warning(
                "peer %s keeps closing our connections (%d in %g s; last: %s): it may have "
                "banned us or find us over its limits",
                peer,
                self.threshold,
                self.window_s,
                reason or "-",
            )

    def forget(self, peer: str) -> None:
        """We closed it (we banned it): its closes are not refusals of us."""
        self._peers.pop(peer, None)

    def _expire(self, c: _Closes, now: float) -> None:
        while c.times and c.times[0] < now - self.window_s:
            c.times.popleft()
        if len(c.times) < self.threshold:
            c.reported = False

    def refused_by(self, now: float) -> dict[str, dict[str, object]]:
        """Peers that told us they refuse us, until a time still to come: reason, until."""
        for peer in [p for p, t in self._told.items() if t.until <= now]:
            del self._told[peer]
        return {p: {"reason": t.reason, "until": round(t.until, 1)} for p, t in self._told.items()}

    def status(self, now: float) -> dict[str, dict[str, object]]:
        """Peers refusing us now: those that told us (`told`: true; their reason, their
        end), and those over the threshold of closes (closes in the window, last reason,
        and when the report lapses (unix time) if they stop)."""
        out: dict[str, dict[str, object]] = {}
        told = self.refused_by(now)
        for peer, c in list(self._peers.items()):
            self._expire(c, now)
            if not c.times:
                del self._peers[peer]
            elif len(c.times) >= self.threshold:
                lapses = c.times[len(c.times) - self.threshold] + self.window_s
                out[peer] = {"closes": len(c.times), "reason": c.reason, "until": round(lapses, 1)}
        for peer, t in told.items():
            closes = len(self._peers[peer].times) if peer in self._peers else 0
            out[peer] = {"closes": closes, **t, "told": True}
        return out
