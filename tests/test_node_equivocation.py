"""An equivocating trainer key between real peers (py-libp2p on loopback, SQLite stores, in
one trio process), on the built-in tiny policy: two halves of the swarm install two
different signed manifests of version 2. Every peer ends up holding the evidence (the hub
sees both sides, the halves get it by gossip), keeps it in its store, shows it in `status`
and `ledger`, and treats the key as failed; no honest peer charges another; the run goes on
at version 3 from the run's other trainer key. A validator holding the evidence judges no
record of the disputed version, and still judges the others."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import pytest
import trio

from node.commands import ledger as ledger_command
from node.commands import status as status_command
from node.peer.peer import PeerConfig, open_peer
from node.testing.equivocation import install_side
from node.testing.records import net_manifest
from node.weights.sync import WeightSettings
from protocol.admission import Kind
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.equivocation import evidence
from protocol.identity import Identity
from tests.support import polling
from trainer.checkpoint import from_state_dict
from trainer.export import full_manifest

pytestmark = [pytest.mark.network, pytest.mark.slow]

until = functools.partial(polling.until, timeout=90.0)
SHARD = 256 * 1024


@functools.cache
def tiny_weights(seed: int) -> bytes:
    """The canonical bytes of the built-in tiny policy initialized with `seed`."""
    from trainer import tiny_policy as tp

    tok = tp.build_tokenizer(0)
    return from_state_dict(tp.build_model(tok, seed=seed).state_dict())


def _cfg(tmp: Path, name: str, manifest, identity=None, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest,
        identity=identity or Identity.generate(),
        data_dir=tmp / name,
        roles=("relay",),
        weights=WeightSettings(shard_bytes=SHARD),
        **kw,
    )


async def test_an_equivocating_trainer_key_is_failed_everywhere_and_nobody_honest_pays(
    tmp_path: Path,
) -> None:
    liar, next_trainer = Identity.generate(), Identity.generate()
    manifest = dataclasses.replace(
        net_manifest("equiv"), trainer_keys=(liar.peer_id, next_trainer.peer_id), max_staleness=1
    )
    side_a, side_b, v3 = tiny_weights(1), tiny_weights(2), tiny_weights(3)
    async with open_peer(_cfg(tmp_path, "hub", manifest)) as hub:
        boot = (hub.host.listen_addrs()[0],)
        async with (
            open_peer(_cfg(tmp_path, "a", manifest, bootstrap=boot)) as a,
            open_peer(_cfg(tmp_path, "b", manifest, bootstrap=boot)) as b,
            open_peer(_cfg(tmp_path, "t2", manifest, next_trainer, bootstrap=boot)) as t2,
        ):
            honest = (hub, a, b, t2)
            await until("a mesh", lambda: all(len(p.host.connected_peers()) >= 1 for p in honest))
            await trio.sleep(1.0)  # gossip meshes form
            env_a = await install_side(a, liar, 2, side_a, SHARD)
            env_b = await install_side(b, liar, 2, side_b, SHARD)
            await a.outbox.put(a.topics["weights"], env_a)  # each half passes its side on
            await b.outbox.put(b.topics["weights"], env_b)
            assert a.weights.installed()[2] != b.weights.installed()[2]  # the swarm is split
            await until(
                "every peer holds the evidence",
                lambda: all(p.admission.authority.failed(liar.peer_id) for p in honest),
            )
            for p in honest:
                assert p.admission.equivocations.is_disputed(2)
                assert [e["kind"] for e in p.stats()["equivocations"]] == ["weight_manifest"]
            await until(
                "the evidence is stored, and gossiped by whoever saw both sides",
                lambda: (
                    all(p.store.equivocations() for p in honest)
                    and sum(p.counters["equivocations_gossiped"] for p in honest) >= 1
                ),
            )
            for p in honest:
                [(first, second, _at, _here)] = p.store.equivocations()
                assert evidence(first, second, "equiv").signer == liar.peer_id
            # No honest peer charged another for what the key did; the key pays everywhere.
            now = time.time()
            for p in honest:
                for q in honest:
                    if q is not p:
                        assert p.admission.scores.score(q.host.peer_id, now) >= 0
                        assert not p.admission.scores.is_banned(q.host.peer_id, now)
                assert p.admission.scores.score(liar.peer_id_b58, now) < -100
            # The run goes on: the run's other trainer key publishes version 3, a full
            # version every half installs whatever it held as 2.
            await t2.outbox.put(
                t2.topics["weights"], await install_side(t2, next_trainer, 3, v3, SHARD)
            )
            await until(
                "version 3 everywhere",
                lambda: all(3 in p.weights.installed() for p in (hub, a, b)),
            )
            assert not any(p.admission.equivocations.is_disputed(3) for p in honest)
            assert a.weights.installed()[3] == b.weights.installed()[3]
    # `status` and `ledger` show the evidence from the store of a stopped node.
    shown = status_command.collect(tmp_path / "a")["equivocations"]
    assert [(e["kind"], e["slot"]) for e in shown] == [("weight_manifest", 2)]
    lines = []
    echo = ledger_command.click.echo
    ledger_command.click.echo = lines.append  # type: ignore[assignment]
    try:
        ledger_command.main(tmp_path / "a", None, False, None, 100, True)
    finally:
        ledger_command.click.echo = echo  # click's own, for every later test
    held = [json.loads(line) for line in lines if '"evidence"' in line]
    assert held and held[0]["kind"] == "weight_manifest" and held[0]["slot"] == 2


async def test_a_validator_judges_no_record_of_a_disputed_version(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Its model of version 2 is the other side's: every record of 2 would fail here. With
    the evidence held, none is audited, no verdict is published, nobody is charged; a
    record of an undisputed version is judged as before."""
    from protocol.codec import decode
    from protocol.wire import RolloutRecord, Verdict
    from tests.test_node_fraud import _record, _validator

    me, liar = Identity.generate(), Identity.generate()
    worker_a, worker_b = Identity.generate(), Identity.generate()
    manifest = dataclasses.replace(
        net_manifest("disputed"), trainer_keys=(liar.peer_id,), validator_keys=(me.peer_id,)
    )
    audited: list[bytes] = []

    def fail_all(rollouts, model, **_kw):  # type: ignore[no-untyped-def]
        audited.extend(ro.rollout_id for ro in rollouts)
        return [
            Verdict(
                rollout_id=ro.rollout_id,
                producer=ro.envelope.signer,
                passed=False,
                reason="logprob-mismatch",
                reward_rescored=0.0,
                metrics=(),
            )
            for ro in rollouts
        ]

    now_ms = int(time.time() * 1000)
    sides = [
        seal(
            liar,
            full_manifest(2, tiny, max_shard_bytes=SHARD),
            run_id="disputed",
            policy_version=2,
            seq=i + 2,
            timestamp_ms=now_ms,
        )
        for i, tiny in enumerate((tiny_weights(1), tiny_weights(2)))
    ]
    reporter = Identity.generate()
    proof = seal(
        reporter,
        evidence(sides[0], sides[1]).wire(),
        run_id="disputed",
        policy_version=2,
        seq=1,
        timestamp_ms=now_ms,
    )
    from node.roles.policy_versions import HeldVersions

    # It holds a model of every version (of version 2: its own side's).
    monkeypatch.setattr(HeldVersions, "get", lambda self, version: self.model)
    async with _validator(tmp_path, monkeypatch, manifest, me, fail_all, 1.0) as (peer, _ctx):
        sender = Identity.generate().peer_id_b58
        peer.set_policy_version(2)
        assert (await peer.admit(sender, Kind.EQUIVOCATION, proof)).accepted
        assert peer.admission.equivocations.is_disputed(2)
        disputed_rec = _record(worker_a, manifest, 0, cheat=False, policy_version=2)
        undisputed_rec = _record(worker_b, manifest, 1, cheat=False, policy_version=0)
        for data in (disputed_rec, undisputed_rec):
            handled = await peer.admit(sender, Kind.ROLLOUT_RECORD, data)
            assert handled.accepted, handled.actions
        await until(
            "the undisputed record is judged",
            lambda: content_id(decode(RolloutRecord, undisputed_rec).header) in audited,
        )
        await trio.sleep(0.5)
        rid = content_id(decode(RolloutRecord, disputed_rec).header)
        assert rid not in audited and peer.store.verdicts_for(rid) == []
        scores, now = peer.admission.scores, time.time()
        assert scores.score(worker_a.peer_id_b58, now) >= 0  # not charged for the split
        assert scores.score(worker_b.peer_id_b58, now) < 0  # judged as ever


async def test_an_equivocating_validator_key_is_failed_by_the_peer_that_saw_it_and_by_gossip(
    tmp_path: Path,
) -> None:
    """A validator key signs a pass and a fail of one rollout; the peer that admits both
    keeps the evidence and gossips it; a peer that saw neither fails the key too, and from
    then on that key's verdicts are refused (free for whoever passes them on)."""
    from protocol.wire import Verdict

    liar = Identity.generate()
    manifest = dataclasses.replace(net_manifest("equiv-v"), validator_keys=(liar.peer_id,))
    producer = Identity.generate().peer_id

    def verdict(rid: bytes, passed: bool, seq: int) -> bytes:
        v = Verdict(
            rollout_id=rid,
            producer=producer,
            passed=passed,
            reason="ok" if passed else "proof-mismatch",
            reward_rescored=0.0,
            metrics=(),
        )
        return seal(
            liar,
            v,
            run_id="equiv-v",
            policy_version=0,
            seq=seq,
            timestamp_ms=int(time.time() * 1000),
        )

    async with open_peer(_cfg(tmp_path, "p1", manifest)) as p1:
        boot = (p1.host.listen_addrs()[0],)
        async with open_peer(_cfg(tmp_path, "p2", manifest, bootstrap=boot)) as p2:
            await until("connected", lambda: bool(p2.host.connected_peers()))
            await trio.sleep(1.0)  # gossip meshes form
            relay = Identity.generate().peer_id_b58
            rid = b"r" * 32
            assert (await p1.admit(relay, Kind.VERDICT, verdict(rid, True, 1))).accepted
            await p1.admit(relay, Kind.VERDICT, verdict(rid, False, 2))
            assert p1.admission.authority.failed(liar.peer_id)
            await until(
                "the other peer fails the key by gossip",
                lambda: p2.admission.authority.failed(liar.peer_id),
            )
            await until(
                "stored", lambda: bool(p1.store.equivocations() and p2.store.equivocations())
            )
            assert [e["kind"] for e in p2.stats()["equivocations"]] == ["verdict"]
            later = await p2.admit(relay, Kind.VERDICT, verdict(b"s" * 32, True, 3))
            assert not later.accepted
            now = time.time()
            assert p2.admission.scores.score(relay, now) >= 0  # the relay is not to blame
            assert p2.admission.scores.score(liar.peer_id_b58, now) < -100
