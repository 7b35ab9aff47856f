"""One writer's run of failed writes (a full or read-only disk): when to try again, and
which failures and recoveries are worth a log line.

A writer that fails retries after a pause that doubles with each failure in a row (from
`first_s` up to `max_s`), so a full disk costs a few attempts a minute, not a retry loop;
only the first failure of a run and the recovery that ends it are reported (`failed` and
`ok` say when), so a disk that stays full is one warning, not a flood. Pure: the caller
passes the time in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DiskTrouble:
    """See the module docstring."""

    first_s: float = 5.0
    max_s: float = 120.0
    failures: int = 0  # failures in a row
    retry_at: float = 0.0  # no write before this time (the caller's clock)

    def ready(self, now: float) -> bool:
        """Whether the writer may try now."""
        return now >= self.retry_at

    def failed(self, now: float) -> bool:
        """A write failed at `now`: pause; True for the first failure of a run (report it).
        Failures during a pause (writes started before it) do not lengthen it."""
        if now < self.retry_at:
            return False
        self.failures += 1
        self.retry_at = now + self.pause_s()
        return self.failures == 1

    def ok(self) -> bool:
        """A write succeeded: True if it ends a run of failures (report the recovery)."""
        ended = self.failures > 0
        self.failures, self.retry_at = 0, 0.0
        return ended

    def pause_s(self) -> float:
        """The pause after the current run of failures (0 while none)."""
        if self.failures == 0:
            return 0.0
        return min(self.max_s, self.first_s * 2 ** (self.failures - 1))
