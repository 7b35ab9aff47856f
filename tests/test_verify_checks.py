"""Unit tests of the individual audit checks (`verify.checks`) on synthetic data."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from protocol.wire import RolloutBody
from verify import checks, sampling, toploc
from verify.thresholds import THRESHOLDS, Thresholds

EOS = 1
V = 50


def _body(**kw: object) -> RolloutBody:
    base: dict = dict(
        prompt_ids=(5, 6, 7),
        completion_ids=(9, 10, EOS),
        logprobs=(-1.0, -2.0, -0.5),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=8,
        sampling_seed=123,
        finish_reason="eos",
        proofs=(bytes(258),),
    )
    base.update(kw)
    return RolloutBody(**base)


# ------------------------------------------------------------------ termination


def test_termination_accepts_eos_and_length() -> None:
    assert checks.check_termination(_body(), {EOS}).passed
    body = _body(
        completion_ids=(9, 10, 11), logprobs=(-1.0,) * 3, max_new_tokens=3, finish_reason="length"
    )
    assert checks.check_termination(body, {EOS}).passed


@pytest.mark.parametrize(
    ("kw", "detail"),
    [
        (dict(completion_ids=(9, EOS, 10)), "continue after EOS"),  # extended past EOS
        (dict(completion_ids=(9, 10, 11)), "without an EOS"),  # truncated, claims eos
        (dict(completion_ids=(9, 10, 11), finish_reason="length"), "stopped at 3 of 8"),
        (dict(finish_reason="length", max_new_tokens=3), "EOS at 2"),
        (
            dict(completion_ids=(9,) * 9, logprobs=(-1.0,) * 9, finish_reason="length"),
            "> max_new_tokens",
        ),
    ],
)
def test_termination_rejects(kw: dict, detail: str) -> None:
    r = checks.check_termination(_body(**kw), {EOS})
    assert not r.passed and r.reason == "termination" and detail in r.detail


# ------------------------------------------------------------------ structure and format


def test_structure_rejects_empty_and_inconsistent() -> None:
    assert checks.check_structure(_body()).passed
    r = checks.check_structure(_body(completion_ids=(), logprobs=(), proofs=()))
    assert (r.passed, r.reason) == (False, "malformed")
    assert not checks.check_structure(_body(logprobs=(-1.0,))).passed


def test_settings_must_equal_the_runs() -> None:
    @dataclasses.dataclass
    class Run:
        temperature: float = 1.0
        top_p: float = 1.0
        top_k: int = 0
        max_new_tokens: int = 8

    assert checks.check_settings(_body(), Run()).passed
    r = checks.check_settings(_body(temperature=0.7), Run())
    assert not r.passed and "temperature" in r.detail
    assert checks.check_settings(_body(temperature=0.7), None).passed


def test_proof_format_failures_are_never_a_pass() -> None:
    good = toploc.build_proofs_bytes(torch.randn(3, 64).to(torch.bfloat16))
    assert checks.check_proof_format(good, 3).passed
    cases = {
        "proof-missing": ([], 3),
        "proof-null": ([bytes(258)], 3),
        "proof-malformed": ([good[0][:-2]], 3),
    }
    for reason, (proofs, n) in cases.items():
        r = checks.check_proof_format(proofs, n)
        assert (r.passed, r.reason) == (False, reason)
    assert checks.check_proof_format(good * 2, 3).reason == "proof-missing"  # too many


def test_proof_check_statistics_and_sign() -> None:
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    proofs = toploc.build_proofs_bytes(x)
    proof, sign = checks.check_proofs(x, proofs)
    assert proof.passed and sign.passed and proof.metrics["proof_exp_mismatch_max"] == 0
    other = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    assert checks.check_proofs(other, proofs)[0].reason == "proof-mismatch"
    flipped = checks.check_proofs(-x, proofs)
    assert flipped[0].passed and flipped[1].reason == "proof-sign"
    assert flipped[1].metrics["proof_sign_mismatches"] == 256


def test_proof_check_mantissa_limits() -> None:
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    proofs = toploc.build_proofs_bytes(x)
    drift = x * 1.03  # same exponents mostly, mantissas off by a few units
    strict = Thresholds(proof_mant_mean=0.5, proof_mant_median=0.5)
    assert checks.check_proofs(drift, proofs, th=strict)[0].reason == "proof-mismatch"
    assert checks.check_proofs(
        drift,
        proofs,
        th=Thresholds(proof_mant_mean=20, proof_mant_median=20, proof_mant_mean_all=20),
    )[0].passed


def test_a_far_point_counts_as_a_mismatch_not_as_mantissa_error() -> None:
    # one top-k value moved within its binade by far more than rounding (a position the
    # prover did not select reads as such): a mismatch, not 100 units of mantissa error
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x)
    y = x.clone().float()
    r, c = divmod(int(y.abs().flatten().argmax()), 64)
    v = float(y[r, c])
    base = 2.0 ** math.floor(math.log2(abs(v)))
    y[r, c] = math.copysign(
        base * (1.0 if abs(v) / base > 1.5 else 1.95), v
    )  # same exponent, mantissa >= 64 away
    proof, sign = checks.check_proofs(y, proofs)
    (ref,) = toploc.verify_proofs_bytes(y, proofs)  # TOPLOC averages it in instead
    assert ref.mant_err_mean > 0.5
    assert proof.metrics["proof_far_points"] == 1
    # (the edit may also reorder a bf16 tie at the top-k boundary: an exponent mismatch)
    assert proof.metrics["proof_exp_mismatch_max"] == ref.exp_mismatches + 1
    assert proof.metrics["proof_mant_mean_all"] == 0.0
    assert sign.passed
    # small errors stay mantissa error
    (small,) = checks.proof_chunks_many([x.float() * 1.03], [proofs])[0]
    assert small.far_points == 0 and small.mant_err_mean > 0


def test_proof_chunks_agree_with_toploc_without_far_points() -> None:
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(t, 48, generator=gen) for t in (5, 32, 70)]
    proofs = [toploc.build_proofs_bytes(x) for x in xs]
    noisy = [x * (1 + 0.004 * torch.randn(x.shape, generator=gen)) for x in xs]
    ours = checks.proof_chunks_many(noisy, proofs)
    theirs = toploc.verify_proofs_bytes_many(noisy, proofs)
    for a, b in zip(ours, theirs, strict=True):
        for o, t in zip(a, b, strict=True):
            assert (o.points, o.exp_mismatches, o.sign_mismatches) == (
                t.points,
                t.exp_mismatches,
                t.sign_mismatches,
            )
            if o.far_points == 0:
                assert (o.mant_err_mean, o.mant_err_median) == (t.mant_err_mean, t.mant_err_median)
    with pytest.raises(toploc.ProofFormatError):
        checks.proof_chunks_many(xs[:1], [proofs[2]])


# ------------------------------------------------------------------ sampling replay


def _sampled_body(logits: np.ndarray, temperature: float = 1.0, **kw: object) -> RolloutBody:
    t = logits.shape[0]
    toks, lps = sampling.sample_tokens(
        logits, temperature=temperature, seeds=[77] * t, steps=list(range(t)), **kw
    )
    return _body(
        completion_ids=tuple(int(v) for v in toks),
        logprobs=tuple(float(v) for v in lps),
        temperature=temperature,
        sampling_seed=77,
        max_new_tokens=t,
        finish_reason="length",
        **kw,
    )


def test_replay_accepts_the_rule_and_reports_zero_margin() -> None:
    logits = np.random.default_rng(0).normal(size=(20, V)).astype(np.float32) * 3
    body = _sampled_body(logits)
    rep = checks.replay(logits, body)
    assert np.all(rep.margins == 0)
    assert checks.check_sampling(rep).passed
    assert checks.check_logprobs(rep, body.logprobs).passed


def test_replay_flags_an_edited_token_with_its_margin() -> None:
    logits = np.random.default_rng(1).normal(size=(20, V)).astype(np.float32) * 3
    body = _sampled_body(logits)
    ids = list(body.completion_ids)
    scores, _ = sampling.perturbed_scores(
        logits, temperature=1.0, top_p=1.0, top_k=0, seeds=[77] * 20, steps=list(range(20))
    )
    worst = int(np.argmin(scores[10]))
    ids[10] = worst
    edited = dataclasses.replace(body, completion_ids=tuple(ids))
    rep = checks.replay(logits, edited)
    assert rep.margins[10] == pytest.approx(scores[10].max() - scores[10, worst])
    r = checks.check_sampling(rep)
    assert (r.passed, r.reason) == (False, "sampling-replay") and "token 10" in r.detail


def test_replay_tolerates_only_near_ties() -> None:
    logits = np.random.default_rng(2).normal(size=(30, V)).astype(np.float32)
    body = _sampled_body(logits)
    scores, _ = sampling.perturbed_scores(
        logits, temperature=1.0, top_p=1.0, top_k=0, seeds=[77] * 30, steps=list(range(30))
    )
    # nudge the verifier's logits so that the runner-up at step 3 wins by a hair
    second = int(np.argsort(scores[3])[-2])
    gap = float(scores[3].max() - scores[3, second])
    noisy = logits.copy()
    noisy[3, second] += gap + 1e-3
    rep = checks.replay(noisy, body)
    assert 0 < rep.margins[3] < 0.01
    assert checks.check_sampling(rep, Thresholds(sampling_margin=0.01)).passed
    assert not checks.check_sampling(rep, Thresholds(sampling_margin=1e-4)).passed
    assert not checks.check_sampling(
        rep, Thresholds(sampling_margin=0.01, sampling_near_ties_max=0)
    ).passed


def test_replay_margins_are_in_logit_units_and_filtered_tokens_are_infinite() -> None:
    logits = np.random.default_rng(3).normal(size=(10, V)).astype(np.float32)
    body = _sampled_body(logits, temperature=0.5, top_k=5)
    rep = checks.replay(logits, body)
    assert np.all(rep.margins == 0)
    order = np.argsort(-logits[4])
    ids = list(body.completion_ids)
    ids[4] = int(order[-1])  # outside the top-5: the rule could never pick it
    rep = checks.replay(logits, dataclasses.replace(body, completion_ids=tuple(ids)))
    assert rep.margins[4] == np.inf
    assert checks.check_sampling(rep).metrics["sampling_margin_max"] == 1e30


def test_greedy_replay_uses_logit_margins() -> None:
    logits = np.random.default_rng(4).normal(size=(6, V)).astype(np.float32)
    ids = tuple(int(v) for v in logits.argmax(axis=1))
    body = _body(
        completion_ids=ids,
        logprobs=(0.0,) * 6,
        temperature=0.0,
        max_new_tokens=6,
        finish_reason="length",
    )
    assert checks.check_sampling(checks.replay(logits, body)).passed
    ids2 = (ids[0], int(logits[1].argmin())) + ids[2:]
    rep = checks.replay(logits, dataclasses.replace(body, completion_ids=ids2))
    assert rep.margins[1] == pytest.approx(float(logits[1].max() - logits[1].min()))


def test_logprob_and_temperature_lies() -> None:
    logits = np.random.default_rng(5).normal(size=(20, V)).astype(np.float32) * 2
    body = _sampled_body(logits)
    lied = dataclasses.replace(
        body, logprobs=tuple(float(np.float32(v - 0.2)) for v in body.logprobs)
    )
    r = checks.check_logprobs(checks.replay(logits, lied), lied.logprobs)
    assert (r.passed, r.reason) == (False, "logprob-mismatch")
    # sampled at 0.5, claimed 1.0: the replay at the claimed temperature disagrees
    cold = _sampled_body(logits, temperature=0.5)
    claim = dataclasses.replace(cold, temperature=1.0)
    rep = checks.replay(logits, claim)
    assert not (
        checks.check_sampling(rep).passed and checks.check_logprobs(rep, claim.logprobs).passed
    )


def test_reward_check() -> None:
    assert checks.check_reward(1.0, 1.0).passed
    r = checks.check_reward(1.0, 0.0)
    assert (r.passed, r.reason) == (False, "reward-mismatch")
    assert not checks.check_reward(float("nan"), 0.0).passed


def test_drift_combines_logprob_and_proof_errors() -> None:
    th = Thresholds(drift=0.002, drift_proof_weight=0.001)
    assert checks.check_drift({"logprob_err_mean": 0.001, "proof_mant_mean_all": 0.5}, th).passed
    # each term alone is under the limit, their sum is not
    r = checks.check_drift({"logprob_err_mean": 0.0015, "proof_mant_mean_all": 0.9}, th)
    assert (r.passed, r.reason) == (False, "model-drift")
    assert r.metrics["drift"] == pytest.approx(0.0024)
    assert checks.check_drift({}, th).passed  # nothing to combine: other checks decide


def test_calibrate_takes_twice_the_honest_maximum_above_floors() -> None:
    from verify.thresholds import BF16_FLOOR, STRICT, calibrate

    rows = [
        {
            "proof_mant_mean_all": 0.3,
            "logprob_err_mean": 0.0,
            "drift": 0.0003,
            "proof_mant_median_max": 1.0,
        },
        {
            "proof_mant_mean_all": 0.1,
            "logprob_err_mean": 0.0001,
            "drift": 0.0002,
            "proof_mant_median_max": 0.0,
        },
    ]
    th = calibrate(rows, STRICT)
    assert th.proof_mant_mean_all == pytest.approx(0.6)
    assert th.logprob_err_mean == STRICT.logprob_err_mean  # floor above 2 x 0.0001
    assert th.drift == STRICT.drift  # floor above 2 x 0.0003
    assert th.proof_mant_median == 1.0  # the largest honest median itself
    assert th.logprob_err_max == STRICT.logprob_err_max  # no data: the floor's value
    assert calibrate([], BF16_FLOOR) == BF16_FLOOR
    # drift, the joint statistic, gets its own (smaller) factor
    loose = calibrate([{"drift": 0.003, "logprob_err_mean": 0.001}], BF16_FLOOR)
    assert loose.drift == pytest.approx(1.5 * 0.003)
    assert loose.logprob_err_mean == pytest.approx(2 * 0.001)
    assert calibrate([{"drift": 0.003}], BF16_FLOOR, metric_factors={}).drift == pytest.approx(
        0.006
    )


def _near_ties(n_tokens: int, ties: int) -> checks.Replay:
    margins = np.zeros(n_tokens)
    margins[np.linspace(0, n_tokens - 1, ties).astype(int)] = 0.005
    return checks.Replay(margins, np.zeros(n_tokens))


def test_near_ties_are_limited_per_token_not_per_rollout() -> None:
    # 12 honest near-ties in 1,024 tokens is the rate of 4 in 340: a per-rollout count of 4
    # failed every long rollout with that many
    assert checks.check_sampling(_near_ties(1024, 12), THRESHOLDS).passed
    assert not checks.check_sampling(_near_ties(1024, 40), THRESHOLDS).passed
    assert not checks.check_sampling(_near_ties(30, 5), THRESHOLDS).passed  # short: as before
    assert checks.check_sampling(_near_ties(30, 4), THRESHOLDS).passed
    r = checks.check_sampling(_near_ties(1024, 12), THRESHOLDS)
    assert r.metrics["sampling_near_tie_rate"] == 12 / 1024


def _chunk(mismatches: int = 0, mean: float = 0.0) -> checks.ProofChunk:
    return checks.ProofChunk(128, mismatches, 0, mean, 0.0, 0)


def test_worst_chunk_limits_allow_a_share_of_chunks_not_a_fixed_one() -> None:
    # the worst of 32 honest chunks is worse than the worst of 2: one chunk over the
    # per-chunk limit in a 1,024-token rollout (32 chunks of 32) is judged at the next one
    over = _chunk(mismatches=20, mean=3.5)  # over 16/128 and the mantissa mean of 3.0
    long_one = [over] + [_chunk()] * 31
    assert checks.judge_proof_chunks(long_one)[0].passed
    assert checks.judge_proof_chunks(long_one)[0].metrics["proof_chunks"] == 32
    assert not checks.judge_proof_chunks([over, over] + [_chunk()] * 30)[0].passed
    assert not checks.judge_proof_chunks([over] + [_chunk()] * 30)[0].passed  # 31 chunks: none
    assert not checks.judge_proof_chunks([over, _chunk()])[0].passed
