"""The trainer role's account of its rollouts: a rollout counted `stale` was refused for
staleness by the trainer, and trained, stale, unverified, incomplete-group and other rollouts
add up to the produced count."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from node.roles.rollout_fates import Fates, shares
from node.roles.trainer import Collector, pick_ready, train_ready
from node.run_file import manifest_from_table
from protocol.authority import Authority
from protocol.identity import Identity
from protocol.rollout import open_record, read_records
from protocol.standing import StandingBook
from protocol.verified import VerifiedRule, Vote
from trainer import tiny_policy as tp
from trainer.engine_hf import HFEngine
from trainer.produce import generate_records
from trainer.samples import Rescorer
from trainer.train_loop import Trainer


def _records(engine, manifest, identity, path, n, version, start):
    generate_records(
        engine=engine,
        manifest=manifest,
        identity=identity,
        n=n,
        out=path,
        policy_version=version,
        start_counter=start,
        batch_size=n,
    )
    with open(path, "rb") as f:
        return [open_record(r) for r in read_records(f)]


def test_stale_means_refused_for_staleness_and_the_shares_add_up(tok, tmp_path):
    table = tp.run_manifest_table("fates-test", seed=4)
    table["rl"]["groups_per_step"] = 4  # the four complete groups below make one step
    manifest = manifest_from_table(table)
    s, now = manifest.max_staleness, 0.0
    version = s + 1  # the trainer's version: rollouts of version 0 are stale
    model = tp.build_model(tok, seed=1, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    engine = HFEngine(model, tok, max_batch=16)
    worker, validator = Identity.generate(), Identity.generate()

    def made(n, v, start):
        return _records(engine, manifest, worker, tmp_path / f"{v}-{start}.msgpack", n, v, start)

    full = made(16, version, 0)  # four complete groups: one step
    partial = made(3, version, 16)  # three of group 4's four members
    unverified = made(2, version, 20)
    stale_waiting = made(4, 0, 0)  # went stale while they waited for their verdicts
    stale_queued = made(4, 0, 4)  # picked when fresh, stale by the time they were queued
    collector = Collector(Authority(validator_keys=[validator.peer_id]), VerifiedRule(quorum=1))
    waiting: OrderedDict[bytes, object] = OrderedDict()
    for ro in full + partial + unverified + stale_waiting:
        t = collector.track(ro.rollout_id)
        t.producer, t.body, t.version = ro.envelope.signer, True, ro.envelope.policy_version
        if ro not in unverified:
            t.votes.append(Vote(validator.peer_id, ro.envelope.signer, True))
        waiting[ro.rollout_id] = (ro, now)

    trainer = Trainer.from_manifest(model, tok, manifest)
    trainer.version = version
    rescorer = Rescorer(manifest, tok)
    fates = Fates()
    ready, _unaudited = pick_ready(collector, StandingBook(), waiting, version, s, now, fates)
    assert sorted(r.rollout_id for r in ready) == sorted(r.rollout_id for r in full + partial)
    assert train_ready(trainer, rescorer, ready, 1, now) == 1
    refusals = [trainer.add(rescorer.sample(ro), now) for ro in stale_queued]
    assert all(r is not None and r.startswith("stale:") for r in refusals), refusals
    fates.on_late(stale_queued[0].rollout_id)
    fates.on_late(stale_queued[0].rollout_id)  # a second copy of a late rollout counts once
    late = 1

    counts = fates.counts(trainer, waiting)
    assert counts == {
        "trained": len(full),
        "stale": len(stale_waiting) + len(stale_queued) + late,
        "unverified": len(unverified),
        "incomplete_group": len(partial),
    }
    never_reached = 5
    produced = sum(counts.values()) + never_reached
    got = shares(produced, counts)
    assert got["counts"]["other"] == never_reached
    assert sum(got["counts"].values()) == produced
    assert got["stale"] == round(counts["stale"] / produced, 4)
    assert sum(got[k] for k in got["counts"]) == pytest.approx(1.0, abs=1e-3)


def test_shares_refuse_counts_beyond_what_was_produced():
    with pytest.raises(ValueError, match="accounts for 12 rollouts, 10 were produced"):
        shares(10, {"trained": 8, "stale": 4})
    empty = shares(0, {})
    assert empty["counts"] == dict.fromkeys(
        ("trained", "stale", "unverified", "incomplete_group", "other"), 0
    )
    assert empty["trained"] is None
