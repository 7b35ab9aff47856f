"""Version-aware audits: a record is judged against the weights of the policy version it
claims; a version the auditor does not hold is `unknown-version`, never a pass."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from node.commands import audit as audit_cmd
from tests.support.audit_env import records_file

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


def _claiming(env, version, name):
    """Records made with the version-0 model, claiming `version`."""
    return records_file(env, env["model"], name, n=2, max_batch=4, policy_version=version)


def _audit(env, files, **kw):
    out = io.StringIO()
    code = audit_cmd.main(
        files, str(env["model_dir"]), as_json=True, manifest=env["run"], out=out, **kw
    )
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


@pytest.mark.parametrize("version", [2, 2**32 - 1])
def test_a_version_not_held_is_unknown_never_a_pass(env, version):
    code, lines = _audit(env, [_claiming(env, version, f"v{version}.msgpack")])
    assert code == 1 and [x["reason"] for x in lines] == ["unknown-version"] * 2


def test_versions_directory_supplies_the_claimed_weights(env, tmp_path):
    shutil.copytree(env["model_dir"], tmp_path / "versions" / "2")
    ok = env["root"] / "v0-ok.msgpack"
    ok.write_bytes(b"")
    with open(ok, "wb") as f:
        from protocol.rollout import write_records

        write_records(f, env["records"][:1])
    files = [_claiming(env, 2, "v2-held.msgpack"), _claiming(env, 3, "v3-missing.msgpack"), ok]
    code, lines = _audit(env, files, versions=tmp_path / "versions")
    assert [x["reason"] for x in lines] == ["ok", "ok", "unknown-version", "unknown-version", "ok"]
    assert code == 1
