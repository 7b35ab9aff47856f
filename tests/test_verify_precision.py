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
from tests.support.audit_env import open_records_file, rank1_change, records_file
from trainer.tiny_policy import run_manifest_table
from verify.auditor import audit_records

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


def _opened_records(env, model, name, n=8):
    return open_records_file(records_file(env, model, name, n=n, start_counter=100))


def _settings(env, precision):
    return dataclasses.replace(env["settings"], precision=precision)


def test_bf16_worker_fails_an_fp32_run(env):
    opened = _opened_records(
        env, copy.deepcopy(env["model"]).to(torch.bfloat16), "bf16-in-fp32-run.msgpack"
    )
    results = audit_records(
        opened, env["model"], judge=env["judge"], settings=_settings(env, "fp32")
    )
    assert not any(r.passed for r in results), [r.reason for r in results]


def test_perturbed_fp32_worker_gets_no_looser_second_pass(env):
    opened = _opened_records(env, rank1_change(env["model"], 0.10), "rank1.msgpack")
    results = audit_records(
        opened, env["model"], judge=env["judge"], settings=_settings(env, "fp32")
    )
    assert not any(r.passed for r in results), [r.reason for r in results]
    assert {r.metrics["audit_precision_bits"] for r in results} == {32.0}


def test_bf16_run_judges_bf16_workers_at_bf16(env):
    opened = _opened_records(
        env, copy.deepcopy(env["model"]).to(torch.bfloat16), "bf16-run.msgpack"
    )
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
