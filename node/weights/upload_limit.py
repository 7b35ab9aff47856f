"""A node-wide upload cap (`network.upload_limit_mib_s`): a token bucket shared by every
stream we serve shards on.

Home connections have an uplink far below what one stream can push; serving weights
flat out would starve everything else (gossip, heartbeats). Every chunk a shard server
writes first takes its size in tokens; tokens refill at the cap, up to one `burst_s`
worth. One chunk holds the uplink at a time; which waiting chunk goes next is
`protocol.shard_schedule.next_upload`'s rule (the shard with the fewest bytes left,
unless one has waited too long), so shards finish one after another and can be relayed
at once instead of all finishing late together. A cap of 0 means no limit.

`queued` counts the bytes still to send of the transfers being served (`sending`);
`busy()` is `protocol.shard_schedule.upload_busy` on it: a capped server past its queue
limit declines new shard requests, so they go to holders with room.

Resource handling: waiters are trio tasks parked on an event; one that is cancelled
while waiting leaves the queue, one cancelled after its turn came passes the turn on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import trio

from protocol.shard_schedule import UPLOAD_MAX_WAIT_S, next_upload, upload_busy

MiB = 1024 * 1024


class _Waiter:
    __slots__ = ("since", "left", "turn")

    def __init__(self, since: float, left: int) -> None:
        self.since, self.left, self.turn = since, left, trio.Event()


class _Sending:
    __slots__ = ("_limiter", "left")

    def __init__(self, limiter: UploadLimiter, nbytes: int) -> None:
        self._limiter, self.left = limiter, nbytes

    def sent(self, n: int) -> None:
        n = min(n, self.left)
        self.left -= n
        self._limiter.queued -= n


class UploadLimiter:
    """`await limiter.acquire(n, left)` before sending n bytes of a transfer that has
    `left` bytes (n included) still to send; `sent` counts what passed."""

    def __init__(
        self, mib_per_s: float = 0.0, burst_s: float = 0.1, max_wait_s: float = UPLOAD_MAX_WAIT_S
    ) -> None:
        self.burst_s = burst_s
        self.set_rate(mib_per_s)
        self.max_wait_s = max_wait_s
        self._tokens = self.capacity
        self._busy = False
        self._waiting: list[_Waiter] = []
        self.sent = 0
        self.queued = 0  # bytes still to send of the transfers being served

    def set_rate(self, mib_per_s: float) -> None:
        """Change the cap (0: none) from now on."""
        self.rate = max(0.0, float(mib_per_s)) * MiB
        self.capacity = max(256 * 1024.0, self.rate * self.burst_s)
        self._last = trio.current_time() if self.rate else 0.0

    def busy(self) -> bool:
        """Whether a new transfer should be declined (never without a cap)."""
        return bool(self.rate) and upload_busy(self.queued, self.rate, self.max_wait_s)

    @contextlib.contextmanager
    def sending(self, nbytes: int) -> Iterator[_Sending]:
        """Count a transfer of `nbytes` in `queued` until it ends; the caller reports each
        piece that went out with `.sent(n)`."""
        s = _Sending(self, nbytes)
        self.queued += nbytes
        try:
            yield s
        finally:
            self.queued -= s.left

    async def acquire(self, n: int, left: int | None = None) -> None:
        """Wait until `n` bytes may go out under the cap; `left` is what the upload still has to
        send (it orders the waiters)."""
        self.sent += n
        if not self.rate:
            return
        if self._busy or self._waiting:
            me = _Waiter(trio.current_time(), n if left is None else max(n, left))
            self._waiting.append(me)
            try:
                await me.turn.wait()
            except BaseException:
                if me.turn.is_set():
                    self._pass_turn()  # chosen, but gone: the next one goes
                else:
                    self._waiting.remove(me)
                raise
        self._busy = True
        try:
            now = trio.current_time()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n  # may go negative for a chunk above the burst: wait it off
            if self._tokens < 0:
                await trio.sleep(-self._tokens / self.rate)
        finally:
            self._pass_turn()

    def _pass_turn(self) -> None:
        if not self._waiting:
            self._busy = False
            return
        i = next_upload(
            [(w.since, w.left) for w in self._waiting], trio.current_time(), self.max_wait_s
        )
        self._busy = True
        self._waiting.pop(i).turn.set()
