"""A model directory's files other than its weights, as one byte string with one content id.

A peer joining a run needs the model's configuration, tokenizer, generation settings and
audit calibration before it can load the policy; the weights come separately (the run's
policy versions, or version 0 checked against the manifest's `model_digest`). The run
manifest pins these files by `model_files_digest`, the content id of their bundle, so a
joiner can take them from any peer and check them against what the run's authority signed.

Bundle: the msgpack array `[[name, data], ...]`, names sorted, each a plain file name
(`NAME_RE`: no directory parts, no leading dot), at most MAX_FILES files and
MAX_BUNDLE_BYTES in all. Weight files (`is_weights_file`) and hidden files are never in it.
One directory gives one bundle byte for byte, so its content id is a pin.

`decode_bundle(data, digest)` checks the content id before msgpack reads a byte, then the
shape; anything else raises `BundleError` (a remote fault: whoever served the bytes).
No IO here: `node.model_fetch` reads and writes the files.
"""

from __future__ import annotations

import re

import msgpack

from protocol.content_id import content_id

MAX_FILES = 64
MAX_BUNDLE_BYTES = 64 * 2**20
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class BundleError(ValueError):
    """Bytes that are not the bundle the run pins (wrong digest, or malformed)."""


def is_weights_file(name: str) -> bool:
    """Whether `name` holds weights (or their index) rather than configuration."""
    return name.endswith(WEIGHT_SUFFIXES) or name in WEIGHT_INDEXES


def bundled(name: str) -> bool:
    """Whether a file of this name goes into a bundle."""
    return bool(NAME_RE.match(name)) and not is_weights_file(name)


def encode_bundle(files: dict[str, bytes]) -> bytes:
    """The canonical bundle of `files` (name → bytes); `ValueError` for a name that
    `bundled` refuses, too many files or too many bytes (a local mistake)."""
    for name in files:
        if not bundled(name):
            raise ValueError(f"{name!r} cannot go into a model bundle")
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} files, at most {MAX_FILES} go into a model bundle")
    data = bytes(msgpack.packb([[n, files[n]] for n in sorted(files)], use_bin_type=True) or b"")
    if len(data) > MAX_BUNDLE_BYTES:
        raise ValueError(f"model bundle of {len(data)} bytes exceeds {MAX_BUNDLE_BYTES}")
    return data


def decode_bundle(data: bytes, digest: bytes) -> dict[str, bytes]:
    """The files of a bundle whose content id must be `digest`; `BundleError` otherwise."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"model bundle of {len(data)} bytes exceeds {MAX_BUNDLE_BYTES}")
    if content_id(data) != digest:
        raise BundleError("model files do not match the run's model_files_digest")
    try:
        raw = msgpack.unpackb(
            data,
            use_list=True,
            raw=False,
            strict_map_key=True,
            max_array_len=MAX_FILES,
            max_map_len=0,
            max_str_len=128,
            max_bin_len=MAX_BUNDLE_BYTES,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise BundleError(f"model bundle does not decode: {exc}") from None
    if not isinstance(raw, list):
        raise BundleError("model bundle is not an array")
    files: dict[str, bytes] = {}
    for entry in raw:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], bytes)
            and bundled(entry[0])
        ):
            raise BundleError("model bundle entry is not [file name, bytes]")
        files[entry[0]] = entry[1]
    if list(files) != sorted(files) or len(files) != len(raw):
        raise BundleError("model bundle names are not sorted and distinct")
    return files
