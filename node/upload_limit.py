"""A node-wide upload cap (`network.upload_limit_mib_s`): a token bucket shared by every
stream we serve shards on.

Home connections have an uplink far below what one stream can push; serving weights
flat out would starve everything else (gossip, heartbeats). Every chunk a shard server
writes first takes its size in tokens; tokens refill at the cap, up to one `burst_s`
worth. Waiters are served in arrival order (a trio lock), so one big shard does not
starve the others. A cap of 0 means no limit.
"""

from __future__ import annotations

import trio

MiB = 1024 * 1024


class UploadLimiter:
    """`await limiter.acquire(n)` before sending n bytes; `sent` counts what passed."""

    def __init__(self, mib_per_s: float = 0.0, burst_s: float = 0.1) -> None:
        self.rate = max(0.0, float(mib_per_s)) * MiB
        self.capacity = max(256 * 1024.0, self.rate * burst_s)
        self._tokens = self.capacity
        self._last = trio.current_time() if self.rate else 0.0
        self._lock = trio.Lock()
        self.sent = 0

    async def acquire(self, n: int) -> None:
        self.sent += n
        if not self.rate:
            return
        async with self._lock:
            now = trio.current_time()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n  # may go negative for a chunk above the burst: wait it off
            if self._tokens < 0:
                await trio.sleep(-self._tokens / self.rate)
