"""Canonical codec: round trips for every wire object, strict decoding, limits, fuzzing."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.errors import DecodeError, LocalProtocolError, OversizeError
from protocol.fuzz import fuzz_decoders
from protocol.wire import ALL_OBJECTS, DatasetSpec, Metric, RolloutBody, Verdict
from tests.wire_strategies import for_class


@pytest.mark.parametrize("cls", ALL_OBJECTS, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip(cls, data):
    obj = data.draw(for_class(cls))
    raw = encode(obj)
    back = decode(cls, raw)
    assert back == obj
    assert encode(back) == raw


def _body(**over):
    fields = dict(
        prompt_ids=(1, 2, 3),
        completion_ids=(4, 5),
        logprobs=(-0.5, -1.25),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=16,
        sampling_seed=7,
        finish_reason="eos",
        proofs=(b"\x00\x01",),
    )
    fields.update(over)
    return RolloutBody(**fields)


def _wire(obj):
    return msgpack.unpackb(encode(obj), raw=False)


def _pack(value):
    return msgpack.packb(value, use_bin_type=True)


def test_unknown_schema_version_names_object():
    raw = _wire(DatasetSpec(name="a", weight=1))
    raw[0] = 2
    with pytest.raises(DecodeError, match="DatasetSpec: unknown schema version 2"):
        decode(DatasetSpec, _pack(raw))


def test_missing_field_is_named():
    raw = _wire(DatasetSpec(name="a", weight=1))[:-1]
    with pytest.raises(DecodeError, match="missing fields: weight"):
        decode(DatasetSpec, _pack(raw))


def test_extra_field_rejected():
    raw = _wire(DatasetSpec(name="a", weight=1)) + [1]
    with pytest.raises(DecodeError, match="extra field"):
        decode(DatasetSpec, _pack(raw))


@pytest.mark.parametrize(
    "index, value, match",
    [
        (6, 2**32, r"RolloutBody.top_k: 4294967296 out of range"),
        (6, 1.0, r"RolloutBody.top_k: expected an integer, got float"),
        (6, True, r"RolloutBody.top_k: expected an integer, got bool"),
        (4, 11.0, r"RolloutBody.temperature: 11.0 out of range"),
        (4, float("nan"), r"RolloutBody.temperature: nan is not finite"),
        (9, "stop", r"RolloutBody.finish_reason: 'stop' is not one of eos, length"),
        (1, b"\x01\x02\x03", r"RolloutBody.prompt_ids: 3 bytes is not a multiple of 4"),
        (3, b"\x00\x00\x80\x3f", r"RolloutBody.logprobs: item 1.0 not finite or outside"),
        (10, [1], r"RolloutBody.proofs\[0\]: expected bytes, got int"),
    ],
)
def test_bad_field_values_are_named(index, value, match):
    raw = _wire(_body())
    raw[index] = value
    with pytest.raises(DecodeError, match=match):
        decode(RolloutBody, _pack(raw))


def test_nested_errors_name_the_path():
    v = Verdict(
        rollout_id=bytes(32),
        producer=bytes([0, 0x24, 8, 1, 0x12, 0x20]) + bytes(32),
        passed=True,
        reason="ok",
        reward_rescored=1.0,
        metrics=(Metric(name="m", value=1.0),),
    )
    raw = _wire(v)
    raw[6][0][1] = ""
    with pytest.raises(DecodeError, match=r"Verdict.metrics\[0\].name: length 0"):
        decode(Verdict, _pack(raw))


def test_non_canonical_encoding_rejected():
    raw = _wire(DatasetSpec(name="a", weight=1))
    # weight 1 as a uint16 instead of a fixint: same value, different bytes
    data = b"\x93" + _pack(raw[0]) + _pack(raw[1]) + b"\xcd\x00\x01"
    assert msgpack.unpackb(data) == raw
    with pytest.raises(DecodeError, match="non-canonical"):
        decode(DatasetSpec, data)


def test_float32_logprob_written_as_float32():
    with pytest.raises(LocalProtocolError, match="float32"):
        _body(logprobs=(-0.1, -0.2))


def test_oversize_rejected_before_decoding():
    with pytest.raises(OversizeError, match="over the limit"):
        decode(DatasetSpec, b"\x93" + b"\x00" * DatasetSpec.MAX_BYTES)


def test_trailing_bytes_rejected():
    with pytest.raises(DecodeError):
        decode(DatasetSpec, encode(DatasetSpec(name="a", weight=1)) + b"\x00")


def test_building_an_illegal_object_is_a_local_error():
    with pytest.raises(LocalProtocolError, match=r"DatasetSpec.weight: 0 out of range"):
        DatasetSpec(name="a", weight=0)


def test_decoder_fuzz_small():
    report = fuzz_decoders(3000, seed=11)
    assert report.cases == 3000
    assert report.failures == 0, report.examples
