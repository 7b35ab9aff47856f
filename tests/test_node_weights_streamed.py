"""Weights streamed: how often a version is hashed, on which thread, and what stays in
memory, measured on real peers (py-libp2p on loopback) publishing and installing bf16
versions. Every SHA-256 the code computes goes through `hashlib.sha256`, which the tests
wrap to count the bytes hashed and the thread that hashed them."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest
from node.weights.store import WeightsStore
from node.weights.sync import WeightSettings
from protocol.identity import Identity
from tests.support import polling
from trainer.checkpoint import canonical_bytes, parse

pytestmark = pytest.mark.network

SHARD = 64 * 1024
BIG = 16 * 1024  # hashing of anything smaller (envelopes, message ids) is not a version's


class HashLog:
    """Counts the bytes `hashlib.sha256` hashes in updates of at least `BIG` bytes, and
    the threads that hashed them."""

    def __init__(self) -> None:
        self.bytes = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def note(self, data: Any) -> None:
        n = memoryview(data).nbytes
        if n >= BIG:
            with self._lock:
                self.bytes += n
                self.threads.add(threading.current_thread().name)

    def reset(self) -> None:
        self.bytes = 0
        self.threads = set()


class _Counted:
    def __init__(self, log: HashLog, real: Any) -> None:
        self._log, self._h = log, real

    def update(self, data: Any) -> None:
        self._log.note(data)
        self._h.update(data)

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def copy(self) -> _Counted:
        return _Counted(self._log, self._h.copy())


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> Iterator[HashLog]:
    log = HashLog()
    real = hashlib.sha256

    def sha256(data: Any = b"", **kw: Any) -> _Counted:
        h = _Counted(log, real(**kw))
        if memoryview(data).nbytes:
            h.update(data)
        return h

    monkeypatch.setattr(hashlib, "sha256", sha256)
    yield log


def state(seed: int, n: int = 1024 * 1024, change: float = 0.0) -> dict[str, torch.Tensor]:
    """An fp32 state dict of 4 tensors (`n` values), `change` of them nudged by `seed`."""
    w = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    if change:
        m = np.random.default_rng(seed).random(n) < change
        w = np.where(m, w * 1.05, w).astype(np.float32)
    q = n // 4
    return {f"t{i}": torch.from_numpy(w[i * q : (i + 1) * q].reshape(-1, 256)) for i in range(4)}


def cfg(tmp: Path, name: str, manifest: Any, identity: Any = None, **kw: Any) -> PeerConfig:
    return PeerConfig(
        manifest=manifest,
        identity=identity or Identity.generate(),
        data_dir=tmp / name,
        roles=("relay",),
        weights=WeightSettings(shard_bytes=SHARD),
        **kw,
    )


until = functools.partial(polling.until, timeout=90.0)


async def test_publish_and_install_hash_a_version_at_most_twice_off_the_event_loop(
    tmp_path: Path, hashes: HashLog
) -> None:
    """Publish: the full version's file digest and its shard digests (2 passes) and the
    patch's shard digests; nothing hashed twice. Install: a full version's shards as they
    arrive and its file once (2 passes); a patch's shards and the result once (1 pass).
    None of it on the trio thread."""
    trainer = Identity.generate()
    manifest = dataclasses.replace(
        net_manifest("streamed"),
        trainer_keys=(trainer.peer_id,),
        max_staleness=1,
        weights_dtype="bfloat16",
    )
    loop = threading.current_thread().name
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            hashes.reset()
            assert await t.weights.publish(state(0)) == 0
            size = t.weights.store.version_path(0).stat().st_size
            assert hashes.bytes <= 2 * size, f"publish v0 hashed {hashes.bytes / size:.2f} x"
            assert hashes.threads and loop not in hashes.threads
            hashes.reset()
            await until("v0 installed", lambda: a.weights.newest() == 0)
            assert hashes.bytes <= 2 * size, f"install v0 hashed {hashes.bytes / size:.2f} x"
            assert hashes.threads and loop not in hashes.threads

            hashes.reset()
            assert await t.weights.publish(state(1, change=0.02)) == 1
            patch = sum(m.total_bytes for m in t.weights._manifests.values() if m.kind == "delta")
            assert 0 < patch < size // 4
            assert hashes.bytes <= 2 * size + patch, (
                f"publish v1 hashed {hashes.bytes / size:.2f} x the version"
            )
            assert loop not in hashes.threads
            hashes.reset()
            await until("v1 installed", lambda: a.weights.newest() == 1)
            assert a.weights.counters.get("bytes_downloaded", 0) < 2 * size  # by the patch
            assert hashes.bytes <= size + patch, f"install v1 hashed {hashes.bytes / size:.2f} x"
            assert loop not in hashes.threads
            assert (
                a.weights.store.version_path(1).read_bytes()
                == t.weights.store.version_path(1).read_bytes()
            )


async def test_adopt_base_hashes_in_a_worker_thread_and_keeps_no_bytes(
    tmp_path: Path, hashes: HashLog
) -> None:
    """Version 0 from a model directory: its digest is checked once before the network
    (`start`), written and hashed once into the store in a worker thread, and no copy of
    the checkpoint stays in memory afterwards."""
    from node.commands.start import _base_weights

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    data = canonical_bytes(
        {n: ("F32", tuple(t.shape), t.numpy().tobytes()) for n, t in state(0).items()}
    )
    (model_dir / "model.safetensors").write_bytes(data)
    digest = hashlib.new("sha256", data).digest()
    manifest = dataclasses.replace(net_manifest("base"), model_digest=digest)
    del data
    loop = threading.current_thread().name
    size = (model_dir / "model.safetensors").stat().st_size
    tracemalloc.start()
    try:
        base = _base_weights(model_dir, manifest)  # before the event loop runs
        assert 0 < hashes.bytes <= size  # one pass (the header is under BIG)
        hashes.reset()
        async with open_peer(cfg(tmp_path, "v", manifest)) as p:
            assert await p.weights.adopt_base(base) == digest
            held = tracemalloc.get_traced_memory()[0]
            assert p.weights.installed() == {0: digest}
            assert len(parse(p.weights.store.read_version(0)).tensors) == 4
    finally:
        tracemalloc.stop()
    assert held < size // 2, f"{held} bytes still held after adopting a {size}-byte version 0"
    assert hashes.bytes <= size and loop not in hashes.threads


def test_a_validator_keeps_the_versions_its_staleness_needs() -> None:
    from node.roles.policy_versions import HeldVersions

    for s in (0, 1, 2, 5):
        assert HeldVersions.keep_for(net_manifest("k", max_staleness=s)) == s + 1


def test_store_installs_a_patch_without_holding_the_base_and_result(tmp_path: Path) -> None:
    """The store applies a patch tensor by tensor from its base file to the result's file;
    at most one tensor's worth of the checkpoint is in memory at once."""
    from protocol.content_id import content_id
    from trainer.checkpoint import from_state_dict
    from trainer.export import export_version

    a = from_state_dict(state(0), cast="bfloat16")
    b = from_state_dict(state(1, change=0.02), cast="bfloat16")
    store = WeightsStore.open(tmp_path)
    store.install_bytes(0, a, content_id(a))
    delta = export_version(1, b, parent=(0, a), max_shard_bytes=SHARD, difference=True)[1]
    mid = content_id(b"delta")
    store.put_manifest(mid, delta.manifest, b"env")
    for s in delta.manifest.shards:
        store.put_shard(mid, s.index, delta.payload[s.offset : s.offset + s.size])
    del a
    tensor = len(b) // 4
    tracemalloc.start()
    try:
        assert store.install_delta(mid) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert store.read_version(1) == b
    assert peak < len(b), f"a patch install peaked at {peak / len(b):.2f} x the version"
    assert peak < 4 * tensor
    store.close()


class _Weights:
    """The parts of `WeightSync` a validator's `HeldVersions` reads, over a real store."""

    def __init__(self, store: WeightsStore) -> None:
        self.store = store
        self.target = max(store.installed())

    def installed(self) -> dict[int, bytes]:
        return self.store.installed()

    async def wait_installed(self, version: int) -> None:
        raise AssertionError("every version asked for is installed")

    async def load_state_dict(self, version: int) -> dict[str, Any]:
        from trainer.checkpoint import mapped_state_dict

        return mapped_state_dict(self.store.version_path(version))


async def test_a_validator_holds_staleness_plus_one_versions_memory_mapped_for_one_model(
    tmp_path: Path,
) -> None:
    """Records of the newest version and of `max_staleness` versions before it are
    judgeable at once; the one model takes each version's weights from its memory map."""
    from node.roles.policy_versions import HeldVersions
    from protocol.content_id import content_id
    from trainer.checkpoint import from_state_dict

    model = torch.nn.Linear(8, 8)
    store = WeightsStore.open(tmp_path)
    for v in range(5):
        with torch.no_grad():
            data = from_state_dict({k: t + v for k, t in model.state_dict().items()})
        store.install_bytes(v, data, content_id(data))
    for staleness in (1, 2, 3):
        peer = dataclasses.replace(net_manifest("held", max_staleness=staleness))
        view = type("View", (), {"manifest": peer, "weights": _Weights(store)})()
        held = HeldVersions(torch.nn.Linear(8, 8))
        for v in range(5):
            await held.fetch(view, v)  # type: ignore[arg-type]
        # version 0: the model as loaded, until another version's weights replace it
        assert [v for v in range(1, 5) if held.holds(v)] == list(range(4 - staleness, 5))
        for v in range(4 - staleness, 5):
            m = held.get(v)
            assert m is held.model
            assert torch.equal(m.bias, model.bias + v)
        assert not held.holds(0) and held.get(0) is None  # swapped away, not mapped
    store.close()
