"""The store's ledger, peer scores and bans, and never-repeating counters (a part of
`node.store.store.Store`; see `node.store.store` for the API).

The ledger says what this peer produced and what became of it, and what others sent and
what admission made of it, with reasons. Old "in" lines are compacted into per-(direction,
outcome, reason) totals by `node.store.retention`; `ledger_summary` counts both.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from node.store.schema import (
    LEDGER_COLS,
    LedgerEntry,
    check_peer,
    check_time,
)
from protocol.admission import Reject
from protocol.peer_score import PeerId, PeerRecord


class LedgerStore:
    """Peers, ledger and counters; mixed into `Store`, which provides `_read`/`_write`."""

    _read: Any
    _write: Any

    # -- peers ---------------------------------------------------------------------

    @staticmethod
    def _peer_params(r: PeerRecord) -> tuple:
        check_peer(r.peer)
        for name in ("score", "updated_at", "banned_until"):
            check_time(getattr(r, name), name)
        return (r.peer, float(r.score), float(r.updated_at), float(r.banned_until), int(r.offences))

    def save_peer(self, record: PeerRecord) -> None:
        """Insert or replace one peer record."""
        self.save_peers([record])

    def save_peers(self, records: Iterable[PeerRecord]) -> None:
        """Insert or replace peer records in one transaction."""
        params = [self._peer_params(r) for r in records]
        with self._write() as c:
            c.executemany(
                "INSERT INTO peers (peer, score, updated_at, banned_until, offences) "
                "VALUES (?,?,?,?,?) ON CONFLICT(peer) DO UPDATE SET score=excluded.score, "
                "updated_at=excluded.updated_at, banned_until=excluded.banned_until, "
                "offences=excluded.offences",
                params,
            )

    def load_peers(self) -> list[PeerRecord]:
        """Every stored peer record."""
        with self._read() as c:
            rows = c.execute(
                "SELECT peer, score, updated_at, banned_until, offences FROM peers"
            ).fetchall()
        return [PeerRecord(*r) for r in rows]

    def active_bans(self, now: float) -> list[PeerRecord]:
        """Peer records banned past `now`, soonest to end first."""
        with self._read() as c:
            rows = c.execute(
                "SELECT peer, score, updated_at, banned_until, offences FROM peers "
                "WHERE banned_until>? ORDER BY banned_until",
                (float(now),),
            ).fetchall()
        return [PeerRecord(*r) for r in rows]

    # -- ledger --------------------------------------------------------------------

    @staticmethod
    def _ledger_params(e: LedgerEntry) -> tuple:
        if e.direction not in ("out", "in"):
            raise ValueError(f"ledger direction must be 'out' or 'in', not {e.direction!r}")
        if e.outcome not in ("produced", "accepted", "rejected"):
            raise ValueError(f"ledger outcome {e.outcome!r} unknown")
        if e.peer is not None:
            check_peer(e.peer)
        check_time(e.at, "at")
        reason = None if e.reason is None else str(e.reason)
        return (
            float(e.at),
            e.direction,
            e.outcome,
            str(e.kind),
            e.item_id,
            e.peer,
            reason,
            e.detail,
        )

    def log(self, entry: LedgerEntry) -> None:
        """Append one ledger line."""
        self.log_many([entry])

    def log_many(self, entries: Iterable[LedgerEntry]) -> None:
        """Append ledger lines in one transaction."""
        params = [self._ledger_params(e) for e in entries]
        with self._write() as c:
            self._insert_ledger(c, params)

    @staticmethod
    def _insert_ledger(c: sqlite3.Connection, params: list[tuple]) -> None:
        c.executemany(
            "INSERT INTO ledger (at, direction, outcome, kind, item_id, peer, reason, detail) "
            "VALUES (?,?,?,?,?,?,?,?)",
            params,
        )

    def ledger(
        self,
        direction: str | None = None,
        outcome: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        item_id: bytes | None = None,
        limit: int = 1000,
        newest: bool = False,
    ) -> list[LedgerEntry]:
        """Ledger lines matching every given filter, oldest first (`newest`: the newest
        `limit` of them, still oldest first)."""
        where, args = [], []
        for col, val in (
            ("direction", direction),
            ("outcome", outcome),
            ("kind", kind),
            ("item_id", item_id),
        ):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        if since is not None:
            where.append("at>=?")
            args.append(float(since))
        sql = f"SELECT {LEDGER_COLS} FROM ledger"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq {'DESC' if newest else ''} LIMIT ?"
        args.append(int(limit))
        with self._read() as c:
            rows = c.execute(sql, args).fetchall()
        return [LedgerEntry(*r) for r in (reversed(rows) if newest else rows)]

    def ledger_summary(
        self, direction: str | None = None
    ) -> dict[tuple[str, str, str | None], int]:
        """Counts per (direction, outcome, reason), lines compacted away included."""
        where, args = ("", []) if direction is None else (" WHERE direction=?", [direction])
        out: dict[tuple[str, str, str | None], int] = {}
        with self._read() as c:
            for d, o, r, n in c.execute(
                f"SELECT direction, outcome, reason, count(*) FROM ledger{where} "
                "GROUP BY direction, outcome, reason",
                args,
            ).fetchall():
                out[(d, o, r)] = int(n)
            for d, o, r, n in c.execute(
                f"SELECT direction, outcome, reason, n FROM ledger_totals{where}", args
            ).fetchall():
                key = (d, o, r or None)
                out[key] = out.get(key, 0) + int(n)
        return out

    def produced_status(self, kind: str = "rollout") -> dict[str, int]:
        """This peer's own items of `kind`: how many produced, and of those how many have
        a verdict logged: accepted (any validator accepted and none rejected), rejected
        (at least one rejection), or still pending."""
        sql = """
            SELECT
              count(*),
              sum(CASE WHEN rej > 0 THEN 1 ELSE 0 END),
              sum(CASE WHEN rej = 0 AND acc > 0 THEN 1 ELSE 0 END)
            FROM (
              SELECT p.item_id,
                (SELECT count(*) FROM ledger v WHERE v.item_id = p.item_id
                   AND v.direction='out' AND v.outcome='rejected') AS rej,
                (SELECT count(*) FROM ledger v WHERE v.item_id = p.item_id
                   AND v.direction='out' AND v.outcome='accepted') AS acc
              FROM ledger p
              WHERE p.direction='out' AND p.outcome='produced' AND p.kind=?
              GROUP BY p.item_id
            )"""
        with self._read() as c:
            produced, rejected, accepted = c.execute(sql, (kind,)).fetchone()
        produced, rejected, accepted = int(produced), int(rejected or 0), int(accepted or 0)
        return {
            "produced": produced,
            "accepted": accepted,
            "rejected": rejected,
            "pending": produced - accepted - rejected,
        }

    def own_work(
        self, version: int | None = None, max_staleness: int | None = None
    ) -> dict[str, int]:
        """What became of this peer's own rollouts, as far as it can tell: `produced`;
        `delivered` (a trainer holds it); `too_stale` (no trainer took it in time);
        `audited` (a verdict came), of which `refused` (a validator rejected it);
        `awaiting_audit` (no verdict, neither too stale nor past its window);
        `trained_unaudited` (delivered, no verdict, its staleness window closed: the
        trainer takes such rollouts of producers in good standing without an audit);
        `trained` (delivered, not refused, its window closed). A rollout's window is
        closed when `version - its version > max_staleness` (both given), or when retention
        already dropped its row (it does so only past the window)."""
        sql = """
            SELECT
              count(*),
              sum(CASE WHEN rej > 0 OR acc > 0 THEN 1 ELSE 0 END),
              sum(CASE WHEN rej > 0 THEN 1 ELSE 0 END),
              sum(CASE WHEN state = 'delivered' THEN 1 ELSE 0 END),
              sum(CASE WHEN state = 'too_stale' THEN 1 ELSE 0 END),
              sum(CASE WHEN state = 'delivered' AND rej = 0 AND closed THEN 1 ELSE 0 END),
              sum(CASE WHEN state = 'delivered' AND rej = 0 AND acc = 0 AND closed
                  THEN 1 ELSE 0 END),
              sum(CASE WHEN rej = 0 AND acc = 0 AND state IS NOT 'too_stale'
                  AND NOT (state IS 'delivered' AND closed) THEN 1 ELSE 0 END)
            FROM (
              SELECT p.item_id,
                (SELECT count(*) FROM ledger v WHERE v.item_id = p.item_id
                   AND v.direction='out' AND v.outcome='rejected') AS rej,
                (SELECT count(*) FROM ledger v WHERE v.item_id = p.item_id
                   AND v.direction='out' AND v.outcome='accepted') AS acc,
                d.state AS state,
                (r.rollout_id IS NULL OR (? IS NOT NULL AND ? - r.policy_version > ?)) AS closed
              FROM ledger p
              LEFT JOIN deliveries d ON d.rollout_id = p.item_id
              LEFT JOIN rollouts r ON r.rollout_id = p.item_id
              WHERE p.direction='out' AND p.outcome='produced' AND p.kind='rollout'
              GROUP BY p.item_id
            )"""
        known = version is not None and max_staleness is not None
        args = (1 if known else None, version if known else 0, max_staleness if known else 0)
        with self._read() as c:
            row = c.execute(sql, args).fetchone()
        produced, audited, refused, delivered, stale, trained, unaudited, awaiting = (
            int(n or 0) for n in row
        )
        return {
            "produced": produced,
            "delivered": delivered,
            "audited": audited,
            "refused": refused,
            "trained": trained,
            "too_stale": stale,
            "awaiting_audit": awaiting,
            "trained_unaudited": unaudited,
        }

    def ledger_compacted(self) -> dict[tuple[str, str, str | None], int]:
        """The ledger lines retention compacted away, counted per (direction, outcome,
        reason)."""
        with self._read() as c:
            return {
                (d, o, r or None): int(n)
                for d, o, r, n in c.execute(
                    "SELECT direction, outcome, reason, n FROM ledger_totals"
                ).fetchall()
            }

    # -- counters ------------------------------------------------------------------

    def reserve(self, name: str, n: int = 1) -> int:
        """Reserve `n` consecutive numbers of counter `name` (starting at 0); returns the first."""
        if n < 1:
            raise ValueError("reserve at least one number")
        with self._write() as c:
            row = c.execute("SELECT value FROM counters WHERE name=?", (name,)).fetchone()
            first = 0 if row is None else int(row[0])
            c.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value=excluded.value",
                (name, first + n),
            )
            return first

    def log_rejects(
        self, rejects: Iterable[tuple[Reject, float]], item_id: bytes | None = None
    ) -> None:
        """Log charges (a `Reject` by admission, a `Penalized`): "in/rejected" lines with the
        reason, stage and detail, one transaction for all."""
        self.log_many(
            LedgerEntry(
                now,
                "in",
                "rejected",
                reject.kind or "unknown",
                item_id,
                reject.peer,
                str(reject.reason),
                f"{reject.stage}: {reject.detail}"[:500],
            )
            for reject, now in rejects
        )

    # -- our own work: delivery ------------------------------------------------------

    def mark_delivered(self, ids: Iterable[bytes], peer: PeerId, at: float) -> int:
        """Record that `peer` (a trainer) holds these rollouts of ours; returns how many
        were not known as delivered before."""
        check_peer(peer)
        with self._write() as c:
            n = 0
            for rid in ids:
                cur = c.execute(
                    "INSERT INTO deliveries (rollout_id, state, peer, at) VALUES (?, 'delivered', ?, ?) "
                    "ON CONFLICT(rollout_id) DO UPDATE SET state='delivered', peer=excluded.peer, "
                    "at=excluded.at, reason=NULL WHERE state!='delivered'",
                    (rid, peer, float(at)),
                )
                n += cur.rowcount
            return n

    def mark_too_stale(self, ids: Iterable[bytes], reason: str, at: float) -> int:
        """Record that these rollouts of ours went unacknowledged past the staleness bound."""
        with self._write() as c:
            return sum(
                c.execute(
                    "INSERT OR IGNORE INTO deliveries (rollout_id, state, at, reason) "
                    "VALUES (?, 'too_stale', ?, ?)",
                    (rid, float(at), str(reason)),
                ).rowcount
                for rid in ids
            )

    def undelivered_own(self, limit: int = 100_000) -> list[tuple[bytes, int]]:
        """Our own rollouts with no delivery state yet: (rollout_id, policy_version)."""
        sql = """
            SELECT r.rollout_id, r.policy_version FROM ledger p
            JOIN rollouts r ON r.rollout_id = p.item_id
            LEFT JOIN deliveries d ON d.rollout_id = p.item_id
            WHERE p.direction='out' AND p.outcome='produced' AND p.kind='rollout'
              AND d.rollout_id IS NULL
            ORDER BY p.seq LIMIT ?"""
        with self._read() as c:
            return [(r[0], int(r[1])) for r in c.execute(sql, (int(limit),))]

    def delivery_status(self) -> dict[str, int]:
        """Our own rollouts: produced, delivered (a trainer holds it), too stale, pending."""
        with self._read() as c:
            produced = c.execute(
                "SELECT count(DISTINCT item_id) FROM ledger WHERE direction='out' "
                "AND outcome='produced' AND kind='rollout'"
            ).fetchone()[0]
            by_state = dict(c.execute("SELECT state, count(*) FROM deliveries GROUP BY state"))
        delivered, stale = int(by_state.get("delivered", 0)), int(by_state.get("too_stale", 0))
        return {
            "produced": int(produced),
            "delivered": delivered,
            "pending": int(produced) - delivered - stale,
            "too_stale": stale,
        }
