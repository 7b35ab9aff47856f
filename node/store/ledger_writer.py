"""Penalties made durable: the peer's scores, then the ledger lines that explain them.

Every charge (a `Reject` with a penalty, a `Penalized`) is queued here; one task saves the
score table and then writes the queued lines in one transaction, so a crash never keeps
a penalty's ledger line but forgets the penalty. Bans are stored before they take effect
by the peer itself (`Peer._ban`).
"""

from __future__ import annotations

import contextlib
import time

import trio

from node.store.store import Store, StoreError
from node.store.writer import receive_batch
from protocol.admission import Penalized, Reject
from protocol.peer_score import PeerScores

BATCH = 256


class LedgerWriter:
    """Queues charges and makes them durable, scores before ledger lines (module docstring)."""

    def __init__(self, store: Store, scores: PeerScores, queue: int) -> None:
        self.store, self.scores = store, scores
        self._send, self._recv = trio.open_memory_channel[tuple[Reject | Penalized, float]](queue)

    def put(self, charge: Reject | Penalized) -> None:
        """Queue a charge's ledger line; dropped when the queue is full."""
        with contextlib.suppress(trio.WouldBlock):
            self._send.send_nowait((charge, time.time()))

    async def save_scores(self) -> None:
        """Save a snapshot of the score table (a store error is skipped)."""
        snapshot = self.scores.snapshot(time.time())
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peers, snapshot)

    async def run(self) -> None:
        """Forever: take a batch of charges, save the scores, then log their lines."""
        while True:
            batch = await receive_batch(self._recv, BATCH)
            await self.save_scores()
            with contextlib.suppress(StoreError):
                await trio.to_thread.run_sync(self.store.log_rejects, batch)
