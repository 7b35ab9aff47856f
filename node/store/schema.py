"""The store's schema, row types and checks (`node.store.store` uses them).

The tables, their version and the migrations that take an older file to the current
version; the rows the store reads and writes (`RolloutRow`, `VerdictRow`, `LedgerEntry`);
the column lists and the argument checks shared by the store's parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from node.errors import CommandError
from protocol.admission import Admitted
from protocol.peer_score import PeerId

APPLICATION_ID = 0x53574E44  # "SWND" in the SQLite header: this file is ours
SCHEMA_VERSION = 5

# MIGRATIONS[n] takes a database at schema version n - 1 to version n. Append, never edit.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE rollouts (
            rollout_id     BLOB PRIMARY KEY,
            run_id         TEXT NOT NULL,
            producer       NOT NULL,          -- peer id, bytes or str
            policy_version INTEGER NOT NULL,
            header         BLOB NOT NULL,     -- signed header envelope, as received
            body           BLOB,              -- encoded body; NULL until pulled
            received_at    REAL NOT NULL,
            source_peer                       -- who sent it; NULL when produced here
        )""",
        "CREATE INDEX rollouts_run_version ON rollouts(run_id, policy_version)",
        "CREATE INDEX rollouts_received ON rollouts(received_at)",
        "CREATE INDEX rollouts_producer ON rollouts(producer)",
        """CREATE TABLE verdicts (
            verdict_id  BLOB PRIMARY KEY,
            rollout_id  BLOB NOT NULL,
            validator   NOT NULL,
            accepted    INTEGER NOT NULL,
            reason      TEXT,
            envelope    BLOB NOT NULL,
            received_at REAL NOT NULL
        )""",
        "CREATE INDEX verdicts_rollout ON verdicts(rollout_id)",
        """CREATE TABLE peers (
            peer         PRIMARY KEY,
            score        REAL NOT NULL,
            updated_at   REAL NOT NULL,
            banned_until REAL NOT NULL DEFAULT 0,
            offences     INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE ledger (
            seq       INTEGER PRIMARY KEY AUTOINCREMENT,
            at        REAL NOT NULL,
            direction TEXT NOT NULL CHECK (direction IN ('out', 'in')),
            outcome   TEXT NOT NULL CHECK (outcome IN ('produced', 'accepted', 'rejected')),
            kind      TEXT NOT NULL,
            item_id   BLOB,
            peer,
            reason    TEXT,
            detail    TEXT
        )""",
        "CREATE INDEX ledger_at ON ledger(at)",
        "CREATE INDEX ledger_item ON ledger(item_id)",
    ),
    2: (
        """CREATE TABLE counters (
            name  TEXT PRIMARY KEY,
            value INTEGER NOT NULL              -- the next unreserved number
        )""",
    ),
    3: (
        """CREATE TABLE deliveries (
            rollout_id BLOB PRIMARY KEY,        -- one of our own rollouts
            state      TEXT NOT NULL CHECK (state IN ('delivered', 'too_stale')),
            peer,                               -- the trainer that holds it (delivered)
            at         REAL NOT NULL,
            reason     TEXT
        )""",
        "CREATE INDEX rollouts_missing_body ON rollouts(received_at) WHERE body IS NULL",
    ),
    4: (
        """CREATE TABLE ledger_totals (  -- ledger lines compacted away, counted
            direction TEXT NOT NULL,
            outcome   TEXT NOT NULL,
            reason    TEXT NOT NULL,        -- '' for none
            n         INTEGER NOT NULL,
            PRIMARY KEY (direction, outcome, reason)
        )""",
    ),
    5: (
        """CREATE TABLE equivocations (  -- evidence: one key, two objects of one slot
            evidence_id BLOB PRIMARY KEY,   -- hash of the two envelopes
            signer      BLOB NOT NULL,
            kind        TEXT NOT NULL,
            slot        TEXT NOT NULL,
            first       BLOB NOT NULL,      -- the two signed envelopes, in byte order
            second      BLOB NOT NULL,
            found_at    REAL NOT NULL,
            found_here  INTEGER NOT NULL    -- 1: both objects reached us; 0: gossiped
        )""",
    ),
}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


class StoreError(CommandError):
    """The database cannot be opened or used; the message names the file and what to do."""


@dataclass(frozen=True, slots=True)
class RolloutRow:
    """A stored rollout: its signed header envelope and, once pulled, its body."""

    rollout_id: bytes
    run_id: str
    producer: PeerId
    policy_version: int
    header: bytes
    body: bytes | None
    received_at: float
    source_peer: PeerId | None = None


@dataclass(frozen=True, slots=True)
class VerdictRow:
    """A stored verdict on a rollout, with its signed envelope."""

    verdict_id: bytes
    rollout_id: bytes
    validator: PeerId
    accepted: bool
    envelope: bytes
    received_at: float
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One line of the ledger.

    direction "out": this peer's own work: outcome "produced" when made, then "accepted" or
    "rejected" (with the validator as `peer` and its reason) when a verdict about it arrives.
    direction "in": what others sent us: "accepted" or "rejected" by admission (`reason` is
    the admission reason, `peer` the sender).
    """

    at: float
    direction: str
    outcome: str
    kind: str
    item_id: bytes | None = None
    peer: PeerId | None = None
    reason: str | None = None
    detail: str | None = None
    seq: int | None = None  # set when read back


ROLLOUT_COLS = (
    "rollout_id, run_id, producer, policy_version, header, body, received_at, source_peer"
)
VERDICT_COLS = "verdict_id, rollout_id, validator, accepted, envelope, received_at, reason"
LEDGER_COLS = "at, direction, outcome, kind, item_id, peer, reason, detail, seq"


def rollout_from_row(row: tuple) -> RolloutRow:
    """A `RolloutRow` from a row selected with `ROLLOUT_COLS`."""
    return RolloutRow(*row)


def verdict_from_row(row: tuple) -> VerdictRow:
    """A `VerdictRow` from a row selected with `VERDICT_COLS`."""
    v = list(row)
    v[3] = bool(v[3])
    return VerdictRow(*v)


def check_peer(peer: object, what: str = "peer id") -> None:
    """Raise TypeError unless `peer` is a peer id (bytes or str)."""
    if not isinstance(peer, bytes | str):
        raise TypeError(f"{what} must be bytes or str, not {type(peer).__name__}")


def check_time(t: float, what: str = "time") -> None:
    """Raise ValueError unless `t` is a finite number of seconds."""
    if not isinstance(t, int | float) or not math.isfinite(t):
        raise ValueError(f"{what} must be a finite number of seconds")


def rollout_row(item: Admitted) -> RolloutRow:
    """The row an admitted rollout header or record becomes."""
    if item.header is None:
        raise ValueError(f"{item.kind} item carries no rollout header")
    return RolloutRow(
        rollout_id=item.content_id,
        run_id=item.envelope.run_id,
        producer=item.envelope.signer,
        policy_version=item.envelope.policy_version,
        header=item.header,
        body=item.body,
        received_at=item.received_at,
        source_peer=item.sender,
    )


def verdict_row(item: Admitted) -> VerdictRow:
    """The row an admitted verdict becomes."""
    v = item.obj
    return VerdictRow(
        verdict_id=item.content_id,
        rollout_id=v.rollout_id,
        validator=item.envelope.signer,
        accepted=bool(v.passed),
        envelope=item.data,
        received_at=item.received_at,
        reason=v.reason,
    )
