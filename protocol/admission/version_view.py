"""Our view of the policy versions: the current one, when each newer one became ours, and
the newest weight announcement admitted. Pure; time passed in.
"""

from __future__ import annotations

from collections import deque

from protocol.errors import LocalProtocolError

__all__ = ["VersionView"]


class VersionView:
    """The current policy version `version` (from `VersionChanged`), the times versions
    reached while running became ours (to tell who pays for a stale rollout), and
    `weights_version`, the highest weight announcement admitted (-1: none)."""

    def __init__(self, version: int) -> None:
        self.version = int(version)
        # (version, when it became ours) for versions reached while running, ascending
        self._times: deque[tuple[int, float]] = deque(maxlen=256)
        self._start_version = self.version
        self.weights_version = -1

    def change(self, version: int, now: float) -> None:
        """Our policy version is now `version`."""
        if version < 0:
            raise LocalProtocolError("policy version must be >= 0")
        if version > self.version:
            self._times.append((int(version), now))
        self.version = int(version)

    def stale_by_fault(
        self, version: int, timestamp_ms: int, max_staleness: int, grace_s: float
    ) -> bool:
        """Whether a rollout of `version` was signed a grace after the first version that
        made it stale (`version + max_staleness + 1`) became ours. Versions we held when
        we started count as known forever."""
        first_stale = version + max_staleness + 1
        if first_stale <= self._start_version:
            return True
        for v, at in self._times:
            if v >= first_stale:
                return timestamp_ms / 1000.0 > at + grace_s
        return True

    def note_weights(self, version: int) -> None:
        """A gossiped weight announcement of `version` was admitted."""
        self.weights_version = max(self.weights_version, version)

    def weights_are_new(self, version: int) -> bool:
        """Whether announced weights of `version` are newer than all we know of."""
        return not version <= max(self.weights_version, self.version)
