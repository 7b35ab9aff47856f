"""Between the wire and the disk: a slow store never loses an admitted item or charges
anyone twice, and our own store failing is never blamed on a peer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

import node.peer.peer as peer_module
from node.host.host import Later
from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import Kind
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.wire import RolloutRecord

pytestmark = pytest.mark.network


def _cfg(tmp: Path, name: str, manifest) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest,
        identity=Identity.generate(),
        data_dir=tmp / name,
        roles=("relay",),
        pull_bodies=False,
    )


async def test_a_write_slower_than_the_validator_deadline_still_delivers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_module, "STORE_WAIT_S", 0.2)
    manifest = net_manifest("slow-store")
    producer = Identity.generate()
    async with open_peer(_cfg(tmp_path, "t", manifest)) as peer:
        delivered: list[bytes] = []
        peer.on_deliver(lambda item: delivered.append(item.content_id))
        real = peer.store.put_admitted_many

        def slow(*a, **k):  # type: ignore[no-untyped-def]
            time.sleep(0.6)  # in the writer's thread
            return real(*a, **k)

        peer.store.put_admitted_many = slow  # type: ignore[method-assign]
        header = decode(RolloutRecord, synthetic_record(producer, manifest, 0)).header
        check = peer._validator(Kind.ROLLOUT_HEADER)
        t0 = time.monotonic()
        answer = await check(producer.peer_id_b58, header, producer.peer_id_b58)
        assert time.monotonic() - t0 < 0.1  # the validator never waits on the disk
        assert isinstance(answer, Later)
        assert not await answer.wait()  # not forwarded: the write outlasted the deadline
        assert peer.counters["forward_store_late"] == 1
        with trio.fail_after(5):
            while not delivered:
                await trio.sleep(0.05)
        rid = content_id(header)
        assert delivered == [rid] and peer.store.has_rollout(rid)
        # The same header again is a duplicate: not delivered twice, nobody charged.
        peer.store.put_admitted_many = real  # type: ignore[method-assign]
        handled = await peer.admit(producer.peer_id_b58, Kind.ROLLOUT_HEADER, header)
        assert handled.duplicate and not handled.accepted
        assert delivered == [rid]
        assert peer.admission.scores.score(producer.peer_id_b58, time.time()) >= 0


async def test_our_store_failing_costs_the_sender_nothing(tmp_path: Path) -> None:
    manifest = net_manifest("broken-store")
    producer, sender = Identity.generate(), Identity.generate().peer_id_b58
    async with open_peer(_cfg(tmp_path, "t", manifest)) as peer:

        def broken(*a, **k):  # type: ignore[no-untyped-def]
            raise ValueError("disk full")

        real = peer.store.put_admitted_many
        peer.store.put_admitted_many = broken  # type: ignore[method-assign]
        peer.store.put_admitted = broken  # type: ignore[method-assign]
        record = synthetic_record(producer, manifest, 0)
        before = peer.admission.scores.score(sender, time.time())
        handled = await peer.admit(sender, Kind.ROLLOUT_RECORD, record)
        assert handled.store_failed and not handled.accepted
        assert peer.admission.scores.score(sender, time.time()) >= before
        peer.store.put_admitted_many = real  # type: ignore[method-assign]
        del peer.store.put_admitted
        assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, record)).accepted  # admitted again


async def test_the_peers_upkeep_prunes_stale_rollouts(tmp_path: Path) -> None:
    manifest = net_manifest("retention")  # max_staleness 2
    producer = Identity.generate()
    async with open_peer(_cfg(tmp_path, "t", manifest)) as peer:
        for counter in range(5):
            record = synthetic_record(producer, manifest, counter, n_completion=16)
            assert (await peer.admit(producer.peer_id_b58, Kind.ROLLOUT_RECORD, record)).accepted
        assert peer.store.count_rollouts() == 5
        peer.set_policy_version(3)  # version 0 is now past the staleness bound
        later = time.time() + peer.admission.config.dedup_ttl_s + 1  # past the dedup memory
        await peer.upkeep.enforce_retention(later)
        assert peer.store.count_rollouts() == 0
        assert peer.counters["retention_rollouts_deleted"] == 5
