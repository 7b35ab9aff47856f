"""Publish and install one model's policy versions in one process, measured: what
`swarm-node bench scale --parts weights` runs on a real shape.

`measure(state, model, work_dir)` drives the node's own code from trio, as a trainer and a
receiving peer do, without a network between them:

1. the trainer's `WeightSync.publish` (over `LocalPeer`, a peer with no host) publishes
   `state` as version 0 (a full version), then `next_state(state)` as version 1 (full and,
   in a bf16 run, a difference patch);
2. a second store takes version 0's shards (`put_shard`, each checked against its digest)
   and installs it (`install_full`), then version 1's patch (`install_delta`);
3. `model` (when given) takes version 1 from its memory map (`load_weights`: the hot swap).

Every SHA-256 the code computes goes through `hashlib.sha256`, counted while `measure`
runs; a trio task sleeping 10 ms at a time records how late it wakes (the event loop's
longest stall); a thread samples the process's resident memory every 20 ms.

Figures (seconds, GiB): `publish_full_s` (version 0), `publish_s` (version 1, full + patch),
`sha_passes` (bytes hashed by publishing version 1 / its size), `patch_bytes_ratio`,
`install_full_s` (shards stored and checked + install), `install_sha_passes`,
`install_delta_s`, `install_delta_sha_passes`, `hot_swap_s`, `version_gib`,
`peak_rss_gib`, `extra_rss_gib` (peak over the resident size when `measure` began, the
successor state included), `publish_extra_rss_gib`, `install_full_extra_rss_gib`,
`install_delta_extra_rss_gib`, `hot_swap_extra_rss_gib` (each step's peak anonymous
resident memory over its start: what the step itself holds, without the page-cache pages
of the memory-mapped versions),
`loop_max_stall_s`.

`python -m swarm_node_bench.parts.weights_stream --shape tiny|qwen2-test [--snapshot]`
prints them as one JSON line for a random model of that shape (`--snapshot`: publish a
bf16 snapshot of the weights, as the trainer role does, instead of the fp32 master).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from node.roles.policy_versions import load_weights
from node.roles.publisher import perturb
from node.testing.records import net_manifest
from node.weights.store import WeightsStore
from node.weights.sync import WeightSettings, WeightSync
from protocol.identity import Identity
from trainer.checkpoint import mapped_state_dict

PROBE_S = 0.01
RSS_EVERY_S = 0.02


class HashCount:
    """Bytes hashed by `hashlib.sha256` while `counting()` is active (any thread)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, data: Any) -> None:
        with self._lock:
            self.bytes += memoryview(data).nbytes

    @contextmanager
    def counting(self) -> Iterator[HashCount]:
        """Wrap `hashlib.sha256` (what `protocol.content_id` calls) while the block runs."""
        real = hashlib.sha256
        count = self

        class Counted:
            def __init__(self, h: Any) -> None:
                self._h = h

            def update(self, data: Any) -> None:
                count.add(data)
                self._h.update(data)

            def digest(self) -> bytes:
                return self._h.digest()

            def hexdigest(self) -> str:
                return self._h.hexdigest()

        def sha256(data: Any = b"", **kw: Any) -> Counted:
            h = Counted(real(**kw))
            if memoryview(data).nbytes:
                h.update(data)
            return h

        hashlib.sha256 = sha256  # type: ignore[assignment]
        try:
            yield self
        finally:
            hashlib.sha256 = real


def rss_bytes() -> int:
    """This process's resident set size now (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def anon_bytes() -> int:
    """This process's anonymous resident memory now (`RssAnon`: heap and private maps, not
    the page-cache pages of memory-mapped files; Linux, 0 elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class RssPeak:
    """The peak resident size, sampled by a thread every `RSS_EVERY_S` while running."""

    def __init__(self) -> None:
        self.start = rss_bytes()
        self.peak = self.start
        self.phase_peak = anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(RSS_EVERY_S):
            self.peak = max(self.peak, rss_bytes())
            self.phase_peak = max(self.phase_peak, anon_bytes())

    def phase(self) -> Callable[[], int]:
        """Start a phase: returns a function giving the phase's peak anonymous memory over
        its start (bytes; sampled, so a peak shorter than `RSS_EVERY_S` may be missed)."""
        base = anon_bytes()
        self.phase_peak = base

        def extra() -> int:
            self.phase_peak = max(self.phase_peak, anon_bytes())
            return self.phase_peak - base

        return extra

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class _Seq:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


class _Outbox:
    async def put(self, topic: str, data: bytes) -> None:
        """Announcements go nowhere: there is no network here."""


@dataclasses.dataclass
class LocalPeer:
    """What `WeightSync.publish` uses of a peer, without a host: identity, run manifest,
    sequence numbers, an outbox that drops announcements, the policy version."""

    manifest: Any
    identity: Identity
    run_id: str = "weights-stream"
    topics: dict[str, str] = dataclasses.field(default_factory=lambda: {"weights": "weights"})
    seq: _Seq = dataclasses.field(default_factory=_Seq)
    outbox: _Outbox = dataclasses.field(default_factory=_Outbox)
    policy_version: int = 0

    def set_policy_version(self, version: int) -> None:
        """Our newest installed version."""
        self.policy_version = version


async def _lag_probe(stall: list[float]) -> None:
    while True:
        t0 = trio.current_time()
        await trio.sleep(PROBE_S)
        stall[0] = max(stall[0], trio.current_time() - t0 - PROBE_S)


def measure(
    state: Mapping[str, Any],
    model: Any,
    work_dir: Path,
    *,
    dtype: str = "bfloat16",
    next_state: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    shard_bytes: int = 64 * 2**20,
) -> dict[str, Any]:
    """Publish `state` and its successor (`next_state`, default a sparse seeded nudge of 1%
    of the values), install both in a second store, hot-swap `model` (None: skipped) to the
    second; see the module docstring for the figures. `work_dir` holds both stores."""
    step = next_state or _nudge
    count = HashCount()
    with RssPeak() as rss, count.counting():
        out = trio.run(_measure, state, model, work_dir, dtype, step, shard_bytes, count, rss)
    out["peak_rss_gib"] = round(rss.peak / 2**30, 3)
    out["extra_rss_gib"] = round((rss.peak - rss.start) / 2**30, 3)
    return out


async def _measure(
    state: Mapping[str, Any],
    model: Any,
    work_dir: Path,
    dtype: str,
    step: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    shard_bytes: int,
    count: HashCount,
    rss: RssPeak,
) -> dict[str, Any]:
    identity = Identity.generate()
    manifest = dataclasses.replace(
        net_manifest("weights-stream"), trainer_keys=(identity.peer_id,), weights_dtype=dtype
    )
    peer = LocalPeer(manifest, identity)
    trainer = WeightSync(
        peer, WeightsStore.open(work_dir / "trainer"), WeightSettings(shard_bytes=shard_bytes)
    )
    receiver = WeightsStore.open(work_dir / "receiver")
    out: dict[str, Any] = {"dtype": dtype}
    stall = [0.0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_lag_probe, stall)
        t0 = time.perf_counter()
        await trainer.publish(state)
        out["publish_full_s"] = round(time.perf_counter() - t0, 3)
        nxt = await trio.to_thread.run_sync(step, state)
        hashed = count.bytes
        extra = rss.phase()
        t0 = time.perf_counter()
        await trainer.publish(nxt)
        out["publish_s"] = round(time.perf_counter() - t0, 3)
        out["publish_extra_rss_gib"] = round(extra() / 2**30, 4)
        del nxt
        size = trainer.store.version_path(1).stat().st_size
        out["version_gib"] = round(size / 2**30, 4)
        out["sha_passes"] = round((count.bytes - hashed) / size, 3)
        by_kind = {
            (m.version, m.kind): (mid, m)
            for mid, m in await trio.to_thread.run_sync(trainer.store.manifests)
        }
        out["patch_bytes_ratio"] = (
            round(by_kind[(1, "delta")][1].total_bytes / size, 4)
            if (1, "delta") in by_kind
            else None
        )
        for key, label in (((0, "full"), "install_full"), ((1, "delta"), "install_delta")):
            if key not in by_kind:
                continue
            mid, m = by_kind[key]
            hashed = count.bytes
            extra = rss.phase()
            t0 = time.perf_counter()
            await trio.to_thread.run_sync(_copy_and_install, trainer.store, receiver, mid)
            out[f"{label}_s"] = round(time.perf_counter() - t0, 3)
            out[f"{label}_extra_rss_gib"] = round(extra() / 2**30, 4)
            out[f"{label}_sha_passes"] = round((count.bytes - hashed) / size, 3)
        out["install_sha_passes"] = out.get("install_full_sha_passes")
        if model is not None and 1 in await trio.to_thread.run_sync(receiver.installed):
            extra = rss.phase()
            t0 = time.perf_counter()
            mapped = await trio.to_thread.run_sync(mapped_state_dict, receiver.version_path(1))
            await trio.to_thread.run_sync(load_weights, model, mapped)
            del mapped
            out["hot_swap_s"] = round(time.perf_counter() - t0, 3)
            out["hot_swap_extra_rss_gib"] = round(extra() / 2**30, 4)
        nursery.cancel_scope.cancel()
    out["loop_max_stall_s"] = round(stall[0], 4)
    trainer.store.close()
    receiver.close()
    return out


def _nudge(state: Mapping[str, Any]) -> dict[str, Any]:
    """`perturb` (1% of the values nudged, seeded), tied tensors kept tied (one storage
    under two names is nudged once), so the layout stays the same and a patch applies."""
    first: dict[tuple[int, tuple[int, ...], str], str] = {}
    alias: dict[str, str] = {}
    for name, t in state.items():
        key = (t.data_ptr(), tuple(t.shape), str(t.dtype))
        if t.numel() and key in first:
            alias[name] = first[key]
        else:
            first.setdefault(key, name)
    out = perturb({n: t for n, t in state.items() if n not in alias}, 1)
    return {**out, **{n: out[a] for n, a in alias.items()}}


def _copy_and_install(src: WeightsStore, dst: WeightsStore, mid: bytes) -> None:
    """What a fetch does: the manifest, then each shard checked and stored, then the
    install (blocking)."""
    m = src.manifest(mid)
    env = src.envelope(mid)
    assert m is not None and env is not None
    dst.put_manifest(mid, m, env)
    for s in m.shards:
        data = src.read_shard(mid, s.index)
        assert data is not None
        dst.put_shard(mid, s.index, data)
    if m.kind == "full":
        dst.install_full(mid)
    else:
        dst.install_delta(mid)


def _model(shape: str) -> Any:
    """A random Qwen2 model of a small shape: the built-in policy's, or `qwen2-test` (the
    real vocabulary on a tiny body)."""
    import torch  # deferred: heavy import
    from transformers import Qwen2Config, Qwen2ForCausalLM  # deferred: heavy import

    from trainer import tiny_policy  # deferred: heavy import
    from trainer.shaped_model import shape_of  # deferred: heavy import

    if shape == "tiny":
        cfg = Qwen2Config(
            vocab_size=tiny_policy.VOCAB_SIZE,
            hidden_size=tiny_policy.HIDDEN,
            intermediate_size=tiny_policy.INTERMEDIATE,
            num_hidden_layers=tiny_policy.LAYERS,
            num_attention_heads=tiny_policy.HEADS,
            num_key_value_heads=tiny_policy.KV_HEADS,
            tie_word_embeddings=True,
        )
    else:
        s = shape_of(shape)
        cfg = Qwen2Config(
            vocab_size=s.vocab,
            hidden_size=s.hidden,
            intermediate_size=s.intermediate,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads,
            tie_word_embeddings=s.tied,
        )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def main() -> None:
    """Print `measure`'s figures for a random model of `--shape` as one JSON line."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="publish a cast snapshot of the weights (as the trainer role does), not the master",
    )
    args = ap.parse_args()
    model = _model(args.shape)
    state = model.state_dict()
    if args.snapshot and args.dtype != "float32":
        from trainer.checkpoint import snapshot_state  # deferred: heavy import

        state = snapshot_state(state, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(state, model, Path(tmp), dtype=args.dtype)
    print(json.dumps({"shape": args.shape, "snapshot": args.snapshot, **figures}))


if __name__ == "__main__":
    main()
