"""A peer's periodic upkeep: admission's clock tick, saving scores, forgetting headers past
the pull window, and the store's retention (`node.store.retention`)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import trio

from node.store.store import StoreError
from protocol.admission import Tick

if TYPE_CHECKING:
    from node.peer.peer import Peer

log = logging.getLogger("swarm.peer")

SCORE_SAVE_INTERVAL_S = 15.0  # rewards; a penalty is saved with its ledger line
BODYLESS_CHECK_S = 5.0  # how often headers past the pull window are forgotten
RETENTION_EVERY_S = 60.0  # how often the store prunes


class Upkeep:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    async def run(self) -> None:
        last_save = last_expiry = last_retention = time.monotonic()
        window_s = self.peer.cfg.pull.window_s
        while True:
            await trio.sleep(1.0)
            now = time.time()
            self.peer.submit(Tick(now))
            if time.monotonic() - last_save > SCORE_SAVE_INTERVAL_S:
                last_save = time.monotonic()
                await self.peer.ledger.save_scores()
            if time.monotonic() - last_retention > RETENTION_EVERY_S:
                last_retention = time.monotonic()
                await self.enforce_retention(now)
            if time.monotonic() - last_expiry > min(BODYLESS_CHECK_S, window_s):
                last_expiry = time.monotonic()
                with contextlib.suppress(StoreError):
                    # A header whose body nobody served within the pull window is forgotten.
                    n = await trio.to_thread.run_sync(
                        self.peer.store.expire_bodyless, now - window_s
                    )
                    self.peer.counters["bodyless_expired"] += n

    async def enforce_retention(self, now: float) -> None:
        """Prune what no rule needs any more, and stay under `store_max_bytes`."""
        peer = self.peer
        below = peer.policy_version - peer.manifest.max_staleness
        try:
            report = await trio.to_thread.run_sync(
                peer.store.enforce_retention,
                now,
                below,
                peer.admission.config.dedup_ttl_s,
                peer.cfg.store_max_bytes,
            )
        except StoreError as exc:
            log.warning("retention failed: %s", exc)
            return
        peer.counters["retention_rollouts_deleted"] += report.rollouts_deleted
        peer.counters["retention_ledger_compacted"] += report.ledger_compacted
        if report.over_budget:
            log.warning(
                "store holds %d bytes of needed rows, over store.max_bytes %d",
                report.bytes_after,
                peer.cfg.store_max_bytes,
            )
