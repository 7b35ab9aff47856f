"""Built-in tiny policy: deterministic tokenizer, model and warm start; the cache; and
init-model then rollouts with the built-in model (a shortened warm start keeps it fast)."""

from __future__ import annotations

import json

import pytest
import torch

from trainer import tiny_policy as tp
from trainer.model_dir import load_model_dir


def test_tokenizer_is_deterministic_and_splits_digits(tok):
    again = tp.build_tokenizer(0)
    assert tok.get_vocab() == again.get_vocab()
    ids = tok.encode("<answer>-128</answer>", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[0] == "<answer>" and pieces[-1] == "</answer>"
    assert pieces[2:5] == ["1", "2", "8"]
    assert tok.decode(ids) == "<answer>-128</answer>"
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert len(tok) <= tp.VOCAB_SIZE


def test_model_init_is_deterministic(tok):
    a, b = tp.build_model(tok, seed=4), tp.build_model(tok, seed=4)
    c = tp.build_model(tok, seed=5)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert type(a).__name__ == "Qwen2ForCausalLM" and a.config.vocab_size == len(tok)


@pytest.fixture
def short_recipe(monkeypatch):
    """A few small steps instead of the full warm start."""
    for name, value in dict(
        BATCH=8,
        MAX_STEPS=4,
        EVAL_EVERY=2,
        EVAL_TASKS=8,
        FINAL_EVAL_TASKS=8,
        TOKENIZER_TEXTS=300,
    ).items():
        monkeypatch.setattr(tp, name, value)


def test_warm_start_is_deterministic_for_a_seed(tok, short_recipe):
    runs = []
    for _ in range(2):
        model = tp.build_model(
            tok, seed=1, hidden_size=32, intermediate_size=64, num_hidden_layers=1
        )
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rep = tp.warm_start(model, tok, seed=3, max_steps=4, threads=1)
        runs.append((model.state_dict(), rep))
    (s1, r1), (s2, r2) = runs
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], before[k]) for k in s1)  # it did train
    assert r1.steps == 4 and r1.evals == r2.evals and r1.solve_rate == r2.solve_rate
    assert 0.0 <= r1.solve_rate <= 1.0 and r1.n_params == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_init_model_caches_and_rollouts_use_it(tmp_path, monkeypatch, short_recipe, capsys):
    import functools

    from node.commands import calibrate, init_model, rollouts
    from node.keyfile import write_key
    from protocol.identity import Identity
    from protocol.rollout import open_record, read_records

    monkeypatch.setenv("SWARM_NODE_DATA", str(tmp_path / "data"))
    # init-model calibrates the audit limits: on a few rollouts here (calibration itself is
    # tests/test_verify_calibration.py's)
    monkeypatch.setattr(calibrate, "calibrate_dir", functools.partial(calibrate.calibrate_dir, n=4))
    first = init_model.main(quiet=True)
    assert first["built"] and first["model_dir"].startswith(str(tmp_path / "data"))
    report = json.loads((tp.policy_dir() / "warm_start.json").read_text())
    assert report["steps"] == 4 and report["recipe"] == tp.RECIPE
    model, tok2 = load_model_dir(first["model_dir"])
    assert type(model).__name__ == "Qwen2ForCausalLM"
    second = init_model.main(quiet=True)
    assert not second["built"] and second["model_dir"] == first["model_dir"]
    key = tmp_path / "k.pem"
    write_key(key, Identity.generate())
    out = tmp_path / "r.msgpack"
    summary = rollouts.main(run=first["run_manifest"], key=key, n=4, out=out, quiet=True)
    assert summary["n"] == 4 and summary["model"] == first["model_dir"]
    with open(out, "rb") as f:
        assert len([open_record(r) for r in read_records(f)]) == 4
    capsys.readouterr()


def test_worked_solutions_show_steps_and_score_full_marks(tok):
    from trainer.tasks import TaskSet

    tasks = TaskSet(7)
    lengths = []
    for name, _w in tp.TASK_MIX:
        for i in range(60):
            t = tasks.task(name, i)
            text = tp.worked_solution(t)
            assert tasks.score(t, text).reward == 1.0
            assert "\n<answer>" in text  # working first, then the answer
            lengths.append(len(tok.encode(text, add_special_tokens=False)) + 1)  # + EOS
    t = tasks.task("tiny-chain-sum-4", 0)
    lines = tp.worked_solution(t).splitlines()
    assert len(lines) == 4 and lines[1].split(" = ")[0].split()[0] == lines[0].split(" = ")[1]
    assert sum(lengths) / len(lengths) >= 24
