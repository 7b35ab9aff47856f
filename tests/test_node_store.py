"""The node's SQLite store: durability under kill -9, bans across restarts, ledger, errors."""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from node.store.store import (
    DB_FILENAME,
    SCHEMA_VERSION,
    LedgerEntry,
    RolloutRow,
    Store,
    StoreError,
    VerdictRow,
)
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Ban,
    Disconnect,
    Kind,
    MessageReceived,
    PeerConnected,
    Reject,
    RunRules,
)
from protocol.admission import (
    Store as StoreAction,
)
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.peer_score import PeerRecord, PeerScores, ScoreConfig
from protocol.rollout import make_record
from protocol.wire import RolloutBody, RolloutRecord, Verdict

ROOT = Path(__file__).resolve().parent.parent
ALICE = Identity.from_private_bytes(bytes(range(32)))
VALIDATOR = Identity.from_private_bytes(bytes(range(5, 37)))
T0 = 1_700_000_000.0


def row(i: int, *, version: int = 3, run: str = "run", body: bytes | None = b"body") -> RolloutRow:
    return RolloutRow(
        rollout_id=i.to_bytes(32, "big"),
        run_id=run,
        producer=b"producer-%d" % (i % 3),
        policy_version=version,
        header=b"header-%d" % i,
        body=body,
        received_at=T0 + i,
        source_peer="relay" if i % 2 else None,
    )


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data")
    yield s
    s.close()


# -- kill -9 durability -------------------------------------------------------------------

_CHILD = r"""
import sys
from node.store.store import RolloutRow, Store
store = Store.open(sys.argv[1])
for i in range(int(sys.argv[2])):
    body = bytes([i % 251]) * 20_000  # about the size of a real rollout body
    store.put_rollout(RolloutRow(i.to_bytes(8, "big"), "run", b"p", i, b"h%d" % i, body, float(i)))
    print(i, flush=True)  # the ack: only after put_rollout returned
"""


def test_every_acked_record_survives_kill_9(tmp_path):
    data_dir = tmp_path / "data"
    n = 100_000  # far more than it can write before the kill
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data_dir), str(n)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    acked: list[int] = []
    buf = b""
    deadline = time.monotonic() + 30.0
    try:
        # Kill it mid-stream, once it has acked a fair number of records.
        while len(acked) < 60 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                acked += [int(x) for x in lines]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        rest = proc.stdout.read()  # acks already in the pipe when it died count too
        lines = (buf + rest).split(b"\n")
        acked += [int(x) for x in lines[:-1]]  # the last piece may be a half-written line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(acked) >= 60, "the writer made no progress"
    assert acked == list(range(len(acked)))
    with Store.open(data_dir) as s:
        s.check()
        for i in acked:
            r = s.get_rollout(i.to_bytes(8, "big"))
            assert r is not None, f"acked record {i} lost"
            assert r.body == bytes([i % 251]) * 20_000 and r.policy_version == i
        assert s.count_rollouts() >= len(acked)


def test_wal_and_full_sync_are_on(store):
    with store._read() as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


# -- rollouts and verdicts ----------------------------------------------------------------


def test_rollouts_round_trip_and_queries(store):
    assert store.put_rollout(row(1)) is True
    assert store.put_rollout(row(1)) is False  # idempotent
    assert all(store.put_rollout(row(i, version=i)) for i in range(2, 8))
    assert store.get_rollout((1).to_bytes(32, "big")) == row(1)
    assert store.has_rollout((2).to_bytes(32, "big"))
    assert not store.has_rollout(b"\x00" * 32)
    assert store.count_rollouts() == 7 and store.count_rollouts("run") == 7
    got = store.rollouts(run_id="run", min_version=4, max_version=6)
    assert [r.policy_version for r in got] == [4, 5, 6]
    assert [r.rollout_id for r in store.rollouts(producer=b"producer-1")] == [
        (i).to_bytes(32, "big") for i in (1, 4, 7)
    ]
    assert len(store.rollouts(limit=2)) == 2
    # Stale rows go, except our own (no source peer) that no trainer acknowledged.
    report = store.enforce_retention(T0 + 100, below_version=5, keep_s=0)
    assert report.rollouts_deleted == 2 and store.count_rollouts() == 5
    assert store.has_rollout((2).to_bytes(32, "big")) and not store.has_rollout(
        (3).to_bytes(32, "big")
    )


def test_known_signers_are_the_producers_stored_since(store):
    for i in range(1, 7):  # producers 0, 1, 2 (i % 3)
        store.put_rollout(row(i))
    assert set(store.known_signers(since=T0)) == {b"producer-0", b"producer-1", b"producer-2"}
    assert store.known_signers(since=T0 + 5.5) == [b"producer-0"]  # only row 6 is that new
    assert len(store.known_signers(since=T0, limit=2)) == 2


def test_header_first_body_later(store):
    rid = (9).to_bytes(32, "big")
    assert store.put_rollout(row(9, body=None))
    assert store.rollouts(with_body=True) == []
    assert store.put_rollout(row(9, body=b"pulled")) is False
    assert store.put_rollout(row(9, body=b"again")) is False
    assert store.get_rollout(rid).body == b"pulled"
    # A record arriving for a header stored without body fills it in.
    assert store.put_rollout(row(10, body=None))
    assert store.put_rollout(row(10, body=b"full")) is False
    assert store.get_rollout((10).to_bytes(32, "big")).body == b"full"


def test_produced_batches_and_ids_with_bodies(store):
    assert store.put_produced_many([row(1), row(2), row(3, body=None)]) == [True, True, True]
    assert store.put_produced_many([row(2), row(4)]) == [False, True]
    assert sorted(store.rollout_ids_with_body()) == [i.to_bytes(32, "big") for i in (1, 2, 4)]
    assert sorted(store.rollout_ids_with_body(producer=b"producer-1")) == [
        i.to_bytes(32, "big") for i in (1, 4)
    ]
    produced = store.ledger(direction="out", outcome="produced")
    assert sorted(e.item_id for e in produced) == [i.to_bytes(32, "big") for i in (1, 2, 3, 4)]


def test_peer_ids_keep_their_type(store):
    store.put_rollout(row(1))  # producer bytes, source_peer str
    r = store.get_rollout((1).to_bytes(32, "big"))
    assert isinstance(r.producer, bytes) and isinstance(r.source_peer, str)
    with pytest.raises(TypeError):
        store.put_rollout(RolloutRow(b"x", "run", 42, 1, b"h", None, T0))  # type: ignore[arg-type]


def test_verdicts(store):
    v = VerdictRow(b"v1", b"r1", b"val", False, b"env", T0, "bad_proof")
    assert store.put_verdict(v) and not store.put_verdict(v)
    assert store.verdicts_for(b"r1") == [v]


def test_threads_may_share_a_store(store):
    def work(k: int) -> None:
        for i in range(25):
            store.put_rollout(row(k * 1000 + i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert store.count_rollouts() == 100


# -- bans survive a restart ---------------------------------------------------------------


def test_ban_from_admission_survives_restart(tmp_path):
    cfg = ScoreConfig(ban_threshold=-25.0, ban_base_s=3600.0)
    rules = RunRules("run", max_staleness=2)
    with Store.open(tmp_path) as s:
        a = Admission(rules, AdmissionConfig(), scores=PeerScores(cfg, s.load_peers()))
        ban = None
        for i in range(10):
            for action in a.handle(MessageReceived(b"evil", Kind.ROLLOUT_HEADER, b"junk", T0 + i)):
                if isinstance(action, Reject):
                    s.log_rejects([(action, T0 + i)])
                if isinstance(action, Ban):
                    s.save_peer(action.record)
                    ban = action
            if ban:
                break
        assert ban is not None
    # A new process: the ban is read back and still holds.
    with Store.open(tmp_path) as s:
        assert [r.peer for r in s.active_bans(T0 + 100)] == [b"evil"]
        assert s.active_bans(ban.until + 1) == []
        a = Admission(rules, scores=PeerScores(cfg, s.load_peers()))
        assert a.handle(PeerConnected(b"evil", T0 + 100)) == [Disconnect(b"evil", "banned")]
        assert a.handle(PeerConnected(b"evil", ban.until + 1)) == []
        summary = s.ledger_summary("in")
        assert summary[("in", "rejected", "malformed")] == i + 1


def test_peer_records_replace(store):
    store.save_peer(PeerRecord("p", -5.0, T0, 0.0, 0))
    store.save_peers([PeerRecord("p", -50.0, T0 + 1, T0 + 99, 2), PeerRecord(b"q", 1.0, T0, 0, 0)])
    assert sorted(store.load_peers(), key=lambda r: isinstance(r.peer, bytes)) == [
        PeerRecord("p", -50.0, T0 + 1, T0 + 99, 2),
        PeerRecord(b"q", 1.0, T0, 0.0, 0),
    ]


# -- the ledger ---------------------------------------------------------------------------


def _body(seed: int = 1) -> RolloutBody:
    return RolloutBody(
        prompt_ids=(1, 2),
        completion_ids=(3, 4),
        logprobs=(-0.5, -0.25),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=2,
        sampling_seed=seed,
        finish_reason="length",
        proofs=(bytes(258),),
    )


def _verdict(rollout_id: bytes, passed: bool, seq: int) -> bytes:
    v = Verdict(
        rollout_id=rollout_id,
        producer=ALICE.peer_id,
        passed=passed,
        reason="ok" if passed else "bad_proof",
        reward_rescored=1.0,
        metrics=(),
    )
    return seal(VALIDATOR, v, run_id="run", policy_version=5, seq=seq, timestamp_ms=int(T0 * 1000))


def test_ledger_of_own_work_and_admitted_items(store):
    # This peer (ALICE) produced three rollouts.
    recs = [
        make_record(
            ALICE,
            _body(),
            dataset="d",
            task_index=i,
            counter=i,
            task_seed=i,
            reward=1.0,
            run_id="run",
            policy_version=5,
            seq=i,
            timestamp_ms=int(T0 * 1000),
        )
        for i in range(3)
    ]
    ids = []
    for i, rec in enumerate(recs):
        r = decode(RolloutRecord, rec)
        ids.append(content_id(r.header))
        assert store.put_produced(
            RolloutRow(ids[-1], "run", ALICE.peer_id, 5, r.header, r.body, T0 + i)
        )
    # A validator's verdicts come in through admission: one pass, one fail.
    a = Admission(RunRules("run", 2, validator_keys=frozenset({VALIDATOR.peer_id})), version=5)
    for seq, (rid, passed) in enumerate([(ids[0], True), (ids[1], False)]):
        actions = a.handle(
            MessageReceived(VALIDATOR.peer_id, Kind.VERDICT, _verdict(rid, passed, seq), T0 + 10)
        )
        assert isinstance(actions[0], StoreAction)
        assert store.put_admitted(actions[0].item, own_peer=ALICE.peer_id)
        assert not store.put_admitted(actions[0].item, own_peer=ALICE.peer_id)  # idempotent
    assert store.produced_status() == {"produced": 3, "accepted": 1, "rejected": 1, "pending": 1}
    rejected = store.ledger(direction="out", outcome="rejected")
    assert [(e.item_id, e.peer, e.reason) for e in rejected] == [
        (ids[1], VALIDATOR.peer_id, "bad_proof")
    ]
    assert len(store.verdicts_for(ids[1])) == 1
    # An admitted header from someone else lands in rollouts and the "in" ledger.
    other = make_record(
        VALIDATOR,
        _body(),
        dataset="d",
        task_index=9,
        counter=9,
        task_seed=9,
        reward=0.0,
        run_id="run",
        policy_version=5,
        seq=99,
        timestamp_ms=int(T0 * 1000),
    )
    actions = a.handle(
        MessageReceived(b"relay", Kind.ROLLOUT_HEADER, decode(RolloutRecord, other).header, T0 + 11)
    )
    assert store.put_admitted(actions[0].item)
    stored = store.get_rollout(actions[0].item.content_id)
    assert stored.body is None and stored.source_peer == b"relay"
    assert stored.producer == VALIDATOR.peer_id
    accepted_in = store.ledger(direction="in", outcome="accepted")
    assert [e.kind for e in accepted_in] == ["verdict", "verdict", "rollout_header"]
    assert [e.seq for e in store.ledger(since=T0 + 10)] == sorted(
        e.seq for e in store.ledger(since=T0 + 10)
    )
    compacted = store.enforce_retention(T0 + 12 + 3600, below_version=0, keep_s=3600)
    assert compacted.ledger_compacted == 3  # the "in" lines, now counted as totals
    assert store.ledger(direction="in") == []
    assert store.ledger_summary("in") == {("in", "accepted", None): 3}
    # Our own work's lines stay: its status is unchanged.
    assert store.produced_status() == {"produced": 3, "accepted": 1, "rejected": 1, "pending": 1}


def test_ledger_refuses_unknown_words(store):
    with pytest.raises(ValueError):
        store.log(LedgerEntry(T0, "sideways", "produced", "rollout"))
    with pytest.raises(ValueError):
        store.log(LedgerEntry(T0, "in", "maybe", "rollout"))


# -- schema versions and damaged files ----------------------------------------------------


def test_schema_version_is_recorded_and_reopening_is_idempotent(tmp_path):
    with Store.open(tmp_path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        s.put_rollout(row(1))
    with Store.open(tmp_path) as s:
        assert s.schema_version() == SCHEMA_VERSION and s.count_rollouts() == 1


def test_counters_never_repeat_across_restarts(tmp_path):
    with Store.open(tmp_path) as s:
        assert s.reserve("seq", 1000) == 0
        assert s.reserve("seq", 1000) == 1000
        assert s.reserve("other") == 0
    with Store.open(tmp_path) as s:
        assert s.reserve("seq") == 2000
        with pytest.raises(ValueError):
            s.reserve("seq", 0)


def test_version_1_database_is_migrated(tmp_path):
    from node.store.store import APPLICATION_ID, MIGRATIONS

    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    for stmt in MIGRATIONS[1]:
        conn.execute(stmt)
    conn.execute(
        "INSERT INTO rollouts VALUES (?,?,?,?,?,?,?,?)",
        (b"r", "run", b"p", 1, b"h", None, T0, None),
    )
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with Store.open(tmp_path) as s:
        assert s.schema_version() == SCHEMA_VERSION == 5
        assert s.ledger_summary() == {}  # the compacted totals table exists
        assert s.equivocations() == []  # and the evidence table
        assert s.delivery_status()["produced"] == 0
        assert s.has_rollout(b"r")
        assert s.reserve("seq") == 0


def test_newer_schema_is_refused_clearly(tmp_path):
    Store.open(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this swarm-node"):
        Store.open(tmp_path)


def test_garbage_file_is_refused_clearly(tmp_path):
    (tmp_path / DB_FILENAME).write_bytes(b"this is not a database " * 200)
    with pytest.raises(StoreError, match="corrupt or not an SQLite file") as e:
        Store.open(tmp_path)
    assert e.value.exit_code == 2


def test_another_programs_database_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.execute("CREATE TABLE stuff (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="another program"):
        Store.open(tmp_path)


def test_directory_in_place_of_the_file(tmp_path):
    (tmp_path / DB_FILENAME).mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        Store.open(tmp_path)


def test_damaged_pages_give_store_errors_only(tmp_path):
    with Store.open(tmp_path) as s:
        for i in range(200):
            s.put_rollout(row(i, body=os.urandom(3000)))
    path = tmp_path / DB_FILENAME
    size = path.stat().st_size
    assert size > 100_000
    with open(path, "r+b") as f:  # scribble over pages in the middle of the file
        f.seek(size // 3)
        f.write(b"\xff" * 20_000)
    with pytest.raises(StoreError):
        s = Store.open(tmp_path)
        try:
            s.check()
            s.rollouts(limit=1000)
        finally:
            s.close()


def test_closed_store_says_so(tmp_path):
    s = Store.open(tmp_path)
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.count_rollouts()


def test_batched_admitted_items_and_rejects(store):
    a = Admission(RunRules("run", 2), version=5)
    items, rejects = [], []
    for i in range(20):
        rec = make_record(
            ALICE,
            _body(i),
            dataset="d",
            task_index=i,
            counter=i,
            task_seed=i,
            reward=0.0,
            run_id="run",
            policy_version=5,
            seq=i,
            timestamp_ms=int(T0 * 1000),
        )
        items.append(a.handle(MessageReceived(b"relay", Kind.ROLLOUT_RECORD, rec, T0))[0].item)
        rejects += [
            (x, T0 + i)
            for x in a.handle(MessageReceived(b"junk%d" % i, Kind.VERDICT, b"junk", T0))
            if isinstance(x, Reject)
        ]
    assert store.put_admitted_many(items) == [True] * 20
    assert store.put_admitted_many(items[:3]) == [False] * 3
    assert store.count_rollouts() == 20 and all(r.body for r in store.rollouts())
    store.log_rejects(rejects)
    assert store.ledger_summary("in")[("in", "rejected", "malformed")] == 20
    bad = dataclasses.replace(items[0], kind=Kind.WEIGHT_ANNOUNCE)
    with pytest.raises(ValueError):
        store.put_admitted_many([items[0], bad])  # checked before anything is written


def test_equivocation_evidence_is_kept_once_and_read_back(tmp_path):
    from protocol.equivocation import evidence
    from tests.test_protocol_equivocation import TRAINER, _sealed, manifest

    ev = evidence(
        _sealed(TRAINER, manifest(2, b"a" * 32)), _sealed(TRAINER, manifest(2, b"b" * 32))
    )
    with Store.open(tmp_path) as s:
        assert s.put_equivocation(ev, T0, True)
        assert not s.put_equivocation(ev, T0 + 1, False)
    with Store.open(tmp_path) as s:
        [(first, second, at, here)] = s.equivocations()
        assert evidence(first, second) == ev and at == T0 and here
