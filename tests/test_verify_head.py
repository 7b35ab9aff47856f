"""The LM head in row chunks (`verify.head`): the same margins and log-probs as the replay
on full logits (`verify.checks.replay_many` over `verify.prefill.prefill`), on the micro
policy and on a Qwen2 of the real vocabulary (`qwen2-test`'s shape); an audit and a
worker's recorded log-probs never apply the head to more than one chunk of rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from trainer.engine import SamplingSettings
from trainer.engine_vllm import recorded_logprobs
from verify import checks, head, sampling
from verify.auditor import audit_records
from verify.prefill import hidden_rows, prefill, prefill_shared

pytestmark = pytest.mark.slow  # builds models, generates rollouts

SETTINGS = [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.9, 0.8, 40), (0.0, 1.0, 0)]


def _bodies(base, tokens_of, settings=SETTINGS):
    """One body per (prompt, completion) of `tokens_of`, settings and seeds varied."""
    out = []
    for k, (p, c) in enumerate(tokens_of):
        t, top_p, top_k = settings[k % len(settings)]
        out.append(
            dataclasses.replace(
                base,
                prompt_ids=tuple(p),
                completion_ids=tuple(c),
                temperature=t,
                top_p=top_p,
                top_k=top_k,
                sampling_seed=1_000_003 * k + 7,
                logprobs=tuple(0.0 for _ in c),
            )
        )
    return out


def _assert_same(got, want, exact):
    """Equal replays: to the bit (log-probs: float64 sums in another order) when the head
    saw the same rows at once; else within float32 rounding of the logits, since a CPU
    matmul rounds a row differently with the number of rows it is given."""
    tol = 1e-12 if exact else 1e-5
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(np.isinf(g.margins), np.isinf(w.margins))
        fin = ~np.isinf(w.margins)
        if exact:
            assert np.array_equal(g.margins, w.margins)
        np.testing.assert_allclose(g.margins[fin], w.margins[fin], rtol=0, atol=tol)
        assert np.array_equal(np.isnan(g.logprobs), np.isnan(w.logprobs))
        ok = ~np.isnan(w.logprobs)
        np.testing.assert_allclose(g.logprobs[ok], w.logprobs[ok], rtol=0, atol=tol)


def _compare(model, bodies, monkeypatch, rows_per_chunk):
    """Chunked replay (shared and plain prefill; the numpy and the torch rule) against
    the full-logits replay."""
    seqs = [(b.prompt_ids, b.completion_ids) for b in bodies]
    vocab = int(model.get_output_embeddings().weight.shape[0])
    monkeypatch.setattr(head, "CHUNK_VALUES", rows_per_chunk * vocab)
    for share, full, numpy_rule in (
        (True, prefill_shared, True),
        (False, prefill, True),
        (True, prefill_shared, False),
    ):
        monkeypatch.setattr(head, "NUMPY_ON_CPU", numpy_rule)
        want = checks.replay_many([lg for _, lg in full(model, seqs)], bodies)
        rows = hidden_rows(model, seqs, share_prompts=share)
        with torch.inference_mode():
            got = head.replay_hidden(model.get_output_embeddings(), rows, bodies)
        one_chunk = rows_per_chunk >= rows.shape[0] and len({b.temperature for b in bodies}) == 1
        _assert_same(got, want, exact=one_chunk)


def test_chunked_replay_equals_the_full_logits_replay_on_the_micro_policy(env, monkeypatch):
    base = env["opened"][0].body
    seqs = [(ro.body.prompt_ids, ro.body.completion_ids) for ro in env["opened"]]
    bodies = _bodies(base, seqs + seqs[:4])  # every body under several settings
    # honest tokens: the records' own bodies, whose margins are 0
    honest = [ro.body for ro in env["opened"]]
    for rows_per_chunk in (1, 7, 10_000):
        _compare(env["model"], bodies + honest, monkeypatch, rows_per_chunk)
    _compare(env["model"], honest, monkeypatch, 10_000)  # one chunk: the same to the bit


def test_a_token_outside_the_vocabulary_gets_an_infinite_margin(env):
    model = env["model"]
    b = env["opened"][0].body
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rows = hidden_rows(model, [(b.prompt_ids, b.completion_ids)])
    bad = dataclasses.replace(b, completion_ids=(vocab + 3, *b.completion_ids[1:]))
    with torch.inference_mode():
        (rep,) = head.replay_hidden(model.get_output_embeddings(), rows, [bad])
    assert rep.margins[0] == np.inf and np.isnan(rep.logprobs[0])
    assert np.all(np.isfinite(rep.margins[1:]))


@pytest.fixture(scope="module")
def qwen_shape():
    """A Qwen2 of `qwen2-test`'s shape (vocabulary 151,936), random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.shaped_model import shape_of

    s = shape_of("qwen2-test")
    cfg = Qwen2Config(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions,
        tie_word_embeddings=s.tied,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def test_chunked_replay_equals_the_full_logits_replay_on_the_qwen2_test_shape(
    qwen_shape, env, monkeypatch
):
    model = qwen_shape
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, vocab, size=9).tolist()
    seqs = [(prompt, rng.integers(0, vocab, size=n).tolist()) for n in (12, 5, 17)]
    seqs.append((rng.integers(0, vocab, size=4).tolist(), rng.integers(0, vocab, size=8).tolist()))
    bodies = _bodies(env["opened"][0].body, seqs)
    # honest tokens too: each completion's tokens chosen by the rule on the full logits
    logits = prefill(model, seqs)
    for k, (b, (_, lg)) in enumerate(zip(bodies, logits, strict=True)):
        toks, _ = sampling.sample_tokens(
            lg,
            temperature=b.temperature,
            top_p=b.top_p,
            top_k=b.top_k,
            seeds=[b.sampling_seed] * len(lg),
            steps=list(range(len(lg))),
        )
        if k % 2 == 0:
            bodies[k] = dataclasses.replace(b, completion_ids=tuple(int(t) for t in toks))
    _compare(model, bodies, monkeypatch, 5)


def test_recorded_logprobs_from_hidden_rows_equal_the_full_logits_ones(qwen_shape, monkeypatch):
    model = qwen_shape
    vocab = int(model.get_output_embeddings().weight.shape[0])
    monkeypatch.setattr(head, "CHUNK_VALUES", 3 * vocab)
    rng = np.random.default_rng(2)
    seqs = [
        (rng.integers(0, vocab, 6).tolist(), rng.integers(0, vocab, n).tolist()) for n in (7, 4)
    ]
    full = prefill(model, seqs)
    rows = hidden_rows(model, seqs, share_prompts=False)
    for t, top_p, top_k in SETTINGS:
        s = SamplingSettings(temperature=t, top_p=top_p, top_k=top_k, max_new_tokens=32)
        with torch.inference_mode():
            got = head.logprobs_hidden(model.get_output_embeddings(), rows, [c for _, c in seqs], s)
        for g, (_, c), (_, lg) in zip(got, seqs, full, strict=True):
            want = recorded_logprobs(lg, c, s, 0)
            np.testing.assert_allclose(g, want, rtol=0, atol=1e-6)


def test_sample_tokens_torch_equals_the_numpy_rule():
    rng = np.random.default_rng(5)
    x = rng.normal(scale=2.0, size=(12, 300)).astype(np.float32)
    x[3, :10] = x[3, 0]  # exact ties
    seeds = [int(s) for s in rng.integers(0, 2**63, size=12)]
    steps = list(range(12))
    for t, top_p, top_k in SETTINGS:
        want_t, want_lp = sampling.sample_tokens(
            x, temperature=t, top_p=top_p, top_k=top_k, seeds=seeds, steps=steps
        )
        got_t, got_lp = sampling.sample_tokens_torch(
            torch.from_numpy(x), temperature=t, top_p=top_p, top_k=top_k, seeds=seeds, steps=steps
        )
        assert got_t.tolist() == want_t.tolist()
        np.testing.assert_allclose(got_lp, want_lp, rtol=0, atol=1e-6)


def test_an_audit_never_applies_the_head_to_more_than_a_chunk_of_rows(env, monkeypatch):
    model = env["model"]
    lm_head = model.get_output_embeddings()
    vocab = int(lm_head.weight.shape[0])
    rows_per_chunk = 8
    monkeypatch.setattr(head, "CHUNK_VALUES", rows_per_chunk * vocab)
    seen: list[int] = []
    noise: list[int] = []
    hook = lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.numel() // vocab))
    real_noise = sampling.gumbel_noise_batch

    def counting_noise(seeds, steps, vocab_size):
        noise.append(len(seeds))
        return real_noise(seeds, steps, vocab_size)

    monkeypatch.setattr(sampling, "gumbel_noise_batch", counting_noise)
    try:
        results = audit_records(env["opened"], model, judge=env["judge"], settings=env["settings"])
    finally:
        hook.remove()
    assert all(r.passed for r in results)
    total = sum(len(ro.body.completion_ids) for ro in env["opened"])
    assert total > rows_per_chunk and sum(seen) >= total
    assert max(seen) <= rows_per_chunk, seen
    assert noise and max(noise) <= rows_per_chunk


def test_noise_rows_is_the_same_on_the_numpy_and_the_torch_branch():
    seeds = np.array([0, 1, 2**64 - 1, 12345678901234567], dtype=np.uint64)
    steps = np.array([0, 7, 2**32 - 1, 1023])
    cpu = sampling.noise_rows(seeds, steps, 1001, "cpu")  # numpy's rounds
    portable = sampling.gumbel_noise_torch([int(s) for s in seeds], steps.tolist(), 1001)
    assert torch.equal(cpu, portable)
