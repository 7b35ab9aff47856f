"""Calibration is an artifact: `swarm-node calibrate` writes the limits next to the model,
the audit command uses that file (and no other limits), and a run that pins its digest
refuses any other file."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace

import pytest

from node.commands import audit as audit_cmd
from node.commands import calibrate as calibrate_cmd
from node.errors import CommandError
from node.run_file import load_run_manifest, manifest_to_toml
from protocol.rollout import write_records
from tests.support.audit_env import open_records_file, rank1_change, records_file
from verify.calibration import (
    FILE_NAME,
    CalibrationError,
    calibration_digest,
    decode_calibration,
    encode_calibration,
)
from verify.thresholds import STRICT, STRICT_FLOOR

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


@pytest.fixture(scope="module")
def calibrated(env):
    result = calibrate_cmd.calibrate_dir(env["model_dir"], n=4, say=lambda _m: None)
    return result


def test_calibrate_writes_the_limits_next_to_the_model(env, calibrated):
    data = (env["model_dir"] / FILE_NAME).read_bytes()
    assert calibrated["calibration_digest"] == calibration_digest(data).hex()
    cal = decode_calibration(data, bytes.fromhex(calibrated["calibration_digest"]))
    assert set(cal.regimes) == {"fp32", "bf16"}
    assert cal.measured["bf16"]["rollouts"] == 4 * len(calibrate_cmd.VARIATIONS)
    # limits are 2x the largest honest value (drift 1.5x), above the floors
    bf = cal.regimes["bf16"]
    # (the file's measured max is rounded to 6 decimals; the limit came from the exact one)
    assert bf.drift >= 1.5 * (cal.measured["bf16"]["max"]["drift"] - 5e-7)
    assert cal.regimes["fp32"].drift >= STRICT_FLOOR.drift
    assert cal.regimes["fp32"].drift >= 1.5 * (cal.measured["fp32"]["max"]["drift"] - 5e-7)


def _audit(env, files, manifest=None, model_dir=None):
    out = io.StringIO()
    code = audit_cmd.main(
        files, str(model_dir or env["model_dir"]), as_json=True, manifest=manifest, out=out
    )
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


def test_the_audit_uses_the_models_calibration_file(env, calibrated, tmp_path):
    cheat_model = rank1_change(env["model"], 0.03)
    cheat = open_records_file(
        records_file(env, cheat_model, "cal-rank1.msgpack", n=4, start_counter=100)
    )
    path = tmp_path / "cheat.msgpack"
    with open(path, "wb") as f:
        write_records(f, [ro.record for ro in cheat])
    code, lines = _audit(env, [path], manifest=env["run"])
    assert code == 1 and not any(x["passed"] for x in lines)
    # the same records against a copy of the model whose file allows anything
    loose_dir = tmp_path / "loose-model"
    shutil.copytree(env["model_dir"], loose_dir)
    huge = replace(
        STRICT,
        **{
            k: 1e9
            for k in (
                "proof_exp_mismatch_frac",
                "proof_mant_mean",
                "proof_mant_median",
                "proof_exp_mismatch_frac_all",
                "proof_mant_mean_all",
                "sampling_margin",
                "logprob_err_max",
                "logprob_err_mean",
                "drift",
            )
        },
        proof_sign_mismatches=10**6,
        sampling_near_ties_max=10**6,
    )
    (loose_dir / FILE_NAME).write_bytes(encode_calibration({"fp32": huge}, {}, "loose"))
    code, lines = _audit(env, [path], manifest=env["run"], model_dir=loose_dir)
    assert code == 0, [x["reason"] for x in lines]


def test_a_pinned_digest_refuses_another_file(env, calibrated, tmp_path):
    path = tmp_path / "ok.msgpack"
    with open(path, "wb") as f:
        write_records(f, env["records"][:1])
    run = load_run_manifest(env["run"])
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(
        manifest_to_toml(
            replace(run, calibration_digest=bytes.fromhex(calibrated["calibration_digest"]))
        )
    )
    assert _audit(env, [path], manifest=pinned)[0] == 0
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(manifest_to_toml(replace(run, calibration_digest=bytes(32))))
    with pytest.raises(CommandError, match="calibration digest") as exc:
        _audit(env, [path], manifest=wrong)
    assert exc.value.exit_code == 2
    bare = tmp_path / "bare-model"
    shutil.copytree(env["model_dir"], bare)
    (bare / FILE_NAME).unlink()
    with pytest.raises(CommandError, match="calibrate"):
        _audit(env, [path], manifest=pinned, model_dir=bare)


@pytest.mark.parametrize(
    "data", [b"", b"{", b'{"format": 2}', b'{"format": 1, "regimes": {"fp32": {"drift": -1}}}']
)
def test_unusable_files_are_refused(data):
    with pytest.raises(CalibrationError):
        decode_calibration(data)


def test_calibrate_runs_at_the_runs_completion_length_and_precision(env, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(env["model_dir"], model_dir)
    run = replace(env["manifest"], max_new_tokens=56, worker_precision="bf16")
    path = tmp_path / "run.toml"
    path.write_text(manifest_to_toml(run))
    result = calibrate_cmd.main(model=str(model_dir), n=4, run=str(path))
    assert result["max_new_tokens"] == 56 and result["precisions"] == ["bf16"]
    cal = decode_calibration((model_dir / FILE_NAME).read_bytes())
    assert set(cal.regimes) == {"bf16"}
    assert cal.measured["bf16"]["max_new_tokens"] == 56
    assert cal.measured["bf16"]["judged_on"] == "cpu"
    with pytest.raises(CommandError, match="missing.toml"):
        calibrate_cmd.main(model=str(model_dir), n=4, run=str(tmp_path / "missing.toml"))
