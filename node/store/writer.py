"""The batched writer between admission and the store.

Admitted items are queued here and written in batches (one transaction, one fsync per
batch, in a worker thread), so many messages arriving together share one write and no
write runs on the event loop. Each queued item carries a continuation: the actions that
admission ordered after the `Store` (forward, deliver). They run only once the item is
durable — the order Store-then-Forward holds however long the write takes; a caller that
stops waiting (the gossip validator's deadline) does not cancel them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from node.store.store import Store, StoreError
from protocol.admission import Admitted

T = TypeVar("T")


async def receive_batch(recv: trio.MemoryReceiveChannel[T], most: int) -> list[T]:
    """Wait for one item, then take what else is already queued, up to `most` in all."""
    batch = [await recv.receive()]
    while len(batch) < most:
        try:
            batch.append(recv.receive_nowait())
        except trio.WouldBlock:
            break
    return batch


log = logging.getLogger("swarm.peer")

BATCH = 64  # items per transaction at most


@dataclass
class PendingWrite:
    """One admitted item on its way to the store; `then(ok)` runs once it was written
    (ok=True) or failed (ok=False)."""

    item: Admitted
    then: Callable[[bool], None]


class StoreWriter:
    """Writes admitted items to the store in batches, off the event loop (module docstring)."""

    def __init__(self, store: Store, own_peer: bytes, queue: int, counters: Counter[str]) -> None:
        self.store = store
        self.own_peer = own_peer
        self.counters = counters
        self._send, self._recv = trio.open_memory_channel[PendingWrite](queue)

    def put(self, write: PendingWrite) -> bool:
        """Queue a write; False when the queue is full (the caller treats it as failed)."""
        try:
            self._send.send_nowait(write)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.counters["overloaded_drops"] += 1
            return False
        return True

    def pending(self) -> int:
        """Items queued and not yet written."""
        return self._recv.statistics().current_buffer_used

    async def run(self) -> None:
        """Forever: write a batch of queued items in one transaction and run their callbacks."""
        while True:
            batch = await receive_batch(self._recv, BATCH)
            results = await trio.to_thread.run_sync(self._write, [w.item for w in batch])
            self.counters["store_batches"] += 1
            for w, ok in zip(batch, results, strict=True):
                if ok:
                    self.counters[f"stored_{w.item.kind}"] += 1
                else:
                    self.counters["store_failed"] += 1
                w.then(ok)

    def _write(self, items: list[Admitted]) -> list[bool]:
        """(In a thread.) One transaction for the batch; item by item if it fails."""
        try:
            self.store.put_admitted_many(items, own_peer=self.own_peer)
            return [True] * len(items)
        except (StoreError, ValueError) as exc:
            log.warning("batch store failed (%s); storing one by one", exc)
        ok = []
        for item in items:
            try:
                self.store.put_admitted(item, own_peer=self.own_peer)
                ok.append(True)
            except (StoreError, ValueError) as exc:
                log.warning("store failed for %s: %s", item.kind, exc)
                ok.append(False)
        return ok
