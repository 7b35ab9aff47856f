"""CPU engine and model directories: seeded generation is reproducible across batch sizes
and thread counts, hidden states and log-probs match a verifier's prefill, saved model
directories reload to identical logits, and bad directories give one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trainer.engine import SamplingSettings
from trainer.engine_hf import HFEngine
from trainer.model_dir import ModelDirError, load_model_dir, save_model_dir
from trainer.tasks import TaskSet
from trainer.tiny_policy import build_model, build_tokenizer
from verify.sampling import sample_tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A randomly initialised micro Qwen2 (hidden 64, 2 layers) saved as a model dir."""
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=1,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    path = save_model_dir(model, tok, tmp_path_factory.mktemp("micro") / "model")
    return model, tok, path


def _prompts(tok, n=5):
    tasks = TaskSet(1)
    names = ["tiny-chain-sum", "tiny-products", "tiny-gcd"]
    prompts = [
        tok.encode(tasks.task(names[i % 3], i).prompt, add_special_tokens=False) for i in range(n)
    ]
    if n > 1:
        prompts[1] = prompts[1][:7]  # different lengths exercise left padding
    return prompts


SETTINGS = SamplingSettings(temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=12)


@pytest.mark.slow
def test_same_seed_same_tokens_across_batch_sizes_and_threads(tiny):
    model, tok, _ = tiny
    prompts = _prompts(tok)
    seeds = [5, 6, 7, 8, 2**64 - 1]
    ref = HFEngine(model, tok, max_batch=8, threads=2).generate(prompts, SETTINGS, seeds)
    for max_batch, threads in [(1, 1), (2, 1), (3, 2)]:
        eng = HFEngine(model, tok, max_batch=max_batch, threads=threads)
        got = eng.generate(prompts, SETTINGS, seeds)
        assert [g.completion_ids for g in got] == [g.completion_ids for g in ref]
        for a, b in zip(got, ref, strict=True):
            assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
            assert torch.allclose(a.hidden, b.hidden, atol=1e-4)
    # a different seed changes the tokens; the same seed in another order does not
    other = HFEngine(model, tok).generate(prompts, SETTINGS, [s ^ 1 for s in seeds])
    assert [g.completion_ids for g in other] != [g.completion_ids for g in ref]
    rev = HFEngine(model, tok).generate(prompts[::-1], SETTINGS, seeds[::-1])
    assert [g.completion_ids for g in rev[::-1]] == [g.completion_ids for g in ref]


def test_outputs_match_a_verifier_prefill(tiny):
    model, tok, _ = tiny
    prompts = _prompts(tok, 3)
    seeds = [11, 12, 13]
    gens = HFEngine(model, tok).generate(prompts, SETTINGS, seeds)
    for p, g, seed in zip(prompts, gens, seeds, strict=True):
        t = len(g.completion_ids)
        assert g.hidden.shape == (t, model.config.hidden_size) and len(g.logprobs) == t
        assert g.finish_reason in ("eos", "length")
        if g.finish_reason == "length":
            assert t == SETTINGS.max_new_tokens
        ids = torch.tensor([p + g.completion_ids])
        with torch.no_grad():
            h = model.base_model(input_ids=ids).last_hidden_state[0, len(p) - 1 : len(p) + t - 1]
            logits = model.get_output_embeddings()(h)
        assert torch.allclose(h, g.hidden, atol=1e-4)
        assert g.hidden.to(torch.bfloat16).shape == h.shape
        toks, lps = sample_tokens(
            logits,
            temperature=SETTINGS.temperature,
            top_p=SETTINGS.top_p,
            top_k=SETTINGS.top_k,
            seeds=[seed] * t,
            steps=list(range(t)),
        )
        assert toks.tolist() == g.completion_ids
        assert np.allclose(lps, g.logprobs, atol=1e-4)


def test_eos_stops_and_greedy_and_multinomial(tiny):
    model, tok, _ = tiny
    prompts = _prompts(tok, 4)
    seeds = [1, 2, 3, 4]
    eng = HFEngine(model, tok)
    ref = eng.generate(prompts, SETTINGS, seeds)
    # declare a token sample 0 draws at step 3 an EOS: every sample stops at its first
    # occurrence, and the tokens before it are unchanged (rows leave the batch cleanly)
    stop = ref[0].completion_ids[3]
    eng.eos_token_ids = frozenset([stop])
    got = eng.generate(prompts, SETTINGS, seeds)
    for a, b in zip(ref, got, strict=True):
        if stop in a.completion_ids:
            k = a.completion_ids.index(stop)
            assert b.completion_ids == a.completion_ids[: k + 1] and b.finish_reason == "eos"
        else:
            assert b.completion_ids == a.completion_ids and b.finish_reason == "length"
        assert torch.allclose(b.hidden, a.hidden[: len(b.completion_ids)], atol=1e-5)
    eng.eos_token_ids = frozenset(range(len(tok)))
    assert all(
        len(g.completion_ids) == 1 and g.finish_reason == "eos"
        for g in eng.generate(prompts, SETTINGS, seeds)
    )
    eng = HFEngine(model, tok)
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=6)
    a = eng.generate(prompts, greedy, [1, 2, 3, 4])
    b = eng.generate(prompts, greedy, [5, 6, 7, 8])
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
    assert all(lp == 0.0 for x in a for lp in x.logprobs)
    m = HFEngine(model, tok, sampler="multinomial").generate(
        prompts, SETTINGS, seeds, capture_hidden=False
    )
    assert all(x.hidden is None and len(x.completion_ids) >= 1 for x in m)


def test_bad_generate_arguments(tiny):
    model, tok, _ = tiny
    eng = HFEngine(model, tok)
    with pytest.raises(ValueError):
        eng.generate([[1, 2]], SETTINGS, [1, 2])
    with pytest.raises(ValueError):
        eng.generate([[]], SETTINGS, [1])
    with pytest.raises(ValueError):
        eng.generate([[10**6]], SETTINGS, [1])
    with pytest.raises(ValueError):
        SamplingSettings(temperature=1.0, top_p=0.0)


def test_saved_model_dir_reloads_to_identical_logits(tiny, tmp_path):
    model, tok, path = tiny
    again, tok2 = load_model_dir(path)
    ids = torch.tensor([_prompts(tok, 1)[0]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    assert tok2.encode("12 + 3", add_special_tokens=False) == tok.encode(
        "12 + 3", add_special_tokens=False
    )
    save_model_dir(again, tok2, tmp_path / "copy")
    third, _ = load_model_dir(tmp_path / "copy")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, third(input_ids=ids).logits)


def _broken_dirs(tmp_path, good):
    import shutil

    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    bad_json = shutil.copytree(good, tmp_path / "bad_json")
    (bad_json / "config.json").write_text("{nope")
    no_type = shutil.copytree(good, tmp_path / "no_type")
    (no_type / "config.json").write_text(json.dumps({"hidden_size": 3}))
    no_weights = shutil.copytree(good, tmp_path / "no_weights")
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    no_tok = shutil.copytree(good, tmp_path / "no_tok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink(missing_ok=True)
    corrupt = shutil.copytree(good, tmp_path / "corrupt")
    for f in corrupt.glob("*.safetensors"):
        f.write_bytes(b"\x00" * 16)
    return {
        "missing": (tmp_path / "nope", "does not exist"),
        "file": (tmp_path / "file", "not a directory"),
        "empty": (tmp_path / "empty", "no config.json"),
        "bad_json": (bad_json, "not readable JSON"),
        "no_type": (no_type, "no model_type"),
        "no_weights": (no_weights, "no weights"),
        "no_tok": (no_tok, "no tokenizer"),
        "corrupt": (corrupt, "cannot be loaded"),
    }


def test_bad_model_dirs_give_one_line_errors(tiny, tmp_path):
    for name, (path, needle) in _broken_dirs(tmp_path, tiny[2]).items():
        with pytest.raises(ModelDirError) as exc:
            load_model_dir(path)
        msg = str(exc.value)
        assert needle in msg and "\n" not in msg and str(path) in msg, (name, msg)
