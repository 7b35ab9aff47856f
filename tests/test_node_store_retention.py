"""Retention: the store stays within `store.max_bytes` however long the node runs, keeps
what is still needed, and a crash in the middle of a prune leaves a consistent file."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from node.store.store import DB_FILENAME, LedgerEntry, RolloutRow, Store
from protocol.peer_score import PeerRecord

T0 = 1_700_000_000.0
OWN = b"own-peer"


def _rollout(i: int, version: int, *, own: bool = False, size: int = 3000) -> RolloutRow:
    return RolloutRow(
        rollout_id=i.to_bytes(32, "big"),
        run_id="run",
        producer=OWN if own else b"other-%d" % (i % 7),
        policy_version=version,
        header=b"h" * 200,
        body=os.urandom(size),
        received_at=T0 + i,
        source_peer=None if own else "relay",
    )


def _files_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(DB_FILENAME + "*"))


def test_the_store_stays_within_max_bytes_and_keeps_what_is_needed(tmp_path: Path) -> None:
    max_bytes = 2_000_000
    per_round = 150 * 3300  # what arrives between two retention runs
    own: list[bytes] = []
    changed = False
    with Store.open(tmp_path) as store:
        store.save_peers([PeerRecord("banned-one", -150.0, T0, T0 + 10**9, 3)])
        i = 0
        for version in range(40):
            for _ in range(150):
                i += 1
                store.put_rollout(_rollout(i, version))
            i += 1
            store.put_produced(_rollout(i, version, own=True))
            own.append(i.to_bytes(32, "big"))
            store.log_many(
                LedgerEntry(T0 + i, "in", "rejected", "rollout_header", None, "x", "duplicate")
                for _ in range(100)
            )
            report = store.enforce_retention(
                T0 + i, below_version=version - 2, keep_s=60.0, max_bytes=max_bytes
            )
            assert not report.over_budget
            assert _files_bytes(store.path) <= max_bytes + 2 * per_round, (version, report)
            changed = changed or report.changed
        assert changed
        # Our own rollouts no trainer acknowledged are all still there, and so is the ban.
        assert all(store.has_rollout(rid) for rid in own)
        assert [r.peer for r in store.active_bans(T0 + 10**6)] == ["banned-one"]
        # The ledger lines compacted away are still counted.
        assert store.ledger_summary("in")[("in", "rejected", "duplicate")] == 40 * 100
        # Acknowledged own work may go once it is stale.
        store.mark_delivered(own[:10], "trainer", T0 + i)
        store.enforce_retention(T0 + i + 1000, below_version=40, keep_s=60.0)
        assert not any(store.has_rollout(rid) for rid in own[:10])
        assert all(store.has_rollout(rid) for rid in own[10:])
        store.check()


_FILL_AND_PRUNE = """
import sys, time
from node.store.store import LedgerEntry, Store
store = Store.open(sys.argv[1])
store.log_many(LedgerEntry(1.0 + k, "in", "rejected", "rollout_header", None, "x", "malformed")
               for k in range(400_000))
print("filled", flush=True)
while True:
    store.enforce_retention(10**6, below_version=0, keep_s=0.0)
"""


def test_a_crash_in_the_middle_of_a_prune_loses_no_count(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _FILL_AND_PRUNE, str(tmp_path)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "filled"
        watch = sqlite3.connect(tmp_path / DB_FILENAME, timeout=10.0)
        deadline = time.monotonic() + 30
        while not watch.execute("SELECT count(*) FROM ledger_totals").fetchone()[0]:
            assert time.monotonic() < deadline, "the prune never started"
            time.sleep(0.005)
        watch.close()
        proc.send_signal(signal.SIGKILL)  # inside the compaction (about 1 s for all of it)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store.open(tmp_path) as store:
        store.check()
        # Every line is either still there or counted in the totals, never both or neither.
        assert store.ledger_summary("in")[("in", "rejected", "malformed")] == 400_000
        left = len(store.ledger(direction="in", limit=400_000))
        assert 0 < left < 400_000, "the kill did not land inside the compaction"
