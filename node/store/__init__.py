"""Durable storage of one peer, in one SQLite file.

The code is organized as follows:

- `store.py`: `Store`: rollouts, verdicts, peer scores and bans, and the ledger.
- `schema.py`: the schema, row types and checks.
- `ledger.py`: the ledger, peer scores and bans, and never-repeating counters.
- `retention.py`: how long the store keeps what, and its size bound.
- `writer.py`: the batched writer between admission and the store.
- `ledger_writer.py`: penalties made durable: scores first, then the ledger lines.
"""
