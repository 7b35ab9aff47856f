"""Nothing produced is lost to the network, one test per way to lose it, on real peers
(py-libp2p on loopback, SQLite stores): work published while the receiver was down is
caught up and receipted; pulls owed at a crash are pulled after restart; the dedup memory
and penalties survive a restart. (Message-id reuse after a restart: tests/test_node_host.py.)"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from node.peer.peer import PeerConfig, open_peer
from node.store.store import RolloutRow, Store
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import Kind
from protocol.codec import decode
from protocol.identity import Identity
from protocol.rollout import open_record
from protocol.wire import RolloutRecord
from tests.support import polling

pytestmark = pytest.mark.network


def _cfg(tmp: Path, name: str, manifest, ident: Identity | None = None, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest, identity=ident or Identity.generate(), data_dir=tmp / name, **kw
    )


until = functools.partial(polling.until, timeout=30.0)


def _bodies(store: Store) -> set[bytes]:
    return {r.rollout_id for r in store.rollouts(with_body=True, limit=100_000)}


async def test_work_stored_while_no_trainer_listened_is_caught_up_and_receipted(
    tmp_path: Path,
) -> None:
    """Findings 2 and 3: rollouts stored by a worker but never announced to the trainer (it
    was down, or the outbox died with the worker) reach it once it (re)joins, and the
    worker's own accounting says they were delivered."""
    manifest = net_manifest("catchup")
    worker_cfg = _cfg(tmp_path, "w", manifest, roles=("inference",), pull_bodies=False)
    async with open_peer(worker_cfg) as w:
        ids = [
            await w.produce(synthetic_record(w.identity, manifest, i, n_completion=64))
            for i in range(6)
        ]
        boot = (w.host.listen_addrs()[0],)
        trainer_cfg = _cfg(tmp_path, "t", manifest, roles=("trainer",), bootstrap=boot)
        async with open_peer(trainer_cfg) as t:
            await until("the trainer holds every body", lambda: set(ids) <= _bodies(t.store))
            await until(
                "the worker holds receipts", lambda: w.store.delivery_status()["delivered"] == 6
            )
        status = w.store.delivery_status()
        assert status == {"produced": 6, "delivered": 6, "pending": 0, "too_stale": 0}
        # The worker's status (and /metrics) carry what became of its work, as `status` shows it.
        await until(
            "the worker accounts its work",
            lambda: w.stats()["delivery"].get("delivered") == 6,
            timeout=15,
        )
        work = w.stats()["delivery"]
        assert work["produced"] == 6 and work["audited"] == 0, work
        assert work["awaiting_audit"] + work["trained_unaudited"] == 6, work


async def test_a_pull_owed_at_a_crash_is_pulled_after_restart(tmp_path: Path) -> None:
    """A stored header without a body is pulled again when the peer starts."""
    manifest = net_manifest("owed")
    async with open_peer(
        _cfg(tmp_path, "w", manifest, roles=("inference",), pull_bodies=False)
    ) as w:
        record = synthetic_record(w.identity, manifest, 0, n_completion=64)
        rid = await w.produce(record)
        opened = open_record(record)
        with Store.open(tmp_path / "t") as s:  # what the trainer had at its crash: header only
            s.put_rollout(
                RolloutRow(
                    rid,
                    manifest.run_id,
                    opened.envelope.signer,
                    0,
                    decode(RolloutRecord, record).header,
                    None,
                    time.time(),
                )
            )
        cfg = _cfg(
            tmp_path, "t", manifest, roles=("trainer",), bootstrap=(w.host.listen_addrs()[0],)
        )
        async with open_peer(cfg) as t:
            assert t.counters["pulls_restored"] == 1, dict(t.counters)
            await until("the owed body", lambda: rid in _bodies(t.store))


async def test_copies_of_what_was_held_before_a_restart_are_duplicates(tmp_path: Path) -> None:
    """After a restart the dedup memory is rebuilt from the store: a header the
    peer already held is a duplicate (not admitted again, its body not pulled again)."""
    manifest = net_manifest("dedup")
    producer = Identity.generate()
    record = synthetic_record(producer, manifest, 0, n_completion=64)
    cfg = _cfg(tmp_path, "t", manifest, roles=("trainer",))
    async with open_peer(cfg) as t:
        assert (await t.admit(producer.peer_id_b58, Kind.ROLLOUT_RECORD, record)).accepted
        await until("stored", lambda: t.counters["stored_rollout_record"] == 1)
    header = decode(RolloutRecord, record).header
    async with open_peer(cfg) as again:
        assert not (await again.admit(producer.peer_id_b58, Kind.ROLLOUT_HEADER, header)).accepted
        assert again.rejects["duplicate"] == 1
        assert not (await again.admit(producer.peer_id_b58, Kind.ROLLOUT_RECORD, record)).accepted
        accepted = again.store.ledger(direction="in", outcome="accepted", limit=100)
        assert len(accepted) == 1


async def test_a_penalty_is_saved_with_its_ledger_line(tmp_path: Path) -> None:
    """A penalty survives a crash right after it: the score is written before the ledger
    line that explains it (not on a timer)."""
    manifest = net_manifest("score")
    offender = Identity.generate().peer_id_b58
    async with open_peer(_cfg(tmp_path, "t", manifest, roles=("trainer",))) as t:
        assert not (await t.admit(offender, Kind.ROLLOUT_HEADER, b"\xc1junk")).accepted
        reader = Store.open(tmp_path / "t")  # another connection: what a crash would leave
        try:
            await until(
                "the ledger line", lambda: reader.ledger(direction="in", outcome="rejected")
            )
            scores = {r.peer: r.score for r in reader.load_peers()}
            assert scores.get(offender, 0.0) < 0
        finally:
            reader.close()
