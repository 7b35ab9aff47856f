"""`rollouts` end to end on a micro random model: signed records that open, re-derive and
replay; bad --model paths, key files and manifests give one-line errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from node.commands import rollouts
from node.errors import CommandError
from node.keyfile import write_key
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from protocol.rollout import open_record, read_records
from trainer.model_dir import save_model_dir
from trainer.tasks import TaskSet, assign_task
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table
from verify.sampling import sample_tokens

try:
    from verify.toploc import verify_proofs_bytes  # noqa: F401

    HAVE_TOPLOC = True
except ImportError:  # pragma: no cover
    HAVE_TOPLOC = False


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollouts")
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model_dir = save_model_dir(model, tok, root / "model")
    table = run_manifest_table(run_id="test-run", seed=5)
    table["sampling"]["max_new_tokens"] = 40  # > one proof chunk of 32 when no EOS comes
    run = root / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    key = root / "key.pem"
    identity = Identity.generate()
    write_key(key, identity)
    return dict(
        root=root, model=model, tok=tok, model_dir=model_dir, run=run, key=key, identity=identity
    )


def test_records_open_rederive_and_replay(setup, capsys):
    out = setup["root"] / "r.msgpack"
    summary = rollouts.main(
        run=setup["run"],
        key=setup["key"],
        n=6,
        out=out,
        model=str(setup["model_dir"]),
        batch_size=4,
        quiet=True,
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 6
    assert (
        summary["n"] == 6 and 0.0 <= summary["reward_mean"] <= 1.0 and summary["tokens_per_s"] > 0
    )
    manifest = load_run_manifest(setup["run"])
    tasks = TaskSet(manifest.seed)
    tok, model = setup["tok"], setup["model"]
    with open(out, "rb") as f:
        records = [open_record(r) for r in read_records(f)]
    assert [r.header.counter for r in records] == list(range(6))
    for r in records:
        h, b = r.header, r.body
        assert r.envelope.signer == setup["identity"].peer_id and r.envelope.run_id == "test-run"
        a = assign_task(manifest, r.envelope.signer, h.counter)
        assert (a.dataset, a.task_index, a.task_seed) == (h.dataset, h.task_index, h.task_seed)
        assert b.sampling_seed == h.task_seed
        task = tasks.task_for(a)
        assert list(b.prompt_ids) == tok.encode(task.prompt, add_special_tokens=False)
        text = tok.decode(list(b.completion_ids), skip_special_tokens=True)
        assert h.reward == tasks.score(task, text).reward
        assert len(b.logprobs) == len(b.completion_ids) and all(lp <= 0 for lp in b.logprobs)
        assert (b.temperature, b.top_p, b.top_k, b.max_new_tokens) == (
            manifest.temperature,
            manifest.top_p,
            manifest.top_k,
            manifest.max_new_tokens,
        )
        # replay the sampler on a verifier's prefill
        t = len(b.completion_ids)
        ids = torch.tensor([list(b.prompt_ids) + list(b.completion_ids)])
        with torch.no_grad():
            hid = model.base_model(input_ids=ids).last_hidden_state[
                0, h.n_prompt - 1 : h.n_prompt + t - 1
            ]
            logits = model.get_output_embeddings()(hid)
        toks, _ = sample_tokens(
            logits,
            temperature=b.temperature,
            top_p=b.top_p,
            top_k=b.top_k,
            seeds=[b.sampling_seed] * t,
            steps=list(range(t)),
        )
        assert toks.tolist() == list(b.completion_ids)
        if HAVE_TOPLOC:
            assert len(b.proofs) == math.ceil(t / manifest.proof_chunk)
            results = verify_proofs_bytes(
                hid, list(b.proofs), chunk=manifest.proof_chunk, topk=manifest.proof_topk
            )
            assert len(results) == len(b.proofs)
            assert all(c.exp_mismatches <= 38 for c in results)


def test_same_inputs_same_records_apart_from_time(setup):
    outs = []
    for name in ("a", "b"):
        out = setup["root"] / f"{name}.msgpack"
        rollouts.main(
            run=setup["run"],
            key=setup["key"],
            n=3,
            out=out,
            model=str(setup["model_dir"]),
            batch_size=3 if name == "a" else 1,
            quiet=True,
            proofs=False,
        )
        with open(out, "rb") as f:
            outs.append([open_record(r).body for r in read_records(f)])
    assert [b.completion_ids for b in outs[0]] == [b.completion_ids for b in outs[1]]


def _err(**kw) -> str:
    with pytest.raises(CommandError) as exc:
        rollouts.main(quiet=True, **kw)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bad_inputs_give_one_line_errors(setup, tmp_path, monkeypatch):
    base = dict(
        run=setup["run"], key=setup["key"], n=2, out=tmp_path / "o", model=str(setup["model_dir"])
    )
    assert "does not exist" in _err(**{**base, "model": str(tmp_path / "missing")})
    assert "no config.json" in _err(**{**base, "model": str(tmp_path)})
    assert "--n" in _err(**{**base, "n": 0})
    assert "key file" in _err(**{**base, "key": tmp_path / "nokey"})
    assert "does not exist" in _err(**{**base, "out": tmp_path / "no" / "dir" / "o"})
    # built-in model not yet built in an empty data dir
    monkeypatch.setenv("SWARM_NODE_DATA", str(tmp_path / "data"))
    assert "swarm-node init-model" in _err(**{**base, "model": None})
    # manifests: refused task, unknown dataset, bad value, not TOML
    table = run_manifest_table()
    for change, needle in [
        (lambda t: t["datasets"].append({"name": "game_of_life_halting", "weight": 1}), "refused"),
        (lambda t: t["datasets"].append({"name": "no_such_task", "weight": 1}), "unknown dataset"),
        (lambda t: t["sampling"].update(top_p=1.5), "sampling.top_p"),
        (lambda t: t["sampling"].update(colour="red"), "sampling.colour"),
    ]:
        bad = run_manifest_table()
        change(bad)
        path = tmp_path / "bad.toml"
        lines = []
        for section in ("run", "sampling", "proofs"):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in bad[section].items()]
        for d in bad["datasets"]:
            lines += ["[[datasets]]", f'name = "{d["name"]}"', f"weight = {d['weight']}"]
        path.write_text("\n".join(lines) + "\n")
        assert needle in _err(**{**base, "run": path})
    (tmp_path / "junk.toml").write_text("[run\nid=")
    assert "not valid TOML" in _err(**{**base, "run": tmp_path / "junk.toml"})
    assert table  # the default table itself is valid (used above)
