"""The training loop on a tiny model: it learns what advantages say, drops flat groups,
refuses stale rollouts with a reason, re-scores rewards (a lying claim is never trained on),
resumes at its last version after a restart, and the offline `train` command."""

from __future__ import annotations

import json

import pytest
import torch

from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from protocol.rollout import make_record, open_record, write_records
from protocol.wire import RolloutBody
from trainer import tiny_policy as tp
from trainer.loss import LossSettings
from trainer.samples import Refused, Rescorer, Sample
from trainer.tasks import TaskSet, assign_task
from trainer.train_loop import Trainer, completion_logprobs


def _model(tok, seed=0):
    return tp.build_model(tok, seed=seed, hidden_size=32, intermediate_size=64, num_hidden_layers=1)


def _sample(tok, text, reward, version=0, group=0, sampler_lp=None, rid=b""):
    p = tuple(tok.encode("1 + 2 =\n", add_special_tokens=False))
    c = tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)
    lp = sampler_lp if sampler_lp is not None else (-1.0,) * len(c)
    return Sample(p, c, tuple(lp), 1.0, version, (b"p", version, group), reward, reward, rid)


def _trainer(tok, model, **kw):
    args = dict(
        group_size=2,
        max_staleness=2,
        loss=LossSettings(),
        lr=3e-3,
        groups_per_step=1,
        publish_every=1,
    )
    args.update(kw)
    return Trainer(model, tok, **args)


def _logp(model, tok, s):
    with torch.no_grad():
        lp, mask = completion_logprobs(model, [s], tok.pad_token_id)
    return float((lp * mask).sum())


def test_it_learns_what_the_advantages_say(tok):
    torch.manual_seed(0)
    model = _model(tok)
    trainer = _trainer(tok, model)
    good, bad = _sample(tok, "<answer>3</answer>", 1.0), _sample(tok, "<answer>7</answer>", 0.0)
    before = _logp(model, tok, good), _logp(model, tok, bad)
    for _ in range(5):
        good_s = _sample(
            tok,
            "<answer>3</answer>",
            1.0,
            sampler_lp=completion_logprobs(model, [good], 0)[0][0].tolist(),
        )
        bad_s = _sample(
            tok,
            "<answer>7</answer>",
            0.0,
            sampler_lp=completion_logprobs(model, [bad], 0)[0][0].tolist(),
        )
        stats = trainer.train_on([[good_s, bad_s]])
        assert stats["samples"] == 2
    after = _logp(model, tok, good), _logp(model, tok, bad)
    assert after[0] > before[0] + 0.5 and after[1] < before[1] - 0.5
    assert trainer.steps == 5 and trainer.tokens_trained > 0


def test_zero_advantage_groups_are_dropped(tok):
    model = _model(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(tok, model)
    flat = [_sample(tok, "<answer>3</answer>", 1.0), _sample(tok, "<answer>3</answer>", 1.0)]
    stats = trainer.train_on([flat])
    assert stats["samples"] == 0 and trainer.groups_flat == 1 and trainer.steps == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_stale_rollouts_are_refused_with_a_reason(tok):
    trainer = _trainer(tok, _model(tok), version=5)
    assert trainer.add(_sample(tok, "x", 1.0, version=3)) is None  # 5 - 3 <= 2
    reason = trainer.add(_sample(tok, "x", 1.0, version=2, group=1))
    assert reason.startswith("stale:") and "S=2" in reason
    assert trainer.add(_sample(tok, "x", 1.0, version=6, group=2)).startswith("future-version")
    assert trainer.refused == {"stale": 1, "future-version": 1}
    # a waiting group that goes stale as the version moves on is dropped at the next step
    trainer.version = 6
    assert trainer.step() is None and trainer.refused["stale"] == 2 and not trainer.pending


def test_restart_resumes_the_version_and_never_republishes(tok, tmp_path):
    published = []
    publish = lambda v, m: published.append(v)  # noqa: E731
    model = _model(tok)
    trainer = _trainer(tok, model, ckpt_dir=tmp_path, publish=publish, max_staleness=8)
    for g in range(3):
        trainer.add(_sample(tok, "<answer>3</answer>", 1.0, group=g, rid=b"a%d" % g))
        trainer.add(_sample(tok, "<answer>4</answer>", 0.0, group=g, rid=b"b%d" % g))
        trainer.step()
    assert published == [1, 2, 3] and trainer.version == 3
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    again = _trainer(tok, _model(tok, seed=9), ckpt_dir=tmp_path, publish=publish, max_staleness=8)
    assert again.resumed and again.version == 3 and again.steps == 3
    assert all(torch.equal(weights[k], v) for k, v in again.model.state_dict().items())
    assert again.opt.state_dict()["state"]  # AdamW moments came back too
    again.add(_sample(tok, "<answer>3</answer>", 1.0, version=3, group=9, rid=b"c"))
    again.add(_sample(tok, "<answer>4</answer>", 0.0, version=3, group=9, rid=b"d"))
    again.step()
    assert published == [1, 2, 3, 4]


# ------------------------------------------------------------ records, re-scoring, command


def _manifest(**rl):
    table = tp.run_manifest_table("train-test", seed=3)
    table["run"]["group_size"] = 2
    table["rl"] = {"groups_per_step": 1, "publish_every": 2, "lr": 0.003, **rl}
    return manifest_from_table(table)


def _records(tok, manifest, ident, n_groups, lie_every=0):
    tasks = TaskSet(manifest.seed)
    out = []
    for counter in range(n_groups * manifest.group_size):
        a = assign_task(manifest, ident.peer_id, counter)
        task = tasks.task_for(a)
        text = tp.worked_solution(task) if counter % 2 == 0 else "<answer>nope</answer>"
        c = tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)
        body = RolloutBody(
            prompt_ids=tuple(tok.encode(task.prompt, add_special_tokens=False)),
            completion_ids=c,
            logprobs=(-0.5,) * len(c),
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=64,
            sampling_seed=a.task_seed,
            finish_reason="eos",
            proofs=(),
        )
        reward = tasks.score(task, text).reward
        if lie_every and counter % lie_every == 1:
            reward = 1.0  # claims a solve it did not make
        out.append(
            make_record(
                ident,
                body,
                dataset=a.dataset,
                task_index=a.task_index,
                counter=counter,
                task_seed=a.task_seed,
                reward=reward,
                run_id=manifest.run_id,
                policy_version=0,
                seq=counter,
                timestamp_ms=1,
            )
        )
    return out


def test_a_claimed_reward_that_differs_is_never_trained_on(tok):
    manifest = _manifest()
    recs = _records(tok, manifest, Identity.generate(), 2, lie_every=2)
    rescorer = Rescorer(manifest, tok)
    honest = rescorer.sample(open_record(recs[0]))
    assert honest.reward == 1.0 and honest.version == 0
    with pytest.raises(Refused) as err:
        rescorer.sample(open_record(recs[1]))
    assert err.value.reason == "claimed-reward-mismatch"


def test_every_held_body_is_re_scored_for_credit_whatever_it_claims(tok):
    """The trainer's credit path (`node.roles.trainer.rescore_bodies`): the reward of each body
    from its task, not from its header."""
    from node.roles.trainer import rescore_bodies

    manifest = _manifest()
    recs = [open_record(r) for r in _records(tok, manifest, Identity.generate(), 2, lie_every=2)]
    scored = dict(rescore_bodies(Rescorer(manifest, tok), recs))
    assert len(scored) == 4
    for r in recs:
        solved = r.header.counter % 2 == 0
        assert (scored[r.rollout_id] >= 1.0) == solved
    assert recs[1].header.reward == 1.0 and scored[recs[1].rollout_id] < 1.0  # the lie


def test_offline_train_command(tok, tmp_path, monkeypatch):
    from node.commands import train
    from trainer.model_dir import save_model_dir

    model_dir = save_model_dir(_model(tok), tok, tmp_path / "model")
    manifest = _manifest()
    (tmp_path / "run.toml").write_text(manifest_to_toml(manifest))
    ident = Identity.generate()
    with open(tmp_path / "r.msgpack", "wb") as f:
        write_records(f, _records(tok, manifest, ident, 4, lie_every=4))
    kw = dict(run=tmp_path / "run.toml", model=str(model_dir), out=tmp_path / "out", quiet=True)
    s = train.main(files=[tmp_path / "r.msgpack"], **kw)
    # 8 records; the liars (counters 1, 5) refused, so 2 groups are incomplete
    assert s["admitted"] == 6 and s["refused"] == {"claimed-reward-mismatch": 2}
    assert s["train_steps"] == 2 and s["versions_published"] == [1]
    assert (tmp_path / "out" / "v1" / "config.json").is_file()
    again = train.main(files=[tmp_path / "r.msgpack"], **kw)
    # resumed at version 1: the version-0 rollouts are within S = 2, training continues
    assert again["versions_published"] == [2] and again["policy_version"] == 2
    json.dumps(again)


def test_in_process_groups_carry_sampler_logprobs_and_scores(tok):
    from trainer.engine import SamplingSettings
    from trainer.engine_hf import HFEngine
    from trainer.groups import generate_groups, paired_ci95

    model = _model(tok)
    tasks = TaskSet(4)
    groups = generate_groups(
        HFEngine(model, tok, max_batch=8),
        tok,
        tasks,
        [("tiny-products", 0), ("tiny-products", 1)],
        group_size=3,
        settings=SamplingSettings(max_new_tokens=6),
        seed=1,
    )
    assert [len(g) for g in groups] == [3, 3]
    s = groups[0][0]
    assert len(s.sampler_logprobs) == len(s.completion_ids) and s.reward in (0.0, 1.0)
    lp, mask = completion_logprobs(model, [s], tok.pad_token_id)
    n = int(mask.sum())
    assert torch.allclose(lp[0, :n], torch.tensor(s.sampler_logprobs), atol=1e-4)
    lo, hi = paired_ci95([False] * 50 + [True] * 50, [True] * 100)
    assert 0.35 < lo < 0.5 < hi < 0.65


def test_shares_of_several_samples_pair_up_into_a_gain(tok):
    from trainer.engine_hf import HFEngine
    from trainer.groups import heldout_shares, heldout_solved, paired_gain

    model = _model(tok)
    engine = HFEngine(model, tok, max_batch=8)
    items = [("tiny-products", k) for k in range(6)]
    shares = heldout_shares(engine, tok, items, 6, samples=3)
    runs = [heldout_solved(engine, tok, items, 6, seed=s) for s in (7, 8, 9)]
    assert shares == [sum(r) / 3 for r in zip(*runs, strict=True)]
    g = paired_gain([0.0, 0.5, 1.0, 0.0], [1.0, 0.5, 1.0, 0.5])
    assert g["solve_rate_before"] == 0.375 and g["solve_rate_after"] == 0.75 and g["gain"] == 0.375
    low, high = g["gain_ci95"]
    assert low < 0.375 < high and high - 0.375 == pytest.approx(0.375 - low, abs=1e-4)


def test_partial_groups_train_after_waiting(tok):
    trainer = _trainer(tok, _model(tok), group_size=4)
    trainer.add(_sample(tok, "<answer>3</answer>", 1.0, rid=b"a"), now=10.0)
    trainer.add(_sample(tok, "<answer>4</answer>", 0.0, rid=b"b"), now=11.0)
    trainer.add(_sample(tok, "<answer>5</answer>", 0.0, group=1, rid=b"c"), now=10.0)
    assert trainer.flush_partial(now=20.0, wait_s=15.0) == 0 and trainer.step() is None
    assert trainer.flush_partial(now=25.0, wait_s=15.0) == 1  # the lone member stays
    assert list(trainer.pending) == [(b"p", 0, 1)]
    stats = trainer.step()
    assert stats is not None and stats["samples"] == 2
