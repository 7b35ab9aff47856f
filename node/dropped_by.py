"""Peers that keep closing this node's connections: the node's view of being refused.

A peer that banned us, or finds us over its limits, closes every connection we open; we
are not told why. `DroppedBy` counts the connections each remote peer closed within
`window_s`; from `threshold` closes in a window on, the peer is reported (in the node's
log once, in `status.json` under `dropped_by`, in metrics as `swarm_dropped_by_peers`)
with the count, the last reason the host saw, and the time the report lapses if the
closes stop. Peers we banned ourselves are not counted (we closed those).

Pure bookkeeping: no IO; bounded to `keep` peers (the oldest forgotten first).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

__all__ = ["DroppedBy"]


log = logging.getLogger("swarm.peer")


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

    def on_event(self, kind: str, peer: str, reason: str, now: float) -> None:
        """A host peer event: a remote close counts (logged once past the threshold); our
        own ban of the peer clears its record."""
        if kind == "banned":
            self.forget(peer)
        elif kind == "disconnected" and self.closed(peer, now, reason):  # ours are "dropped"
            log.warning(
                "peer %s keeps closing our connections (%d in %g s; last: %s): it may have "
                "banned us or find us over its limits", peer, self.threshold, self.window_s,
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

    def status(self, now: float) -> dict[str, dict[str, object]]:
        """Peers over the threshold now: closes in the window, last reason, and when the
        report lapses (unix time) if they stop."""
        out: dict[str, dict[str, object]] = {}
        for peer, c in list(self._peers.items()):
            self._expire(c, now)
            if not c.times:
                del self._peers[peer]
            elif len(c.times) >= self.threshold:
                lapses = c.times[len(c.times) - self.threshold] + self.window_s
                out[peer] = {"closes": len(c.times), "reason": c.reason, "until": round(lapses, 1)}
        return out
