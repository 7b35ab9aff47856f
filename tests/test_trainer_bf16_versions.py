"""bf16 policy versions: the trainer keeps its fp32 master, publishes bf16 versions
(`[weights] dtype = "bfloat16"`), and one small step ships as a small exact patch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from node.errors import CommandError
from node.roles.policy_versions import load_weights
from node.run_file import manifest_from_table, manifest_to_toml
from node.weights.sync import version_bytes
from protocol.codec import decode, encode
from protocol.wire import RunManifest
from trainer.checkpoint import parse, to_state_dict, weights_digest
from trainer.delta import apply_patch, patch_stats
from trainer.export import export_version
from trainer.tiny_policy import HEADS, HIDDEN, INTERMEDIATE, KV_HEADS, LAYERS, VOCAB_SIZE


def table(**weights: object) -> dict:
    t: dict = {
        "run": {"id": "bf16-test", "seed": 3},
        "datasets": [{"name": "basic_arithmetic", "weight": 1}],
    }
    if weights:
        t["weights"] = dict(weights)
    return t


def tiny_model(seed: int = 0):  # type: ignore[no-untyped-def]
    """A random model of the built-in policy's shape (no tokenizer needed)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def one_step(model, lr: float) -> None:  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.randint(0, VOCAB_SIZE, (4, 32), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


# --------------------------------------------------------------------------- manifest


def test_float32_is_the_default_and_encodes_as_before():
    plain = manifest_from_table(table())
    explicit = manifest_from_table(table(dtype="float32"))
    assert plain.weights_dtype == explicit.weights_dtype == "float32"
    assert encode(explicit) == encode(plain)
    # the default is not on the wire at all: same array as a manifest without the field
    assert len(encode(plain)) < len(encode(dataclasses.replace(plain, weights_dtype="bfloat16")))
    assert "[weights]" not in manifest_to_toml(plain)


def test_bfloat16_round_trips_through_the_codec_and_toml():
    m = manifest_from_table(table(dtype="bfloat16"))
    assert m.weights_dtype == "bfloat16"
    assert decode(RunManifest, encode(m)) == m
    import tomllib

    assert manifest_from_table(tomllib.loads(manifest_to_toml(m))) == m


def test_an_explicit_default_on_the_wire_is_not_canonical():
    from protocol.codec import pack, to_wire
    from protocol.errors import DecodeError

    m = manifest_from_table(table())
    raw = to_wire(m) + ["float32"]
    with pytest.raises(DecodeError, match="non-canonical"):
        decode(RunManifest, pack(raw))


def test_a_bad_dtype_is_a_one_line_error():
    with pytest.raises(CommandError) as exc:
        manifest_from_table(table(dtype="float16"))
    msg = str(exc.value)
    assert "weights.dtype" in msg and "\n" not in msg
    with pytest.raises(CommandError, match="unknown key weights.dtyp"):
        manifest_from_table(table(dtyp="bfloat16"))


# ------------------------------------------------------------------------- versions


def test_a_bf16_version_is_the_master_cast_and_the_master_stays_fp32():
    model = tiny_model()
    master = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = version_bytes(model.state_dict(), set(), "bfloat16")
    floats = [t for t in parse(data).tensors]
    assert floats and all(t.dtype == "BF16" for t in floats)
    state = to_state_dict(data)
    for name, t in state.items():
        assert torch.equal(t, master[name].to(torch.bfloat16)), name
    for name, t in model.state_dict().items():  # no rounding went into the master
        assert t.dtype == torch.float32 and torch.equal(t, master[name])
    # a float32 run publishes the master as it is, byte for byte as before
    assert version_bytes(model.state_dict(), set(), "float32") == version_bytes(
        model.state_dict(), set(), "float32"
    )
    assert all(t.dtype == "F32" for t in parse(version_bytes(master, set(), "float32")).tensors)


def test_one_step_ships_as_a_small_exact_patch(capsys: pytest.CaptureFixture[str]):
    lr = manifest_from_table(table()).rl_lr  # the run default
    model = tiny_model()
    v0 = version_bytes(model.state_dict(), set(), "bfloat16")
    names = {t.name for t in parse(v0).tensors}
    one_step(model, lr)
    v1 = version_bytes(model.state_dict(), names, "bfloat16")
    assert v1 != v0
    exported = export_version(1, v1, (0, v0), difference=True)
    assert [e.manifest.kind for e in exported] == ["full", "delta"]
    full, delta = exported
    assert full.payload == v1
    ratio = len(delta.payload) / len(full.payload)
    with capsys.disabled():
        stats = patch_stats(delta.payload)
        print(f"\nbf16 patch/full = {ratio:.3f} ({stats['bytes']} of {len(v1)} B, lr {lr})")
    assert ratio < 0.5
    assert apply_patch(v0, delta.payload) == v1
    assert delta.manifest.file_digest == weights_digest(v1) == full.manifest.file_digest
    # installing it into a model that computes in fp32 yields exactly the bf16 values
    other = tiny_model(seed=5)
    load_weights(other, to_state_dict(apply_patch(v0, delta.payload)))
    master = model.state_dict()
    for name, t in other.state_dict().items():
        assert torch.equal(t, master[name].to(torch.bfloat16).float()), name


def test_a_difference_patch_is_exact_on_any_bits_and_refuses_tampering():
    import msgpack
    import numpy as np

    from protocol.codec import pack
    from trainer.checkpoint import canonical_bytes
    from trainer.delta import PatchError, make_patch

    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, 4096, dtype=np.uint32)
    b = a.copy()
    b[::7] = rng.integers(0, 2**32, b[::7].size, dtype=np.uint32)  # wraps both ways
    h = rng.integers(0, 2**16, 64, dtype=np.uint16)
    base = canonical_bytes({"w": ("F32", (64, 64), a.tobytes()), "h": ("BF16", (64,), h.tobytes())})
    target = canonical_bytes(
        {"w": ("F32", (64, 64), b.tobytes()), "h": ("BF16", (64,), h.tobytes())}
    )
    patch = make_patch(base, target, difference=True)
    assert apply_patch(base, patch) == target
    assert patch_stats(patch)["tensors"] == 1  # unchanged tensors are left out
    p = msgpack.unpackb(patch, raw=False)
    p["tensors"][0][3] += 1
    with pytest.raises(PatchError, match="changed count"):
        apply_patch(base, pack(p))
    p["tensors"][0][2] -= 1
    with pytest.raises(PatchError, match="does not fit"):
        apply_patch(base, pack(p))


def test_the_trainer_snapshot_keeps_ties_and_publishes_like_the_master():
    from trainer.checkpoint import snapshot_state

    model = tiny_model()
    snap = snapshot_state(model.state_dict(), "bfloat16")
    assert snap["lm_head.weight"] is snap["model.embed_tokens.weight"]  # still tied
    assert all(t.dtype == torch.bfloat16 for t in snap.values())
    direct = version_bytes(model.state_dict(), set(), "bfloat16")
    assert version_bytes(snap, set(), "bfloat16") == direct  # the tied tensor written once
    old = snapshot_state(model.state_dict())  # float32 runs: plain clones, as before
    assert all(torch.equal(old[k], v) and old[k] is not v for k, v in model.state_dict().items())


@pytest.mark.network
async def test_a_bf16_run_publishes_and_installs_patches_over_the_network(tmp_path):  # type: ignore[no-untyped-def]
    from node.peer.peer import open_peer
    from protocol.identity import Identity
    from tests.test_node_weights import cfg, run_manifest, until

    trainer = Identity.generate()
    manifest = dataclasses.replace(run_manifest("bf16net", trainer), weights_dtype="bfloat16")
    model = tiny_model()
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        boot = (t.host.listen_addrs()[0],)
        async with open_peer(cfg(tmp_path, "a", manifest, bootstrap=boot)) as a:
            tw, aw = t.weights, a.weights
            assert tw is not None and aw is not None
            for v in range(3):
                if v:
                    one_step(model, manifest.rl_lr)
                before = aw.counters.get("bytes_downloaded", 0)
                assert await tw.publish(model.state_dict()) == v
                await until(f"v{v} installed", lambda v=v: aw.newest() == v)
                got = aw.store.read_version(v)
                assert got == tw.store.read_version(v)
                assert got == version_bytes(model.state_dict(), set(), "bfloat16")
            # version 2 reached the peer as the patch from version 1, not in full
            assert aw.counters["bytes_downloaded"] - before < 0.5 * len(got)
            held = {(m.version, m.kind): m for _, m in tw.store.manifests()}
            assert held[(2, "delta")].total_bytes < 0.5 * held[(2, "full")].total_bytes
