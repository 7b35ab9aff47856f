"""The run fixes the workers' compute precision and the audit judges at that precision
only: no second, looser pass for a record that fails (a cheater would get the other
regime's budget). The manifest carries the precision."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from node.errors import CommandError
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.rollout import open_record, read_records
from trainer.engine_hf import HFEngine
from trainer.produce import generate_records
from trainer.tiny_policy import run_manifest_table
from verify import toploc
from verify.auditor import audit_records

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


def _records(env, model, name, n=8):
    out = env["root"] / name
    generate_records(
        engine=HFEngine(model, env["tok"], max_batch=n),
        manifest=env["manifest"],
        identity=env["identity"],
        n=n,
        out=out,
        start_counter=100,
        build_proofs=toploc.build_proofs_bytes_many,
        say=lambda _m: None,
    )
    with open(out, "rb") as f:
        return [open_record(r) for r in read_records(f)]


def _rank1(model, rel, layer=0, seed=0):
    """A rank-1 change of relative Frobenius size `rel` to one layer's down_proj."""
    m = copy.deepcopy(model)
    w = m.base_model.layers[layer].mlp.down_proj.weight
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(w.shape[0], 1, generator=g), torch.randn(1, w.shape[1], generator=g)
    with torch.no_grad():
        w.add_(u @ v * (rel * w.norm() / (u @ v).norm()))
    return m


def _settings(env, precision):
    return dataclasses.replace(env["settings"], precision=precision)


def test_bf16_worker_fails_an_fp32_run(env):
    opened = _records(
        env, copy.deepcopy(env["model"]).to(torch.bfloat16), "bf16-in-fp32-run.msgpack"
    )
    results = audit_records(
        opened, env["model"], judge=env["judge"], settings=_settings(env, "fp32")
    )
    assert not any(r.passed for r in results), [r.reason for r in results]


def test_perturbed_fp32_worker_gets_no_looser_second_pass(env):
    opened = _records(env, _rank1(env["model"], 0.10), "rank1.msgpack")
    results = audit_records(
        opened, env["model"], judge=env["judge"], settings=_settings(env, "fp32")
    )
    assert not any(r.passed for r in results), [r.reason for r in results]
    assert {r.metrics["audit_precision_bits"] for r in results} == {32.0}


def test_bf16_run_judges_bf16_workers_at_bf16(env):
    opened = _records(env, copy.deepcopy(env["model"]).to(torch.bfloat16), "bf16-run.msgpack")
    results = audit_records(
        opened, env["model"], judge=env["judge"], settings=_settings(env, "bf16")
    )
    assert all(r.passed for r in results), [r.detail for r in results]
    assert {r.metrics["audit_precision_bits"] for r in results} == {16.0}


def test_manifest_states_the_precision():
    table = run_manifest_table(run_id="p", seed=1)
    assert manifest_from_table(table).worker_precision == "fp32"
    table["verification"] = {"precision": "bf16"}
    m = manifest_from_table(table)
    assert m.worker_precision == "bf16"
    assert manifest_from_table(__import__("tomllib").loads(manifest_to_toml(m))) == m
    table["verification"] = {"precision": "fp8"}
    with pytest.raises(CommandError, match="verification.precision"):
        manifest_from_table(table)
