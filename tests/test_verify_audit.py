"""The audit end to end on a micro random model: honest records pass; each tamper is caught
by its own check (with the careful attacker's re-proving where it matters); the audit
command's output and exit codes."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
import torch

from node.commands import audit as audit_cmd
from node.errors import CommandError
from protocol.rollout import make_record, open_record, write_records
from protocol.wire import Verdict
from trainer.tiny_policy import build_model
from verify import audit, checks, toploc
from verify.auditor import audit_records, prefill

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


def _audit(env, opened, model=None):
    return audit_records(
        opened, model or env["model"], judge=env["judge"], settings=env["settings"]
    )


def _resign(env, ro, body, reward=None):
    """A record for a doctored body, signed by the same key, reward re-scored honestly."""
    h, e = ro.header, ro.envelope
    if reward is None:
        task = env["tasks"].task(h.dataset, h.task_index)
        text = env["tok"].decode(list(body.completion_ids), skip_special_tokens=True)
        reward = env["tasks"].score(task, text).reward
    rec = make_record(
        env["identity"],
        body,
        dataset=h.dataset,
        task_index=h.task_index,
        counter=h.counter,
        task_seed=h.task_seed,
        reward=reward,
        run_id=e.run_id,
        policy_version=e.policy_version,
        seq=e.seq,
        timestamp_ms=e.timestamp_ms,
    )
    return open_record(rec)


def _reprove(env, body, negate=False):
    """Honest proofs and sampler log-probs for (possibly doctored) tokens."""
    ((hidden, logits),) = prefill(env["model"], [(body.prompt_ids, body.completion_ids)])
    rep = checks.replay(logits, body)
    lps = np.nan_to_num(rep.logprobs, nan=-1e4).clip(-1e4, 0).astype(np.float32)
    h = -hidden if negate else hidden
    return dataclasses.replace(
        body, proofs=tuple(toploc.build_proofs_bytes(h)), logprobs=tuple(float(x) for x in lps)
    )


def _one(env, body, **kw):
    ro = env["opened"][0]
    return _audit(env, [_resign(env, ro, body, **kw)])[0]


def test_honest_records_pass(env):
    results = _audit(env, env["opened"])
    assert [r.reason for r in results] == ["ok"] * 6, [r.detail for r in results]
    r = results[0]
    assert r.metrics["proof_exp_mismatch_max"] == 0 and r.metrics["sampling_margin_max"] == 0
    assert r.reward_rescored == env["opened"][0].header.reward


def test_audit_returns_a_wire_verdict(env):
    ro = env["opened"][1]
    v = audit(ro, env["model"], judge=env["judge"], settings=env["settings"])
    assert isinstance(v, Verdict)
    assert (v.passed, v.reason, v.rollout_id, v.producer) == (
        True,
        "ok",
        ro.rollout_id,
        ro.envelope.signer,
    )
    names = {m.name for m in v.metrics}
    assert {"proof_mant_mean_all", "sampling_margin_max", "logprob_err_mean"} <= names


def test_other_model_fails_the_proof_check(env):
    other = build_model(
        env["tok"],
        seed=4,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    results = _audit(env, env["opened"], model=other)
    assert all(r.reason == "proof-mismatch" for r in results)


@pytest.mark.parametrize(
    ("make_proofs", "reason"),
    [
        (lambda b: (), "proof-missing"),
        (lambda b: tuple(bytes(258) for _ in b.proofs), "proof-null"),
        (lambda b: tuple(p[:100] for p in b.proofs), "proof-malformed"),
        (lambda b: tuple(p[:-2] + bytes([p[-2], p[-1] ^ 1]) for p in b.proofs), "proof-mismatch"),
    ],
)
def test_bad_proofs(env, make_proofs, reason):
    b = env["opened"][0].body
    assert _one(env, dataclasses.replace(b, proofs=make_proofs(b))).reason == reason


def test_copied_proofs(env):
    a, b = env["opened"][0].body, env["opened"][1].body
    proofs = (list(b.proofs) * 2)[: len(a.proofs)]
    assert _one(env, dataclasses.replace(a, proofs=tuple(proofs))).reason == "proof-mismatch"


def test_flipped_signs(env):
    body = _reprove(env, env["opened"][0].body, negate=True)
    r = _one(env, body)
    assert r.reason == "proof-sign" and r.failures == ("proof-sign",)


def test_edited_token_fails_the_replay_even_when_reproved(env):
    b = env["opened"][0].body
    ids = list(b.completion_ids)
    i = len(ids) // 2
    ids[i] = (ids[i] + 7) % 300 + 2
    body = _reprove(env, dataclasses.replace(b, completion_ids=tuple(ids)))
    r = _one(env, body)
    assert r.failures == ("sampling-replay",) and f"token {i}" in r.detail


def test_extended_and_truncated_fail_termination(env):
    b = env["opened"][0].body
    longer = _reprove(
        env,
        dataclasses.replace(
            b, completion_ids=b.completion_ids + (5, 6), logprobs=b.logprobs + (-1.0, -1.0)
        ),
    )
    assert _one(env, longer).reason == "termination"
    k = len(b.completion_ids) // 2
    shorter = _reprove(
        env, dataclasses.replace(b, completion_ids=b.completion_ids[:k], logprobs=b.logprobs[:k])
    )
    assert _one(env, shorter).reason == "termination"


def test_logprob_lie(env):
    b = env["opened"][0].body
    lied = tuple(float(np.float32(x * 0.5)) for x in b.logprobs)
    assert _one(env, dataclasses.replace(b, logprobs=lied)).reason == "logprob-mismatch"


def test_temperature_claim_differs_from_the_run(env):
    b = env["opened"][0].body
    assert _one(env, dataclasses.replace(b, temperature=0.7)).reason == "malformed"


def test_task_and_reward(env):
    ro = env["opened"][0]
    b = ro.body
    wrong_seed = _one(env, dataclasses.replace(b, sampling_seed=b.sampling_seed ^ 1))
    assert wrong_seed.reason == "task-mismatch"
    other_prompt = env["opened"][1].body.prompt_ids
    if other_prompt != b.prompt_ids:
        assert _one(env, dataclasses.replace(b, prompt_ids=other_prompt)).reason == "task-mismatch"
    lie = 1.0 if ro.header.reward < 1.0 else 0.0
    r = _one(env, b, reward=lie)
    assert (r.reason, r.reward_rescored) == ("reward-mismatch", ro.header.reward)


def test_token_outside_the_vocabulary(env):
    b = env["opened"][0].body
    vocab = env["model"].get_output_embeddings().weight.shape[0]
    ids = (vocab + 5,) + b.completion_ids[1:]
    assert _one(env, dataclasses.replace(b, completion_ids=ids)).reason == "malformed"


def test_left_padded_prefill_matches(env):
    right = prefill(
        env["model"], [(r.body.prompt_ids, r.body.completion_ids) for r in env["opened"]]
    )
    left = prefill(
        env["model"],
        [(r.body.prompt_ids, r.body.completion_ids) for r in env["opened"]],
        padding_side="left",
    )
    for (h1, l1), (h2, l2) in zip(right, left, strict=True):
        assert h1.shape == h2.shape
        assert torch.allclose(l1, l2, atol=1e-4)


# ------------------------------------------------------------------ the audit command


def _write(env, name, records):
    path = env["root"] / name
    with open(path, "wb") as f:
        write_records(f, records)
    return path


def test_cli_all_pass_exit_0(env):
    path = _write(env, "ok.msgpack", env["records"][:3])
    out = io.StringIO()
    code = audit_cmd.main([path], str(env["model_dir"]), as_json=True, manifest=env["run"], out=out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert code == 0 and len(lines) == 3 and all(x["passed"] and x["reason"] == "ok" for x in lines)
    assert lines[0]["rollout_id"] == env["opened"][0].rollout_id.hex()


def test_cli_any_fail_exit_1(env):
    ro = env["opened"][0]
    bad = _resign(
        env, ro, dataclasses.replace(ro.body, proofs=tuple(bytes(258) for _ in ro.body.proofs))
    )
    broken = bytearray(env["records"][2])
    broken[-1] ^= 1  # body no longer matches the signed digest
    path = _write(env, "bad.msgpack", [env["records"][1], bad.record, bytes(broken)])
    out = io.StringIO()
    code = audit_cmd.main(
        [path], str(env["model_dir"]), as_json=False, manifest=env["run"], out=out
    )
    lines = out.getvalue().splitlines()
    assert code == 1
    assert lines[0].startswith("PASS") and " ok" in lines[0]
    assert lines[1].startswith("FAIL") and "proof-null" in lines[1]
    assert lines[2].startswith("FAIL") and "bad-record" in lines[2]


def test_cli_without_manifest_still_checks_proofs(env):
    path = _write(env, "nomanifest.msgpack", env["records"][:1])
    assert audit_cmd.main([path], str(env["model_dir"]), out=io.StringIO()) == 0


@pytest.mark.parametrize("case", ["missing", "directory", "bad-model", "no-files", "bad-manifest"])
def test_cli_usage_and_io_errors_exit_2(env, case):
    good = _write(env, "one.msgpack", env["records"][:1])
    model, files, manifest = str(env["model_dir"]), [good], None
    if case == "missing":
        files = [env["root"] / "nope.msgpack"]
    elif case == "directory":
        files = [env["root"]]
    elif case == "bad-model":
        model = str(env["root"])
    elif case == "no-files":
        files = []
    elif case == "bad-manifest":
        m = env["root"] / "bad.toml"
        m.write_text("[run]\nid = 'x'\n")
        manifest = m
    with pytest.raises(CommandError) as exc:
        audit_cmd.main(files, model, manifest=manifest, out=io.StringIO())
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


def test_shared_prompt_prefill_matches_the_plain_one(env, monkeypatch):
    from verify import prefill as prefill_mod
    from verify.auditor import prefill_shared

    ro = env["opened"]
    # a GRPO group: the same prompt with different completions, plus a one-token completion
    seqs = [(ro[0].body.prompt_ids, r.body.completion_ids) for r in ro[:3]]
    seqs += [(ro[3].body.prompt_ids, ro[3].body.completion_ids), (ro[4].body.prompt_ids, (5,))]
    # completions of one prompt sharing their starts: equal, a prefix of another, diverging
    c = tuple(ro[1].body.completion_ids)
    seqs += [
        (ro[0].body.prompt_ids, c),
        (ro[0].body.prompt_ids, c[:3]),
        (ro[0].body.prompt_ids, c[:4] + (7, 8, 9)),
    ]
    for row_tokens in (
        prefill_mod.SHARED_ROW_TOKENS,
        5,
    ):  # rows of a whole group, and a group split in rows
        monkeypatch.setattr(prefill_mod, "SHARED_ROW_TOKENS", row_tokens)
        for (h1, l1), (h2, l2) in zip(
            prefill(env["model"], seqs), prefill_shared(env["model"], seqs), strict=True
        ):
            assert h1.shape == h2.shape and l1.shape == l2.shape
            assert torch.allclose(h1, h2, atol=1e-5) and torch.allclose(l1, l2, atol=1e-4)


# ------------------------------------------------------------------ batch invariance


@pytest.fixture(scope="module")
def bf16_records(env):
    """32 records of a worker computing in bf16 (its rounding differs with the batch)."""
    from tests.support.audit_env import open_records_file, records_file

    worker = _bf16_copy(env["model"])
    return open_records_file(records_file(env, worker, "bf16-32.msgpack", n=32, max_batch=16))


def _bf16_copy(model):
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def test_verdicts_do_not_depend_on_the_batch(env, bf16_records):
    """Audit N records together and each alone: same verdicts and reasons. Tight bf16
    limits put some honest bf16 records near a limit, where batch rounding decides."""
    # (the bf16 floors are tighter than this random micro model's bf16 noise, so some fail)
    from verify.thresholds import BF16_FLOOR

    settings = dataclasses.replace(env["settings"], precision="bf16", bf16_thresholds=BF16_FLOOR)
    together = audit_records(bf16_records, env["model"], judge=env["judge"], settings=settings)
    alone = [
        audit_records([ro], env["model"], judge=env["judge"], settings=settings)[0]
        for ro in bf16_records
    ]
    assert [(r.passed, r.reason) for r in together] == [(r.passed, r.reason) for r in alone]


def _mixed_records(env):
    """Honest records and tampered ones that reach the model checks (each tamper on a
    different honest record), plus one that fails the cheap checks, plus records of a
    slightly changed model: several prompts, completion lengths and reasons."""
    from tests.support.audit_env import open_records_file, rank1_change, records_file

    ro = env["opened"]
    b = [r.body for r in ro]
    ids = list(b[1].completion_ids)
    ids[len(ids) // 2] = (ids[len(ids) // 2] + 7) % 300 + 2
    tampered = [
        _resign(
            env,
            ro[0],
            dataclasses.replace(b[0], proofs=tuple((list(b[2].proofs) * 2)[: len(b[0].proofs)])),
        ),
        _resign(env, ro[1], _reprove(env, dataclasses.replace(b[1], completion_ids=tuple(ids)))),
        _resign(
            env,
            ro[2],
            dataclasses.replace(
                b[2], logprobs=tuple(float(np.float32(x * 0.5)) for x in b[2].logprobs)
            ),
        ),
        _resign(env, ro[3], _reprove(env, b[3], negate=True)),
        _resign(env, ro[4], dataclasses.replace(b[4], temperature=0.7)),
    ]
    changed = records_file(
        env, rank1_change(env["model"], 0.05), "changed-4.msgpack", n=4, start_counter=50
    )
    return list(ro) + tampered + open_records_file(changed)


def test_batched_audit_equals_one_by_one_on_honest_and_tampered(env):
    mixed = _mixed_records(env)
    alone = [_audit(env, [r])[0] for r in mixed]
    reasons = {r.reason for r in alone}
    assert {
        "ok",
        "proof-mismatch",
        "sampling-replay",
        "logprob-mismatch",
        "proof-sign",
        "malformed",
    } <= reasons
    assert any(not r.passed for r in alone[-4:])  # the changed model is caught
    for max_batch_tokens in (None, 64):  # the default batches, and many small ones
        settings = env["settings"]
        if max_batch_tokens is not None:
            settings = dataclasses.replace(settings, max_batch_tokens=max_batch_tokens)
        together = audit_records(mixed, env["model"], judge=env["judge"], settings=settings)
        for a, t in zip(alone, together, strict=True):
            assert (t.passed, t.reason, t.failures, t.reward_rescored) == (
                a.passed,
                a.reason,
                a.failures,
                a.reward_rescored,
            )
            assert t.metrics.keys() == a.metrics.keys()
            for k, v in a.metrics.items():
                assert t.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
