"""The seeded Gumbel-max sampler: known-answer Philox, noise statistics, determinism,
filtering, log-probs, and independence from torch's RNG and batch layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verify.sampling import (
    filter_mask,
    gumbel_noise,
    gumbel_noise_batch,
    gumbel_noise_torch,
    perturbed_scores,
    philox4x32,
    sample_token,
    sample_tokens,
)

# Random123 known-answer vectors for philox4x32-10 (counter, key, expected).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert philox4x32(counter, key) == expected


def test_noise_is_a_pure_function_of_seed_step_and_index():
    a = gumbel_noise(12345, 7, 1000)
    torch.manual_seed(0)
    np.random.seed(0)
    b = gumbel_noise(12345, 7, 1000)
    assert a.dtype == np.float32 and a.shape == (1000,)
    assert np.array_equal(a, b)
    # a prefix of a larger vocabulary is the same noise
    assert np.array_equal(gumbel_noise(12345, 7, 37), a[:37])
    # other step, other seed, high seed bits: different noise
    assert not np.array_equal(a, gumbel_noise(12345, 8, 1000))
    assert not np.array_equal(a, gumbel_noise(12346, 7, 1000))
    assert not np.array_equal(a, gumbel_noise(12345 + 2**40, 7, 1000))
    # a batch row equals the single call
    batch = gumbel_noise_batch([1, 12345, 2**64 - 1], [0, 7, 3], 1000)
    assert np.array_equal(batch[1], a)
    assert np.array_equal(batch[2], gumbel_noise(2**64 - 1, 3, 1000))


def test_torch_noise_matches_numpy():
    seeds, steps = [3, 2**63 + 5, 99], [0, 11, 2**32 - 1]
    t = gumbel_noise_torch(seeds, steps, 257).numpy()
    assert np.array_equal(t, gumbel_noise_batch(seeds, steps, 257))


def test_noise_is_gumbel_distributed():
    g = gumbel_noise_batch(list(range(400)), 0, 500).astype(np.float64).ravel()
    assert abs(g.mean() - np.euler_gamma) < 0.01
    assert abs(g.std() - np.pi / np.sqrt(6)) < 0.01
    assert np.isfinite(g).all()


def test_sampling_frequencies_follow_softmax():
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    n = 20_000
    toks, _ = sample_tokens(np.tile(logits, (n, 1)), temperature=1.0, seeds=list(range(n)), steps=0)
    freq = np.bincount(toks, minlength=4) / n
    p = np.exp(logits) / np.exp(logits).sum()
    assert np.abs(freq - p).max() < 0.015


def test_logprob_is_log_softmax_of_the_sampled_distribution():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 50)).astype(np.float32)
    toks, lps = sample_tokens(x, temperature=0.7, seeds=[1, 2, 3, 4, 5], steps=3)
    ref = torch.log_softmax(torch.from_numpy(x).double() / 0.7, dim=-1)
    for i in range(5):
        assert lps[i] == pytest.approx(float(ref[i, toks[i]]), abs=1e-5)
    tok, lp = sample_token(x[2], temperature=0.7, seed=3, step=3)
    assert (tok, lp) == (int(toks[2]), float(lps[2]))


def test_top_k_and_top_p_filtering():
    z = np.array([[3.0, 1.0, 2.0, 0.0, 2.0]], dtype=np.float32)
    assert filter_mask(z, 2, 1.0).tolist() == [[True, False, True, False, False]]  # tie → lower id
    assert filter_mask(z, 0, 1.0).all()
    p = np.exp(z[0]) / np.exp(z[0]).sum()  # ≈ .50 .07 .18 .03 .18
    keep = filter_mask(z, 0, float(p[0]) + 0.01)
    assert keep.tolist() == [[True, False, True, False, False]]
    assert filter_mask(z, 0, 0.01).tolist() == [[True, False, False, False, False]]
    # sampled tokens always come from the kept set, log-probs renormalised over it
    x = np.tile(z, (500, 1))
    toks, lps = sample_tokens(x, temperature=1.0, top_k=2, seeds=list(range(500)), steps=0)
    assert set(toks.tolist()) == {0, 2}
    kept = np.log(np.exp(z[0, [0, 2]]) / np.exp(z[0, [0, 2]]).sum())
    assert np.allclose(lps[toks == 0], kept[0], atol=1e-6)


def test_greedy_and_margin():
    x = np.array([[0.0, 5.0, 1.0]], dtype=np.float32)
    toks, lps = sample_tokens(x, temperature=0.0, seeds=[9], steps=0)
    assert toks.tolist() == [1] and lps.tolist() == [0.0]
    scores, _ = perturbed_scores(x, temperature=1.0, top_p=1.0, top_k=0, seeds=[9], steps=[0])
    tok, _ = sample_token(x[0], temperature=1.0, seed=9, step=0)
    assert int(np.argmax(scores[0])) == tok


def test_token_choice_is_independent_of_batch_layout():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 300)).astype(np.float32)
    seeds = [11, 22, 33, 44, 55, 66]
    together, lp_t = sample_tokens(x, temperature=1.0, top_p=0.9, top_k=50, seeds=seeds, steps=4)
    alone = [
        sample_token(x[i], temperature=1.0, top_p=0.9, top_k=50, seed=s, step=4)
        for i, s in enumerate(seeds)
    ]
    assert together.tolist() == [t for t, _ in alone]
    assert lp_t.tolist() == [lp for _, lp in alone]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(temperature=1.0, top_p=0.0),
        dict(temperature=1.0, top_p=1.5),
        dict(temperature=1.0, seed=-1),
        dict(temperature=1.0, seed=2**64),
        dict(temperature=1.0, step=-1),
    ],
)
def test_bad_arguments_raise_value_error(kwargs):
    args = dict(temperature=1.0, top_p=1.0, top_k=0, seed=1, step=0)
    args.update(kwargs)
    with pytest.raises(ValueError):
        sample_token(np.zeros(8, dtype=np.float32), **args)


def test_batched_noise_equals_the_portable_philox_block_by_block():
    # the numpy path (uint64 products, rows in cache-sized slices) against the Random123
    # reference core one block at a time, at the edges of seeds and steps
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 + 12345, 2**64 - 1]
    steps = [0, 2**32 - 1, 5, 77, 2**31, 1]
    vocab = 10  # 3 blocks, the last one cut
    words = []
    for seed, step in zip(seeds, steps, strict=True):
        row = []
        for block in range(3):
            row += philox4x32((block, step, 0, 0x47554D42), (seed & 0xFFFFFFFF, seed >> 32))
        words.append(row[:vocab])
    u = (np.array(words, dtype=np.float64) + 0.5) / 2.0**32
    want = (-np.log(-np.log(u))).astype(np.float32)
    assert np.array_equal(
        gumbel_noise_batch(seeds, steps, vocab).view(np.uint32), want.view(np.uint32)
    )


def test_noise_is_the_same_across_row_slices(monkeypatch):
    import verify.sampling as sampling

    seeds, steps = list(range(50)), list(range(50))
    whole = gumbel_noise_batch(seeds, steps, 33)
    monkeypatch.setattr(sampling, "CACHE_SLICE_VALUES", 100)  # 3 rows a slice
    assert np.array_equal(gumbel_noise_batch(seeds, steps, 33), whole)


def test_noise_from_numpy_seeds_and_steps_equals_noise_from_lists():
    seeds, steps = [0, 7, 2**63 + 5, 2**64 - 1], [0, 3, 2**32 - 1, 12]
    want = gumbel_noise_batch(seeds, steps, 37)
    got = gumbel_noise_batch(np.array(seeds, dtype=np.uint64), np.array(steps, dtype=np.int64), 37)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError):
        gumbel_noise_batch(np.array(seeds, dtype=np.uint64), np.array([0, 1, -1, 2]), 37)
    with pytest.raises(ValueError):
        gumbel_noise_batch(np.array(seeds, dtype=np.uint64), np.array([0, 1, 2]), 37)
