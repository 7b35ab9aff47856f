"""Durable storage of one peer: rollouts, verdicts, peer scores and bans, and a ledger.

One SQLite file, `<data dir>/node.sqlite3`, in WAL mode with `synchronous=FULL`: every
write method runs one transaction and returns only after it committed, so whatever a
method has returned for (an "ack") survives `kill -9` and a power cut. Nothing here knows
about the network or the protocol rules: the node feeds it what `protocol.admission` told it
to store. What it owns: the schema, its version and migrations, and turning every SQLite
failure into a one-line `StoreError`.

Threads and trio
----------------
A `Store` holds one connection guarded by a lock, so it may be called from any thread; calls
serialize. A write transaction costs an fsync (milliseconds on a common disk), so a
trio task should call it through `await trio.to_thread.run_sync(store.put_rollout, ...)`
(or batch with `put_admitted_many`) rather than on the event loop. Reads are short indexed
queries; `rollouts()` and `ledger()` take a `limit`.

Public API
----------
`Store.open(data_dir) -> Store`  creates the directory and file if needed
`Store(path)`                     open a given file; `close()`; usable as a context manager
Rollouts (the signed header envelope and the encoded body, kept as received):
    `put_rollout(RolloutRow) -> bool`       False when the id was already stored (idempotent;
                                            a body missing before is filled in)
    `get_rollout(rollout_id) -> RolloutRow | None`, `has_rollout(rollout_id) -> bool`
    `rollouts(run_id=None, min_version=None, max_version=None, producer=None,
              with_body=False, limit=1000) -> list[RolloutRow]`   oldest first
    `count_rollouts(run_id=None) -> int`
Verdicts:
    `put_verdict(VerdictRow) -> bool`, `verdicts_for(rollout_id) -> list[VerdictRow]`
From admission's actions (one transaction each: the row and its ledger line together):
    `put_admitted(item, own_peer=None) -> bool`   for `Store(item)`: a rollout header or
        record, or a verdict (a verdict about a rollout `own_peer` produced also logs the
        outcome of that work); False when it was already stored
    `put_admitted_many(items, own_peer=None) -> list[bool]`   the same, one transaction
    `log_rejects([(reject, now)], item_id=None)`  for charges worth keeping (`Reject`
        with a penalty, `Penalized`)
    Batch where you can: one transaction is one fsync (a few ms), whatever it holds.
    `put_produced(row)`                            this peer's own new rollout + "produced"
    `rollout_row(item)`, `verdict_row(item)`       the rows an `Admitted` becomes
Peers (bans survive a restart):
    `save_peer(PeerRecord)`, `save_peers(records)`, `load_peers() -> list[PeerRecord]`
    (feed to `protocol.peer_score.PeerScores(config, records)`), `active_bans(now)`
Ledger (what this peer produced, and what was accepted or rejected, with reasons):
    `log(LedgerEntry)` / `log_many(entries)`
    `ledger(direction=None, outcome=None, kind=None, since=None, item_id=None, limit=1000,
        newest=False)`
    `ledger_summary(direction=None) -> dict[(direction, outcome, reason), count]`
    `produced_status(kind="rollout") -> dict` produced / accepted / rejected / pending counts
    of this peer's own work, judged by the verdicts logged against it
Retention (`node.store.retention`): `enforce_retention(now, below_version, keep_s,
    max_bytes=None) -> RetentionReport`, `used_bytes() -> int`
Catch-up and delivery (see `protocol.catch_up`):
    `held_since(since, min_version=0, producer=None, limit=1024) -> (ids, ats, more)`
        rollouts held with a body, received at or after `since`, oldest first
    `bodies_held(ids) -> set[bytes]`, `missing_bodies(limit) -> list[RolloutRow]`
        (headers whose body was never pulled: pending pulls survive a restart)
    `mark_delivered(ids, peer, at) -> int`, `mark_too_stale(ids, reason, at) -> int`
    `undelivered_own(limit) -> list[(rollout_id, policy_version)]`
    `delivery_status() -> {produced, delivered, pending, too_stale}` of our own rollouts
    `own_work(version, max_staleness) -> dict` produced / delivered / audited / refused /
    trained / too_stale / awaiting_audit / trained_unaudited counts of our own rollouts
    `ledger_compacted() -> {(direction, outcome, reason): n}` lines retention compacted
Counters that must never repeat across restarts (envelope sequence numbers, task counters):
    `reserve(name, n=1) -> int`   durably reserve n consecutive numbers, returns the first;
    reserve blocks (say 1,000) and take from them in memory: a crash only skips numbers
Maintenance: `schema_version() -> int`, `check() -> None` (full integrity check; slow on a
large file).

Peer ids are opaque `bytes` or `str` and come back as the type they went in as.
Errors: an unopenable, foreign, newer-schema, corrupt or full database raises `StoreError`
(a `node.errors.CommandError`, exit code 2) naming the file; misuse (wrong types, unknown
ledger words) raises TypeError / ValueError before anything is written.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from node.paths import DB_FILENAME
from node.store.ledger import LedgerStore
from node.store.retention import RetentionStore
from node.store.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    ROLLOUT_COLS,
    SCHEMA_VERSION,
    VERDICT_COLS,
    LedgerEntry,
    RolloutRow,
    StoreError,
    VerdictRow,
    check_peer,
    check_time,
    rollout_from_row,
    rollout_row,
    verdict_from_row,
    verdict_row,
)
from protocol.admission import Admitted, Kind
from protocol.peer_score import PeerId

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "LedgerEntry",
    "RolloutRow",
    "Store",
    "StoreError",
    "VerdictRow",
    "rollout_row",
    "verdict_row",
]


class Store(LedgerStore, RetentionStore):
    """The node's SQLite database (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if self.path.is_dir():
            raise StoreError(f"database path {self.path} is a directory")
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open database {self.path}: {exc}") from None
        self._conn = conn
        try:
            self._setup()
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise StoreError(
                f"database {self.path} is corrupt or not an SQLite file ({exc}); "
                "move it away to start with an empty store"
            ) from None

    @classmethod
    def open(cls, data_dir: str | Path) -> Store:
        """Open (creating if needed) the store of a data directory."""
        d = Path(data_dir)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data directory {d}: {exc.strerror}") from None
        return cls(d / DB_FILENAME)

    # -- opening, schema -----------------------------------------------------------

    def _setup(self) -> None:
        conn = self._conn
        assert conn is not None
        # The first read of the header: a file that is not SQLite fails here.
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        n_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and n_tables > 0):
            raise StoreError(
                f"{self.path} is an SQLite database of another program, not a swarm-node store"
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path} has schema version {version}, newer than this "
                f"swarm-node understands ({SCHEMA_VERSION}); upgrade swarm-node"
            )
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot use database {self.path}: {exc}") from None
        if str(mode).lower() != "wal":
            raise StoreError(f"database {self.path} cannot use WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        while version < SCHEMA_VERSION:
            nxt = version + 1
            with self._tx() as c:
                for stmt in MIGRATIONS[nxt]:
                    c.execute(stmt)
                c.execute(f"PRAGMA application_id={APPLICATION_ID}")
                c.execute(f"PRAGMA user_version={nxt}")
            version = nxt

    def schema_version(self) -> int:
        """The schema version of the open file."""
        with self._read() as c:
            return int(c.execute("PRAGMA user_version").fetchone()[0])

    def check(self) -> None:
        """Full integrity check; raises StoreError when the file is damaged."""
        with self._read() as c:
            rows = c.execute("PRAGMA integrity_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            raise StoreError(f"database {self.path} failed its integrity check: {rows[0][0]}")

    # -- plumbing ------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _close_quietly(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fail(self, exc: sqlite3.Error) -> StoreError:
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower():
            return StoreError(f"database {self.path}: disk full ({exc})")
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
            exc, sqlite3.OperationalError | sqlite3.IntegrityError
        ):
            return StoreError(f"database {self.path} is corrupt or unreadable: {exc}")
        return StoreError(f"database {self.path}: {exc}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (and fsynced) before the block's caller returns."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"database {self.path} is closed")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from None

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"database {self.path} is closed")
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self._fail(exc) from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._tx() as c:
            yield c

    # -- rollouts ------------------------------------------------------------------

    @staticmethod
    def _rollout_params(r: RolloutRow) -> tuple:
        if not isinstance(r.rollout_id, bytes) or not isinstance(r.header, bytes):
            raise TypeError("rollout_id and header must be bytes")
        if r.body is not None and not isinstance(r.body, bytes):
            raise TypeError("body must be bytes or None")
        check_peer(r.producer, "producer")
        if r.source_peer is not None:
            check_peer(r.source_peer, "source_peer")
        check_time(r.received_at, "received_at")
        return (
            r.rollout_id,
            str(r.run_id),
            r.producer,
            int(r.policy_version),
            r.header,
            r.body,
            float(r.received_at),
            r.source_peer,
        )

    @staticmethod
    def _insert_rollout(c: sqlite3.Connection, params: tuple) -> bool:
        cur = c.execute(
            f"INSERT OR IGNORE INTO rollouts ({ROLLOUT_COLS}) VALUES (?,?,?,?,?,?,?,?)", params
        )
        if cur.rowcount == 1:
            return True
        if params[5] is not None:  # known header, body arrived with this copy
            c.execute(
                "UPDATE rollouts SET body=? WHERE rollout_id=? AND body IS NULL",
                (params[5], params[0]),
            )
        return False

    def put_rollout(self, row: RolloutRow) -> bool:
        """Store one rollout durably; False when its id was already there."""
        params = self._rollout_params(row)
        with self._write() as c:
            return self._insert_rollout(c, params)

    def get_rollout(self, rollout_id: bytes) -> RolloutRow | None:
        """The stored rollout `rollout_id`, or None."""
        with self._read() as c:
            row = c.execute(
                f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (rollout_id,)
            ).fetchone()
        return None if row is None else rollout_from_row(row)

    def has_rollout(self, rollout_id: bytes) -> bool:
        """Whether rollout `rollout_id` is stored."""
        with self._read() as c:
            row = c.execute("SELECT 1 FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
        return row is not None

    def rollouts(
        self,
        run_id: str | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
        producer: PeerId | None = None,
        with_body: bool = False,
        limit: int = 1000,
    ) -> list[RolloutRow]:
        """Stored rollouts matching every given filter, oldest received first."""
        where, args = [], []
        if run_id is not None:
            where.append("run_id=?")
            args.append(run_id)
        if min_version is not None:
            where.append("policy_version>=?")
            args.append(int(min_version))
        if max_version is not None:
            where.append("policy_version<=?")
            args.append(int(max_version))
        if producer is not None:
            where.append("producer=?")
            args.append(producer)
        if with_body:
            where.append("body IS NOT NULL")
        sql = f"SELECT {ROLLOUT_COLS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY received_at, rowid LIMIT ?"
        args.append(int(limit))
        with self._read() as c:
            return [rollout_from_row(r) for r in c.execute(sql, args).fetchall()]

    def rollout_ids_with_body(
        self, producer: PeerId | None = None, limit: int = 1_000_000
    ) -> list[bytes]:
        """Ids of the stored rollouts that have a body, of one producer or all (ids only:
        no row is loaded)."""
        sql, args = "SELECT rollout_id FROM rollouts WHERE body IS NOT NULL", []
        if producer is not None:
            sql += " AND producer=?"
            args.append(producer)
        with self._read() as c:
            rows = c.execute(sql + " LIMIT ?", (*args, int(limit))).fetchall()
        return [r[0] for r in rows]

    # -- catch-up and delivery -------------------------------------------------------

    def held_since(
        self, since: float, min_version: int = 0, producer: PeerId | None = None, limit: int = 1024
    ) -> tuple[list[bytes], list[float], bool]:
        """Rollouts held with a body, received at or after `since` (oldest first), made at
        version >= `min_version`, of `producer` if given: (ids, received_at, more)."""
        sql = (
            "SELECT rollout_id, received_at FROM rollouts WHERE received_at>=? "
            "AND policy_version>=? AND body IS NOT NULL"
        )
        args: list = [float(since), int(min_version)]
        if producer is not None:
            sql += " AND producer=?"
            args.append(producer)
        sql += " ORDER BY received_at, rowid LIMIT ?"
        args.append(int(limit) + 1)
        with self._read() as c:
            rows = c.execute(sql, args).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        return [r[0] for r in rows], [float(r[1]) for r in rows], more

    def bodies_held(self, ids: Iterable[bytes]) -> set[bytes]:
        """Which of `ids` are stored with a body."""
        ids = list(ids)
        out: set[bytes] = set()
        with self._read() as c:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                out.update(
                    r[0]
                    for r in c.execute(
                        f"SELECT rollout_id FROM rollouts WHERE body IS NOT NULL "
                        f"AND rollout_id IN ({marks})",
                        chunk,
                    )
                )
        return out

    def missing_bodies(self, limit: int = 8192) -> list[RolloutRow]:
        """Stored headers whose body never arrived, oldest first."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE body IS NULL "
                "ORDER BY received_at LIMIT ?",
                (int(limit),),
            ).fetchall()
        return [rollout_from_row(r) for r in rows]

    def expire_bodyless(self, before: float) -> int:
        """Forget headers received before `before` whose body never arrived (nobody
        served it: they hold no work and must not fill the store); returns how many."""
        check_time(before, "before")
        with self._write() as c:
            return c.execute(
                "DELETE FROM rollouts WHERE body IS NULL AND source_peer IS NOT NULL "
                "AND received_at < ?",
                (float(before),),
            ).rowcount

    def known_since(
        self, since: float, limit: int = 65_536
    ) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """Ids stored since `since` (newest first), to refill a dedup cache after a restart:
        (rollouts with a header only, rollouts with a body, verdicts)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT rollout_id, body IS NOT NULL FROM rollouts WHERE received_at>=? "
                "ORDER BY received_at DESC LIMIT ?",
                (float(since), int(limit)),
            ).fetchall()
            verdicts = c.execute(
                "SELECT verdict_id FROM verdicts WHERE received_at>=? ORDER BY received_at DESC LIMIT ?",
                (float(since), int(limit)),
            ).fetchall()
        return (
            [r[0] for r in rows if not r[1]],
            [r[0] for r in rows if r[1]],
            [v[0] for v in verdicts],
        )

    def known_signers(self, since: float, limit: int = 65_536) -> list[bytes]:
        """Producers and validators of what was stored since `since` (most recent first):
        after a restart they are not new identities to admission."""
        with self._read() as c:
            rows = c.execute(
                "SELECT who FROM (SELECT producer AS who, received_at AS at FROM rollouts "
                "WHERE received_at>=? UNION ALL SELECT validator, received_at FROM verdicts "
                "WHERE received_at>=?) GROUP BY who ORDER BY max(at) DESC LIMIT ?",
                (float(since), float(since), int(limit)),
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def count_rollouts(self, run_id: str | None = None) -> int:
        """Rollouts stored, of one run or of all."""
        with self._read() as c:
            if run_id is None:
                return int(c.execute("SELECT count(*) FROM rollouts").fetchone()[0])
            return int(
                c.execute("SELECT count(*) FROM rollouts WHERE run_id=?", (run_id,)).fetchone()[0]
            )

    # -- verdicts ------------------------------------------------------------------

    def put_verdict(self, row: VerdictRow) -> bool:
        """Store one verdict durably; False when its id was already there."""
        check_peer(row.validator, "validator")
        check_time(row.received_at, "received_at")
        if not isinstance(row.envelope, bytes):
            raise TypeError("verdict envelope must be bytes")
        with self._write() as c:
            return self._insert_verdict(c, row)

    @staticmethod
    def _insert_verdict(c: sqlite3.Connection, row: VerdictRow) -> bool:
        cur = c.execute(
            f"INSERT OR IGNORE INTO verdicts ({VERDICT_COLS}) VALUES (?,?,?,?,?,?,?)",
            (
                row.verdict_id,
                row.rollout_id,
                row.validator,
                int(bool(row.accepted)),
                row.envelope,
                float(row.received_at),
                row.reason,
            ),
        )
        return cur.rowcount == 1

    def verdicts_for(self, rollout_id: bytes) -> list[VerdictRow]:
        """The verdicts on rollout `rollout_id`, oldest first."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {VERDICT_COLS} FROM verdicts WHERE rollout_id=? ORDER BY received_at",
                (rollout_id,),
            ).fetchall()
        return [verdict_from_row(r) for r in rows]

    # -- from admission ------------------------------------------------------------

    def put_admitted(self, item: Admitted, own_peer: PeerId | None = None) -> bool:
        """Store what admission's `Store(item)` asks for, with its "in/accepted" ledger line."""
        return self.put_admitted_many([item], own_peer)[0]

    def put_admitted_many(
        self, items: Iterable[Admitted], own_peer: PeerId | None = None
    ) -> list[bool]:
        """`put_admitted` for many items in one transaction (one fsync); every item is
        checked before anything is written, so a bad one (ValueError) writes none."""
        plan = [self._plan_admitted(item, own_peer) for item in items]
        with self._write() as c:
            out = []
            for is_rollout, params, ledger in plan:
                if is_rollout:
                    new = self._insert_rollout(c, params)
                else:
                    new = self._insert_verdict(c, params)
                if new or is_rollout:  # a record after its header is logged as well
                    self._insert_ledger(c, ledger)
                out.append(new)
            return out

    def _plan_admitted(self, item: Admitted, own_peer: PeerId | None) -> tuple[bool, Any, list]:
        entries = [
            LedgerEntry(
                item.received_at, "in", "accepted", str(item.kind), item.content_id, item.sender
            )
        ]
        if item.kind in (Kind.ROLLOUT_HEADER, Kind.ROLLOUT_RECORD):
            params = self._rollout_params(rollout_row(item))
            return True, params, [self._ledger_params(e) for e in entries]
        if item.kind is Kind.VERDICT:
            row = verdict_row(item)
            check_peer(row.validator, "validator")
            if own_peer is not None and item.obj.producer == own_peer:
                outcome = "accepted" if row.accepted else "rejected"
                entries.append(
                    LedgerEntry(
                        item.received_at,
                        "out",
                        outcome,
                        "rollout",
                        row.rollout_id,
                        row.validator,
                        row.reason,
                    )
                )
            return False, row, [self._ledger_params(e) for e in entries]
        raise ValueError(f"the store keeps no {item.kind} items")

    def put_produced(self, row: RolloutRow) -> bool:
        """Store this peer's own rollout and log it as produced, in one transaction."""
        return self.put_produced_many([row])[0]

    def put_produced_many(self, rows: Sequence[RolloutRow]) -> list[bool]:
        """`put_produced` for a generation batch, in one transaction (one fsync)."""
        out = []
        with self._write() as c:
            for row in rows:
                entry = LedgerEntry(row.received_at, "out", "produced", "rollout", row.rollout_id)
                new = self._insert_rollout(c, self._rollout_params(row))
                if new:
                    self._insert_ledger(c, [self._ledger_params(entry)])
                out.append(new)
        return out
