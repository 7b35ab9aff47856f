"""`bench scale`'s `weights` part: publish, install and hot swap of a policy version through
the node's own code, with a trio lag probe running beside them.

One trio loop runs, in order (each step is the node's public call, as the roles make it):

1. `adopt_base`: the trainer's `WeightSync` takes the model directory's weights as
   version 0 (`trainer.checkpoint.from_model_dir`, as the roles read it);
2. `publish`: version 1 = the weights after one training step, the `train` part's bf16
   checkpoint (`step_source: "train"`); without it, the worker's fp32 model after the
   first AdamW step's update simulated in place (each value moved by ±lr, the size of
   AdamW's first step; `step_source: "simulated"`). Published bf16 (the run's
   `weights.dtype`): a full manifest and a difference patch from version 0;
3. `install_full` and `install_delta` on two receivers' stores (`node.weights.store`, what
   `WeightSync` runs when the swarm fetched the shards; the shards are copied from the
   publisher's store, no network);
4. `HotSwap.before_batch` (`node.roles.policy_versions`): the worker's loaded model takes the
   installed version.

Figures: `publish_s`, `sha_passes` (bytes SHA-256 hashed during `publish`, counted by
wrapping `hashlib` in this process, ÷ the version's bytes), `patch_bytes_ratio` (the delta
manifest's bytes ÷ the full one's), `install_full_s`, `install_delta_s`, `hot_swap_s`,
`peak_rss_gib` (this process, the worker's fp32 model included), `loop_max_stall_s` (the
worst overshoot of a task sleeping 10 ms in a loop, over the node's steps; per step in
`loop_stall_by_step`, where `bench` is the bench's own work between them, not counted). The peers are stand-ins carrying what `WeightSync` reads (identity,
run manifest, envelope sequence, an outbox that drops what it is given): no network runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

from swarm_node_bench.parts.scale_model import (
    bench_manifest,
    child_setup,
    load_timed,
    peak_rss_gib,
)

PROBE_S = 0.01
BENCH_STEP = "bench"  # the bench's own work (reading files, copying shards): not counted


class LagProbe:
    """A task that sleeps `PROBE_S` in a loop and keeps the worst overshoot, per step."""

    def __init__(self) -> None:
        self.step = BENCH_STEP
        self.worst: dict[str, float] = {}

    async def run(self) -> None:
        """Probe until cancelled."""
        import trio  # deferred: heavy import

        while True:
            t0 = trio.current_time()
            await trio.sleep(PROBE_S)
            lag = trio.current_time() - t0 - PROBE_S
            self.worst[self.step] = max(self.worst.get(self.step, 0.0), lag)


class HashCount:
    """Counts the bytes given to SHA-256 (`hashlib.sha256` and `hashlib.new("sha256")`)
    while installed; a stand-in hasher wraps the real one."""

    def __init__(self) -> None:
        self.bytes = 0
        self._sha256 = hashlib.sha256
        self._new = hashlib.new

    def install(self) -> None:
        """Wrap the constructors."""
        counter = self
        real_sha256, real_new = self._sha256, self._new

        class Counted:
            def __init__(self, inner: Any) -> None:
                self.inner = inner
                self.name, self.digest_size, self.block_size = (
                    inner.name,
                    inner.digest_size,
                    inner.block_size,
                )

            def update(self, data: Any) -> None:
                counter.bytes += memoryview(data).nbytes
                self.inner.update(data)

            def digest(self) -> bytes:
                return self.inner.digest()

            def hexdigest(self) -> str:
                return self.inner.hexdigest()

            def copy(self) -> Any:
                return Counted(self.inner.copy())

        def sha256(data: Any = b"", **kw: Any) -> Any:
            h = Counted(real_sha256(**kw))
            if data:
                h.update(data)
            return h

        def new(name: str, data: Any = b"", **kw: Any) -> Any:
            if name.lower().replace("-", "") != "sha256":
                return real_new(name, data, **kw)
            return sha256(data, **kw)

        hashlib.sha256 = sha256  # type: ignore[assignment]
        hashlib.new = new  # type: ignore[assignment]

    def remove(self) -> None:
        """Put the real constructors back."""
        hashlib.sha256 = self._sha256  # type: ignore[assignment]
        hashlib.new = self._new  # type: ignore[assignment]


class _Outbox:
    async def put(self, topic: str, data: bytes) -> None:
        """Dropped: no network in this part."""


class StandInPeer:
    """What `WeightSync` and `HotSwap` read of a peer, with no network."""

    def __init__(self, manifest: Any, identity: Any) -> None:
        from node.peer.config import SeqCounter  # deferred: heavy import

        self.manifest = dataclasses.replace(manifest, trainer_keys=(identity.peer_id,))
        self.identity = identity
        self.run_id = manifest.run_id
        self.seq = SeqCounter()
        self.outbox = _Outbox()
        self.topics = {"weights": "bench-scale/weights"}
        self.policy_version = 0
        self.weights: Any = None

    def set_policy_version(self, version: int) -> None:
        """The version the peer holds now."""
        self.policy_version = version


def _simulated_step(model: Any, lr: float) -> None:
    """AdamW's first step moves each value by lr·m/√v = ±lr (weight decay 0): applied in
    place with random signs."""
    import torch  # deferred: heavy import

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            sign = torch.randint(0, 2, p.shape, generator=g).to(p.dtype).mul_(2).sub_(1)
            p.add_(sign.to(p.device), alpha=-lr)


def weights_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part (module docstring); `config`: model_dir, tokens, lr, after_step, device."""
    import trio  # deferred: heavy import

    device = child_setup(config)
    model, _tok, loaded = load_timed(config, device)
    with tempfile.TemporaryDirectory(prefix="bench-scale-weights-", dir=config.get("work")) as tmp:
        out = trio.run(_steps, config, model, Path(tmp))
    return {"weights_role": loaded, **out, "peak_rss_gib": peak_rss_gib()}


async def _steps(config: dict[str, Any], model: Any, tmp: Path) -> dict[str, Any]:
    import trio  # deferred: heavy import

    from node.roles.policy_versions import HotSwap  # deferred: heavy import
    from node.weights.store import WeightsStore  # deferred: heavy import
    from node.weights.sync import WeightSettings, WeightSync  # deferred: heavy import
    from protocol.identity import Identity  # deferred: heavy import
    from trainer.checkpoint import from_model_dir  # deferred: heavy import

    lr = float(config.get("lr", 1e-6))
    manifest = bench_manifest(config["model_dir"], config["tokens"], lr)
    trainer_id = Identity.from_private_bytes(bytes(31) + b"\x02")
    probe = LagProbe()
    out: dict[str, Any] = {}

    def sync_for(name: str) -> WeightSync:
        peer = StandInPeer(manifest, trainer_id)
        ws = WeightSync(peer, WeightsStore.open(tmp / name), WeightSettings())
        peer.weights = ws
        return ws

    async def timed(step: str, fn: Any, *args: Any) -> Any:
        probe.step = step
        t0 = time.perf_counter()
        result = await fn(*args)
        out[f"{step}_s"] = round(time.perf_counter() - t0, 3)
        probe.step = BENCH_STEP
        return result

    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe.run)
        probe.step = BENCH_STEP
        base = await trio.to_thread.run_sync(from_model_dir, config["model_dir"])
        pub = sync_for("trainer")
        await timed("adopt_base", pub.adopt_base, base)
        after = Path(config.get("after_step") or "")
        if after.is_file():
            source: Any = str(after)
            out["step_source"] = "train"
        else:
            probe.step = BENCH_STEP
            await trio.to_thread.run_sync(_simulated_step, model, lr)
            source = model.state_dict()
            out["step_source"] = "simulated"
        counter = HashCount()
        counter.install()
        try:
            version = await timed("publish", pub.publish, source)
        finally:
            counter.remove()
        source = None
        kinds = {m.kind: (mid, m) for mid, m in pub.store.manifests() if m.version == version}
        full_mid, full = kinds["full"]
        out["version_bytes"] = full.total_bytes
        out["sha_bytes"] = counter.bytes
        out["sha_passes"] = round(counter.bytes / full.total_bytes, 2)
        delta = kinds.get("delta")
        out["patch_bytes_ratio"] = (
            round(delta[1].total_bytes / full.total_bytes, 4) if delta is not None else None
        )

        full_rx = sync_for("receiver-full")
        await timed("receiver_adopt_base", full_rx.adopt_base, base)
        probe.step = BENCH_STEP
        await trio.to_thread.run_sync(_copy_manifest, pub, full_rx, full_mid)
        await timed("install_full", trio.to_thread.run_sync, full_rx.store.install_full, full_mid)
        full_rx.store.close()
        delta_rx = sync_for("receiver-delta")
        await timed("receiver_adopt_base", delta_rx.adopt_base, base)
        base = None
        probe.step = BENCH_STEP
        if delta is not None:
            await trio.to_thread.run_sync(_copy_manifest, pub, delta_rx, delta[0])
            await timed(
                "install_delta", trio.to_thread.run_sync, delta_rx.store.install_delta, delta[0]
            )
            delta_rx.note_installed(version, delta[1].file_digest)
        else:
            out["install_delta_s"] = None
            await trio.to_thread.run_sync(_copy_manifest, pub, delta_rx, full_mid)
            await trio.to_thread.run_sync(delta_rx.store.install_full, full_mid)
            delta_rx.note_installed(version, full.file_digest)
        swap = HotSwap(delta_rx.peer, model, version=0)
        await timed("hot_swap", swap.before_batch, lambda _m: None)
        out["hot_swap_version"] = swap.version
        nursery.cancel_scope.cancel()
    node_steps = [v for k, v in probe.worst.items() if k != BENCH_STEP]
    out["loop_max_stall_s"] = round(max(node_steps), 4)
    out["loop_stall_by_step"] = {k: round(v, 4) for k, v in probe.worst.items()}
    return out


def _copy_manifest(src: Any, dst: Any, mid: bytes) -> None:
    """Put manifest `mid` and all its shards from `src`'s store into `dst`'s (what the
    swarm's fetch would have stored), each shard checked against its digest on the way."""
    m = src.store.manifest(mid)
    dst.store.put_manifest(mid, m, src.store.envelope(mid))
    for s in m.shards:
        data = src.store.read_shard(mid, s.index)
        if data is None:
            raise RuntimeError(f"publisher lacks shard {s.index} of version {m.version}")
        dst.store.put_shard(mid, s.index, data)
