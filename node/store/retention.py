"""How long the store keeps what: retention and the size bound (a part of `node.store.store.Store`).

`enforce_retention(now, below_version, keep_s, max_bytes)` runs periodically (the peer's
tick loop, in a worker thread) and deletes, each step in short transactions so a crash
mid-way leaves a consistent file:

1. Rollouts older than the staleness bound (`policy_version < below_version`, i.e. the
   current version − S) received more than `keep_s` ago (the dedup memory a restart
   rebuilds reads that window), with the verdicts about them — except our own rollouts
   that no trainer acknowledged yet (the worker's delivery accounting still needs them).
2. "In" ledger lines older than `keep_s`, compacted into per-(direction, outcome, reason)
   totals (`ledger_summary` counts them; our own work's "out" lines are kept).
3. While the pages in use exceed `max_bytes`, in this order until they are under 80% of
   it: stale rollouts whatever their age, the oldest "in" ledger lines, bodyless headers,
   and then the oldest rollouts of other peers (a relay's store is a cache). Never our own
   unacknowledged work, verdicts about live rollouts, scores, bans or counters. If only
   those are left the report says `over_budget` and the peer warns.

Deleted pages are reused by later writes, so the file stops growing at about `max_bytes`
plus what arrives between two runs; the write-ahead log is checkpointed and truncated at
the end of each run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHUNK = 2000  # rows per delete transaction
LOW_WATER = 0.8  # a size-bound run stops under this share of max_bytes

_OWN_PENDING = "(source_peer IS NULL AND rollout_id NOT IN (SELECT rollout_id FROM deliveries))"


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one retention run removed, and the store's size before and after."""

    rollouts_deleted: int = 0
    verdicts_deleted: int = 0
    ledger_compacted: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    over_budget: bool = False

    @property
    def changed(self) -> bool:
        """Whether anything was removed."""
        return bool(self.rollouts_deleted or self.verdicts_deleted or self.ledger_compacted)


class RetentionStore:
    """Retention; mixed into `Store`, which provides `_read`/`_write`."""

    _read: Any
    _write: Any

    def used_bytes(self) -> int:
        """Bytes of the pages in use (the file may hold free pages on top, reused first)."""
        with self._read() as c:
            size = c.execute("PRAGMA page_size").fetchone()[0]
            pages = c.execute("PRAGMA page_count").fetchone()[0]
            free = c.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * size)

    def enforce_retention(
        self, now: float, below_version: int, keep_s: float, max_bytes: int | None = None
    ) -> RetentionReport:
        """Apply the retention rules (module docstring); returns what was removed."""
        before = self.used_bytes()
        cutoff = now - keep_s
        stale = f"policy_version < {int(below_version)} AND NOT {_OWN_PENDING}"
        rollouts = self._delete_rollouts(f"{stale} AND received_at < {float(cutoff)!r}")
        verdicts = self._delete_orphan_verdicts(cutoff)
        ledger = self._compact_ledger(f"direction='in' AND at < {float(cutoff)!r}")
        over = False
        if max_bytes is not None and self.used_bytes() > max_bytes:
            goal = int(max_bytes * LOW_WATER)
            steps = (
                lambda: self._delete_rollouts(stale),
                lambda: self._compact_ledger("direction='in'", goal=goal),
                lambda: self._delete_rollouts(f"body IS NULL AND NOT {_OWN_PENDING}", goal=goal),
                lambda: self._delete_rollouts("source_peer IS NOT NULL", goal=goal),
            )
            for step in steps:
                if self.used_bytes() <= goal:
                    break
                n = step()
                if step is steps[1]:
                    ledger += n
                else:
                    rollouts += n
            verdicts += self._delete_orphan_verdicts(now + 1.0)
            over = self.used_bytes() > max_bytes
        with self._read() as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the log is part of the budget
        return RetentionReport(rollouts, verdicts, ledger, before, self.used_bytes(), over)

    def _delete_rollouts(self, where: str, goal: int | None = None) -> int:
        """Delete rollouts matching `where`, oldest first, `CHUNK` per transaction; with a
        `goal`, stop once the pages in use are under it."""
        total = 0
        while goal is None or self.used_bytes() > goal:
            with self._write() as c:
                n = c.execute(
                    "DELETE FROM rollouts WHERE rowid IN (SELECT rowid FROM rollouts "
                    f"WHERE {where} ORDER BY received_at LIMIT {CHUNK})"
                ).rowcount
            total += n
            if n < CHUNK:
                break
        return total

    def _delete_orphan_verdicts(self, before: float) -> int:
        with self._write() as c:
            return c.execute(
                "DELETE FROM verdicts WHERE received_at < ? AND rollout_id NOT IN "
                "(SELECT rollout_id FROM rollouts)",
                (float(before),),
            ).rowcount

    def _compact_ledger(self, where: str, goal: int | None = None) -> int:
        """Fold ledger lines matching `where` into `ledger_totals`, oldest first, one
        transaction per chunk (the count and the deletion commit together)."""
        total = 0
        while goal is None or self.used_bytes() > goal:
            with self._write() as c:
                c.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (seq INTEGER PRIMARY KEY)")
                c.execute("DELETE FROM doomed")
                c.execute(
                    f"INSERT INTO doomed SELECT seq FROM ledger WHERE {where} ORDER BY seq LIMIT {CHUNK}"
                )
                c.execute(
                    "INSERT INTO ledger_totals (direction, outcome, reason, n) "
                    "SELECT direction, outcome, coalesce(reason, ''), count(*) FROM ledger "
                    "WHERE seq IN (SELECT seq FROM doomed) GROUP BY 1, 2, 3 "
                    "ON CONFLICT (direction, outcome, reason) DO UPDATE SET n = n + excluded.n"
                )
                n = c.execute("DELETE FROM ledger WHERE seq IN (SELECT seq FROM doomed)").rowcount
            total += n
            if n < CHUNK:
                break
        return total
