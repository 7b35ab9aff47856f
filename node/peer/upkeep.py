"""A peer's periodic upkeep: admission's clock tick, saving scores, forgetting headers past
the pull window, and the store's retention (`node.store.retention`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from node.peer.ports import Admit, VersionView
from node.store.store import Store, StoreError
from protocol.admission import Tick

log = logging.getLogger("swarm.peer")

SCORE_SAVE_INTERVAL_S = 15.0  # rewards; a penalty is saved with its ledger line
BODYLESS_CHECK_S = 5.0  # how often headers past the pull window are forgotten
RETENTION_EVERY_S = 60.0  # how often the store prunes


class Upkeep:
    """The periodic chores of one peer (`run`, in the peer's nursery).

    `admission` gets a `Tick` every second; `save_scores()` persists peer scores;
    `version` and `max_staleness` set which rollouts retention may drop; `window_s` is
    the body pull window; `keep_s` how long admission remembers seen items."""

    def __init__(
        self,
        admission: Admit,
        store: Store,
        save_scores: Callable[[], Awaitable[None]],
        version: VersionView,
        max_staleness: int,
        window_s: float,
        keep_s: float,
        store_max_bytes: int | None,
        counters: Counter[str],
    ) -> None:
        self.admission = admission
        self.store = store
        self.save_scores = save_scores
        self.version = version
        self.max_staleness = max_staleness
        self.window_s = window_s
        self.keep_s = keep_s
        self.store_max_bytes = store_max_bytes
        self.counters = counters

    async def run(self) -> None:
        """Tick, save scores, forget bodyless headers and prune, until cancelled."""
        last_save = last_expiry = last_retention = time.monotonic()
        window_s = self.window_s
        while True:
            await trio.sleep(1.0)
            now = time.time()
            self.admission.submit(Tick(now))
            if time.monotonic() - last_save > SCORE_SAVE_INTERVAL_S:
                last_save = time.monotonic()
                await self.save_scores()
            if time.monotonic() - last_retention > RETENTION_EVERY_S:
                last_retention = time.monotonic()
                await self.enforce_retention(now)
            if time.monotonic() - last_expiry > min(BODYLESS_CHECK_S, window_s):
                last_expiry = time.monotonic()
                with contextlib.suppress(StoreError):
                    # A header whose body nobody served within the pull window is forgotten.
                    n = await trio.to_thread.run_sync(self.store.expire_bodyless, now - window_s)
                    self.counters["bodyless_expired"] += n

    async def enforce_retention(self, now: float) -> None:
        """Prune what no rule needs any more, and stay under `store_max_bytes`."""
        below = self.version.policy_version - self.max_staleness
        try:
            report = await trio.to_thread.run_sync(
                self.store.enforce_retention, now, below, self.keep_s, self.store_max_bytes
            )
        except StoreError as exc:
            log.warning("retention failed: %s", exc)
            return
        self.counters["retention_rollouts_deleted"] += report.rollouts_deleted
        self.counters["retention_ledger_compacted"] += report.ledger_compacted
        if report.over_budget:
            log.warning(
                "store holds %d bytes of needed rows, over store.max_bytes %d",
                report.bytes_after,
                self.store_max_bytes,
            )
