"""Durable storage of one peer, in one SQLite file.

The code is organized as follows:

- `store.py`: `Store`: rollouts, verdicts, peer scores and bans, and the ledger.
- `schema.py`: the schema, row types and checks.
- `ledger.py`: the ledger, peer scores and bans, and never-repeating counters.
- `retention.py`: how long the store keeps what, and its size bound.
- `writer.py`: the batched writer between admission and the store.
- `ledger_writer.py`: penalties made durable: scores first, then the ledger lines.

The store's data API is re-exported here; the two writers (trio tasks) are imported from
their modules.
"""

from node.store.retention import RetentionReport
from node.store.store import (
    DB_FILENAME,
    SCHEMA_VERSION,
    LedgerEntry,
    RolloutRow,
    Store,
    StoreError,
    VerdictRow,
    rollout_row,
    verdict_row,
)

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "LedgerEntry",
    "RetentionReport",
    "RolloutRow",
    "Store",
    "StoreError",
    "VerdictRow",
    "rollout_row",
    "verdict_row",
]
