"""Checkpoint export: canonical bytes, tensor-aligned shards, exact delta patches, plans."""

from __future__ import annotations

import json
import struct
import zlib

import msgpack
import numpy as np
import pytest

from protocol.content_id import content_id
from protocol.weights_plan import Offer, plan, plan_bytes
from trainer.checkpoint import (
    CheckpointError,
    canonical_bytes,
    canonicalize,
    from_state_dict,
    parse,
    to_state_dict,
    weights_digest,
)
from trainer.delta import PatchError, apply_patch, make_patch, patch_stats
from trainer.export import (
    ExportError,
    export_version,
    full_manifest,
    is_snapshot,
    shard_layout,
)


def ckpt(seed: int = 0, rows: int = 64, cols: int = 32, change: float = 0.0) -> bytes:
    rng = np.random.default_rng(0)
    big = rng.standard_normal((rows, cols)).astype(np.float32)
    small = rng.standard_normal(7).astype(np.float32)
    half = rng.integers(0, 2**16, size=(16, 8), dtype=np.uint16)  # a bf16 tensor's bits
    if change:
        r2 = np.random.default_rng(seed)
        mask = r2.random(big.shape) < change
        big = np.where(mask, big + 1e-3, big).astype(np.float32)
    return canonical_bytes(
        {
            "z.big": ("F32", big.shape, big.tobytes()),
            "a.small": ("F32", small.shape, small.tobytes()),
            "m.half": ("BF16", half.shape, half.tobytes()),
        }
    )


# ------------------------------------------------------------------------- checkpoint


def test_canonical_is_deterministic_and_sorted():
    data = ckpt()
    ck = parse(data)
    assert [t.name for t in ck.tensors] == ["a.small", "m.half", "z.big"]
    assert canonicalize(data) == data
    assert ck.header_end % 8 == 0


def test_canonicalize_reorders_a_foreign_file():
    arr = np.arange(6, dtype=np.float32)
    header = {
        "b": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]},
        "a": {"dtype": "F32", "shape": [6], "data_offsets": [24, 48]},
        "__metadata__": {"format": "pt"},
    }
    text = json.dumps(header).encode()
    foreign = struct.pack("<Q", len(text)) + text + arr.tobytes() + (arr * 2).tobytes()
    out = canonicalize(foreign)
    assert out != foreign
    ck = parse(out)
    assert np.array_equal(np.frombuffer(ck.tensor_bytes(ck.by_name()["a"]), np.float32), arr * 2)


@pytest.mark.parametrize(
    "bad, why",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 1000) + b"{}", "does not fit"),
        (struct.pack("<Q", 3) + b"{x}", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_parse_refuses_broken_files(bad, why):
    with pytest.raises(CheckpointError, match=why):
        parse(bad)


@pytest.mark.parametrize(
    "entry, why",
    [
        ({"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "4 bytes for shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 400]}, "out of bounds"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "bad shape"),
        ({"shape": [1]}, "bad header entry"),
    ],
)
def test_parse_refuses_bad_entries(entry, why):
    text = json.dumps({"t": entry}).encode()
    with pytest.raises(CheckpointError, match=why):
        parse(struct.pack("<Q", len(text)) + text + b"\x00" * 4)


def test_state_dict_round_trip():
    torch = pytest.importorskip("torch")
    sd = {"w": torch.randn(3, 4).to(torch.bfloat16), "b": torch.arange(5, dtype=torch.float32)}
    data = from_state_dict(sd)
    back = to_state_dict(data)
    assert torch.equal(back["w"], sd["w"]) and back["w"].dtype == torch.bfloat16
    assert torch.equal(back["b"], sd["b"])
    assert from_state_dict(back) == data


# ------------------------------------------------------------------------- shards


def test_shards_are_tensor_aligned_and_cover_the_file():
    data = ckpt(rows=200, cols=64)  # z.big: 51,200 bytes, rows of 256 bytes
    layout = shard_layout(data, 16 * 1024)
    assert sum(size for _, size in layout) == len(data)
    assert all(size <= 16 * 1024 for _, size in layout)
    ck = parse(data)
    big = ck.by_name()["z.big"]
    cuts = {off for off, _ in layout} | {len(data)}
    for t in ck.tensors:
        inside = [c for c in cuts if t.begin < c < t.end]
        assert all((c - t.begin) % t.row_bytes == 0 for c in inside), t.name
    assert any(big.begin < c < big.end for c in cuts)  # the big tensor was split by rows
    assert b"".join(data[o : o + s] for o, s in layout) == data


def test_full_manifest_digests():
    data = ckpt()
    m = full_manifest(3, data, parent=(2, b"\x01" * 32), max_shard_bytes=4096)
    assert m.kind == "full" and m.version == 3 and m.base_version == 2
    assert m.file_digest == weights_digest(data) and m.total_bytes == len(data)
    for s in m.shards:
        assert s.digest == content_id(data[s.offset : s.offset + s.size])


def test_shard_size_limits():
    with pytest.raises(ExportError, match="shard size"):
        shard_layout(ckpt(), 100)
    with pytest.raises(ExportError):
        shard_layout(b"garbage!", 4096)


# ------------------------------------------------------------------------- delta


def test_patch_is_bit_exact_and_small():
    a, b = ckpt(), ckpt(seed=1, change=0.02)
    patch = make_patch(a, b)
    assert apply_patch(a, patch) == b
    assert len(patch) < 0.2 * len(b)
    stats = patch_stats(patch)
    assert stats["tensors"] == 1 and 0 < stats["changed"] < 200


def test_patch_of_identical_versions_is_empty_and_applies():
    a = ckpt()
    patch = make_patch(a, a)
    assert patch_stats(patch)["tensors"] == 0
    assert apply_patch(a, patch) == a


def test_patch_catches_sign_of_zero_and_nan_bits():
    z = np.zeros(4, np.float32)
    a = canonical_bytes({"t": ("F32", (4,), z.tobytes())})
    nz = z.copy()
    nz[1] = -0.0
    b = canonical_bytes({"t": ("F32", (4,), nz.tobytes())})
    assert apply_patch(a, make_patch(a, b)) == b


def test_patch_on_the_wrong_base_is_refused():
    a, b, c = ckpt(), ckpt(seed=1, change=0.02), ckpt(seed=2, change=0.02)
    with pytest.raises(PatchError, match="wrong base"):
        apply_patch(c, make_patch(a, b))


def test_layout_change_is_not_patchable():
    a = ckpt()
    b = canonical_bytes({"x": ("F32", (1,), b"\x00" * 4)})
    with pytest.raises(PatchError, match="layout"):
        make_patch(a, b)
    out = export_version(1, b, parent=(0, a), max_shard_bytes=4096)
    assert [e.manifest.kind for e in out] == ["full"]


def _tamper(patch: bytes, fn) -> bytes:
    p = msgpack.unpackb(patch, raw=False)
    fn(p)
    return msgpack.packb(p, use_bin_type=True)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda p: p.__setitem__("format", "x"), "not a swarm-rl-patch"),
        (lambda p: p.__setitem__("target", b"\x00" * 32), "target digest"),
        (lambda p: p["tensors"][0].__setitem__(0, "nope"), "absent from the base"),
        (lambda p: p["tensors"][0].__setitem__(3, b"junk"), "corrupt compressed"),
        (lambda p: p["tensors"][0].__setitem__(3, zlib.compress(b"\x00" * 8)), "expected"),
        (
            lambda p: p["tensors"][0].__setitem__(
                3, zlib.compress(np.full(p["tensors"][0][2], 10**6, "<u4").tobytes())
            ),
            "out of range",
        ),
        (lambda p: p["tensors"].append(p["tensors"][0]), "twice"),
    ],
)
def test_corrupt_patches_are_refused(edit, why):
    a, b = ckpt(), ckpt(seed=1, change=0.05)
    with pytest.raises(PatchError, match=why):
        apply_patch(a, _tamper(make_patch(a, b), edit))


def test_garbage_patch():
    with pytest.raises(PatchError):
        apply_patch(ckpt(), b"\xc1\xc1\xc1")


def test_export_version_offers_full_and_delta():
    a, b = ckpt(), ckpt(seed=1, change=0.01)
    out = export_version(1, b, parent=(0, a), max_shard_bytes=4096)
    full, delta = (e.manifest for e in out)
    assert full.kind == "full" and delta.kind == "delta"
    assert delta.base_version == 0 and delta.base_digest == weights_digest(a)
    assert delta.file_digest == full.file_digest == weights_digest(b)
    assert delta.total_bytes < full.total_bytes
    with pytest.raises(ExportError, match="newer"):
        export_version(1, b, parent=(1, a))


def test_snapshots():
    assert [v for v in range(10) if is_snapshot(v, 4)] == [0, 4, 8]


# ------------------------------------------------------------------------- plans


def _offers(full: dict[int, int], delta: dict[int, int]) -> list[Offer]:
    out = [Offer(bytes([v]) * 32, v, "full", v, n) for v, n in full.items()]
    out += [Offer(bytes([100 + v]) * 32, v, "delta", v - 1, n) for v, n in delta.items()]
    return out


def test_joiner_takes_snapshot_plus_patches_when_cheaper():
    offers = _offers({8: 1000, 11: 1000}, {9: 50, 10: 50, 11: 50})
    steps = plan(11, [], offers)
    assert [(s.version, s.kind) for s in steps] == [(11, "full")]  # 1000 < 1150
    offers = _offers({8: 1000, 11: 1200}, {9: 50, 10: 50, 11: 50})
    steps = plan(11, [], offers)
    assert [(s.version, s.kind) for s in steps] == [
        (8, "full"),
        (9, "delta"),
        (10, "delta"),
        (11, "delta"),
    ]
    assert plan_bytes(steps) == 1150


def test_live_peer_applies_patches_from_what_it_has():
    offers = _offers({11: 1000}, {10: 50, 11: 50})
    steps = plan(11, [9], offers)
    assert [(s.version, s.kind) for s in steps] == [(10, "delta"), (11, "delta")]
    assert plan(11, [11], offers) == []


def test_unreachable_and_backward_patches():
    assert plan(5, [1], _offers({}, {3: 10})) is None
    bad = [Offer(b"x" * 32, 5, "delta", 7, 1)]
    assert plan(5, [7], bad) is None


def test_tied_weights_written_once_under_the_preferred_name():
    torch = pytest.importorskip("torch")
    w = torch.randn(4, 3)
    sd = {"model.embed_tokens.weight": w, "lm_head.weight": w, "b": torch.ones(2)}
    names = [t.name for t in parse(from_state_dict(sd)).tensors]
    assert names == ["b", "model.embed_tokens.weight"]  # as save_pretrained keeps it
    kept = parse(from_state_dict(sd, prefer={"lm_head.weight"})).tensors
    assert sorted(t.name for t in kept) == ["b", "lm_head.weight"]


def test_tiny_policy_state_dict_matches_its_model_directory():
    from trainer.checkpoint import from_model_dir
    from trainer.model_dir import load_model_dir
    from trainer.tiny_policy import is_built, policy_dir

    path = policy_dir()
    if not is_built(path):
        pytest.skip("built-in policy not built")
    model, _ = load_model_dir(path)
    assert from_state_dict(model.state_dict()) == from_model_dir(path)
