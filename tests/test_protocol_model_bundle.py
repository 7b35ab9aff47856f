"""`protocol.model_bundle`: one byte string per set of model files, checked against its pin."""

from __future__ import annotations

import msgpack
import pytest

from protocol.content_id import content_id
from protocol.model_bundle import BundleError, bundled, decode_bundle, encode_bundle

FILES = {
    "config.json": b'{"model_type": "qwen2"}',
    "tokenizer.json": b"{}",
    "calibration.json": b"1",
}


def test_a_bundle_is_canonical_and_reads_back_against_its_pin() -> None:
    data = encode_bundle(FILES)
    assert encode_bundle(dict(reversed(list(FILES.items())))) == data  # order-free
    assert decode_bundle(data, content_id(data)) == FILES


@pytest.mark.parametrize(
    "name",
    ["model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", ".hidden", "a/b"],
)
def test_weights_hidden_files_and_paths_stay_out(name: str) -> None:
    assert not bundled(name)
    with pytest.raises(ValueError, match="cannot go into a model bundle"):
        encode_bundle({**FILES, name: b"x"})


def test_bytes_that_are_not_the_pinned_bundle_are_refused() -> None:
    data = encode_bundle(FILES)
    other = encode_bundle({**FILES, "config.json": b"{}"})
    with pytest.raises(BundleError, match="do not match"):
        decode_bundle(other, content_id(data))


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",  # not msgpack
        msgpack.packb({"config.json": b"x"}),  # a map
        msgpack.packb([["../evil", b"x"]], use_bin_type=True),  # a path
        msgpack.packb([["b.json", b"x"], ["a.json", b"y"]], use_bin_type=True),  # unsorted
        msgpack.packb([["a.json", "text, not bytes"]], use_bin_type=True),
    ],
)
def test_a_pinned_but_malformed_bundle_is_refused(raw: bytes) -> None:
    # the pin is whatever the bytes hash to: an authority that signed garbage
    with pytest.raises(BundleError):
        decode_bundle(raw, content_id(raw))
