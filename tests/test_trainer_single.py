"""The single-process reference learner trains exactly as the swarm's trainer role does: on
the same rollouts (a worker's records, opened and re-scored by the trainer role) one step
gives the same loss, the same gradients and the same weights."""

from __future__ import annotations

import copy
import zlib

import torch

from node.roles.trainer import train_ready
from node.run_file import manifest_from_table
from protocol.identity import Identity
from protocol.rollout import open_record, read_records
from trainer import tiny_policy as tp
from trainer.engine_hf import HFEngine
from trainer.produce import generate_records
from trainer.samples import Rescorer
from trainer.single import SingleLearner
from trainer.tasks import Score, TaskSet
from trainer.train_loop import Trainer


def _by_text(self, task, text, log=None):
    # an untrained micro model solves nothing: score by the text so that groups differ
    return Score(reward=float(zlib.crc32(text.encode()) % 2), answer=None, partial=False)


def test_single_learner_steps_as_the_trainer_role_does(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(TaskSet, "score", _by_text)
    manifest = manifest_from_table(tp.run_manifest_table("single-test", seed=3))
    n = manifest.group_size * manifest.rl_groups_per_step  # one step's worth
    base = tp.build_model(tok, seed=1, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    base.eval()
    identity = Identity.generate()

    # the swarm: a worker's records, opened, re-scored and trained on by the trainer role
    role_model = copy.deepcopy(base)
    out = tmp_path / "r.msgpack"
    generate_records(
        engine=HFEngine(role_model, tok, max_batch=n),
        manifest=manifest,
        identity=identity,
        n=n,
        out=out,
        batch_size=n,
    )
    with open(out, "rb") as f:
        opened = [open_record(r) for r in read_records(f)]
    role = Trainer.from_manifest(role_model, tok, manifest)
    assert train_ready(role, Rescorer(manifest, tok), opened, 1, 0.0) == 1

    # the reference: the same producer's tasks, generated and trained on in one process
    single = SingleLearner(
        copy.deepcopy(base), tok, manifest, batch_size=n, threads=1, producer=identity.peer_id
    )
    assert single.turn() == 1

    a, b = role.last_stats, single.trainer.last_stats
    assert a["samples"] > 0 and a["loss"] != 0.0
    assert a == b  # loss, gradient norm, rewards, clip and importance statistics
    for (name, p), q in zip(
        role_model.named_parameters(), single.trainer.model.parameters(), strict=True
    ):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name
        assert torch.equal(p, q), name
    assert not torch.equal(next(base.parameters()), next(role_model.parameters()))  # it stepped


def test_single_learner_stays_on_policy_and_moves_the_version(tok, monkeypatch):
    monkeypatch.setattr(TaskSet, "score", _by_text)
    table = tp.run_manifest_table("single-test", seed=3)
    table["rl"].update(groups_per_step=1, publish_every=2)
    manifest = manifest_from_table(table)
    model = tp.build_model(tok, seed=1, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    single = SingleLearner(model, tok, manifest, batch_size=8, threads=1)
    assert single.turn() == 2  # two groups of 4: two steps, one version
    assert single.trainer.version == 1 and single.counter == 8
    made = single.samples(4)
    assert {s.version for s in made} == {1}  # the next rollouts: sampled at the new version
    assert dict(single.trainer.refused) == {}
