"""Record files that should fail do fail, with a reason and a non-zero exit: truncated
streams, trailing garbage, empty files, oversized records; one bad item fails alone and
the records around it are still audited. Per-record token limits are enforced."""

from __future__ import annotations

import dataclasses
import io
import json

import msgpack
import pytest

from node.commands import audit as audit_cmd
from protocol.rollout import write_records
from protocol.wire import RolloutRecord
from verify.auditor import audit_records

pytestmark = pytest.mark.slow  # builds a tokenizer and a model, generates rollouts


def _file(env, name, data: bytes):
    path = env["root"] / name
    path.write_bytes(data)
    return path


def _stream(records) -> bytes:
    buf = io.BytesIO()
    write_records(buf, records)
    return buf.getvalue()


def _run(env, path):
    out = io.StringIO()
    code = audit_cmd.main([path], str(env["model_dir"]), as_json=True, manifest=env["run"], out=out)
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


OVERSIZED = msgpack.packb(b"\x00" * (RolloutRecord.MAX_BYTES + 1), use_bin_type=True)


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (b"\xc4\x80", "stream-truncated"),  # a bin header promising 128 bytes, then the end
        (b"\xc6\x00\x00\x10\x00abc", "stream-truncated"),
        (b"\x93\x01\x02\x03 garbage", "stream-garbage"),  # not a msgpack bin
        (OVERSIZED, "record-too-large"),
    ],
)
def test_bad_tail_fails_alone_after_the_good_records(env, tail, reason):
    path = _file(env, f"tail-{reason}.msgpack", _stream(env["records"][:2]) + tail)
    code, lines = _run(env, path)
    assert code == 1
    assert [x["passed"] for x in lines] == [True, True, False]
    assert lines[2]["reason"] == reason and lines[2]["detail"]


def test_oversized_record_fails_alone_and_the_rest_is_audited(env):
    data = _stream(env["records"][:1]) + OVERSIZED + _stream(env["records"][1:3])
    code, lines = _run(env, _file(env, "oversized.msgpack", data))
    assert code == 1
    assert [(x["passed"], x["reason"]) for x in lines] == [
        (True, "ok"),
        (False, "record-too-large"),
        (True, "ok"),
        (True, "ok"),
    ]


@pytest.mark.parametrize(
    ("data", "reason"), [(b"", "stream-empty"), (b"\x93\x01\x02\x03 not records", "stream-garbage")]
)
def test_file_without_records_fails(env, data, reason):
    code, lines = _run(env, _file(env, f"{reason}.msgpack", data))
    assert code == 1 and [x["reason"] for x in lines] == [reason]


def test_scan_reports_each_problem_once():
    from protocol.rollout import scan_records

    good = [b"a" * 10, b"b" * 300, b"c" * 70_000]
    items = list(scan_records(io.BytesIO(_stream(good) + b"\xc5\x01")))
    assert [i.record for i in items[:3]] == good
    assert items[3].record is None and items[3].problem == "stream-truncated"
    assert len(items) == 4


def test_per_record_token_limit(env):
    ro = env["opened"][0]
    n = len(ro.body.prompt_ids) + len(ro.body.completion_ids)
    settings = dataclasses.replace(env["settings"], max_record_tokens=n - 1)
    (res,) = audit_records([ro], env["model"], judge=env["judge"], settings=settings)
    assert res.reason == "too-large" and str(n - 1) in res.detail
