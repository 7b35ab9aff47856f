"""Policy versions for a running peer: publish (trainer), fetch and install (everyone).

Publishing API (what the trainer role calls)
--------------------------------------------
    version = await peer.weights.publish(weights)

`weights` is a torch state dict (`{name: tensor}`), canonical or any safetensors bytes,
or a path to a `.safetensors` file. It becomes version `newest installed + 1`: exported
as a full manifest plus, when the tensor names, dtypes and shapes match the previous
version, an exact delta patch from it (`trainer.export`); both manifests are signed with
this node's key (which must be one of the run manifest's `trainer_keys`, else
`WeightsError`), installed locally first (so this node serves them at once), and the
announcement (the delta if there is one, else the full manifest) is gossiped on the
run's weights topic. Publish the same set of tensors every time (e.g. the model's
`state_dict()` each time, cast the way the swarm should run it: bf16 keeps patches small)
so that versions after the first one ship as patches. The run manifest's `weights_dtype`
fixes the dtype of what is published (`version_bytes`): "bfloat16" casts floating tensors
from the weights given (the trainer's fp32 master, left untouched) and ships each patch as
a difference patch (`trainer.delta`). Version 0 is the model directory as every role loads
it, so in a bf16 run version 1 changes the layout and ships as a full version only; later
versions patch the previous bf16 one. Returns the new version number.
The version is streamed, in one worker thread: written to the store tensor by tensor while
its file digest and shard digests are computed (two hash passes), the patch made from the
previous version's file read tensor by tensor, nothing hashed again when it is installed;
besides the weights given, one tensor and the patch are in memory at a time.
Other calls: `installed()`, `newest()`, `target`, `load_state_dict(v)` (torch tensors of
an installed version memory-mapped from its file, for a hot swap), `adopt_base(base)`
(version 0 from a model directory, a state dict or bytes), `wait_installed(v)` (with
progress), `status()`.

Fetching
--------
Announcements come in through admission (`Kind.WEIGHT_ANNOUNCE` by gossip, and
`Kind.WEIGHT_MANIFEST` for manifests pulled from a peer's have-map: a joiner learns of
older manifests that way); only a trainer key's manifest is ever admitted, and one above
`max_version_bytes` is refused before any download. The newest admitted version is the
*target*; `protocol.weights_plan.plan` picks the fewest bytes to reach it (patches from
what is installed, or a full version, or a snapshot plus patches). The shards of the
plan's manifests go into `protocol.shard_schedule.ShardScheduler`; have-maps are
pushed by peers over `/swarm-rl/<run>/shard/1` (one long-lived watch per connected peer:
a have-map at once and at every change; the trainer that signed a fresh announcement is
known to hold all of it, so it is asked without waiting for its have-map); each
`Request` the scheduler returns runs as one task (`node.exchange.shards.fetch_shard`, a
deadline on every read), a `Cancel` cancels it. A shard is checked against its signed
digest before it is stored (`node.weights.store`) and so before it is served; a bad one
costs its sender score (admission `Misbehaved`) and is fetched elsewhere. When every
shard of the plan is held, the versions install in order (patches applied, every
result's digest checked against the signed manifest) and the peer's policy version moves.
Kept: the last `max_staleness + 1` versions and the newest snapshot.

Serving
-------
Other peers' have-map watches, manifest and shard requests are answered by `server`
(`node.weights.serve.WeightServer`: first copies first for what this node published, "busy"
past the upload queue limit).

Resource handling: `run()` lives in the peer's nursery; leaving it cancels every fetch.
Error handling: remote faults become scheduler events and score changes; a local failure
(disk full, store error) is reported in `status()["error"]`, logged, and retried later;
the installed versions stay in use.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.disk_trouble import DiskTrouble
from node.exchange import shards as shard_exchange
from node.host.host import PeerError
from node.weights.serve import WeightServer
from node.weights.store import BadShard, ManifestGone, WeightsError, WeightsStore
from node.weights.upload_limit import UploadLimiter
from protocol import penalties
from protocol.admission import Admitted, Kind
from protocol.content_id import content_id, new_hasher
from protocol.envelope import seal
from protocol.identity import peer_id_to_b58
from protocol.shard_schedule import Cancel, DropPeer, Request, ScheduleConfig, ShardScheduler
from protocol.weights_plan import Offer, plan
from protocol.wire import WeightManifest
from trainer.checkpoint import (
    CheckpointError,
    ModelDirWeights,
    Streamed,
    VersionFile,
    mapped_state_dict,
    stream_bytes,
    stream_files,
    stream_state_dict,
    to_state_dict,
)
from trainer.export import (
    DEFAULT_SHARD_BYTES,
    Exported,
    ExportError,
    Parent,
    export_stream,
    is_snapshot,
)

log = logging.getLogger("swarm.weights")

MAX_MANIFEST_FETCHES = 8  # unknown manifest ids fetched per have-map poll


@dataclass(frozen=True)
class WeightSettings:
    """A node's settings for storing, serving and fetching weights."""

    upload_limit_mib_s: float = 0.0  # 0: no cap
    max_version_bytes: int = 16 * 1024**3  # refuse larger manifests before any download
    shard_bytes: int = DEFAULT_SHARD_BYTES  # what this node cuts when it publishes
    watch_peers: int = 32  # peers whose have-maps we watch at once
    watch_retry_s: float = 2.0  # a failed watch is opened again after this (doubling, to 60 s)
    tick_s: float = 0.1
    schedule: ScheduleConfig = ScheduleConfig()


class WeightSync:
    """See the module docstring. Built by `node.peer.peer.open_peer` as `peer.weights`."""

    def __init__(self, peer: Any, store: WeightsStore, settings: WeightSettings) -> None:
        self.peer = peer
        self.store = store
        self.settings = settings
        self.run_id = peer.run_id
        self.limiter = UploadLimiter(settings.upload_limit_mib_s)
        self.sched = ShardScheduler(settings.schedule, salt=peer.identity.peer_id)
        self.target = 0
        self.error: str | None = None
        self.counters: dict[str, int] = {}
        self.published_at: dict[int, float] = {}
        self.installed_at: dict[int, float] = {}
        self._manifests: dict[bytes, WeightManifest] = {}
        self._installed: dict[int, bytes] = {}
        self._peer_versions: dict[str, int] = {}
        self._peer_have: dict[str, dict[bytes, bytes]] = {}  # the last have-map each pushed
        self._watching: set[str] = set()
        self._watch_fails: dict[str, tuple[int, float]] = {}  # peer -> (failures, retry at)
        self._tried: set[bytes] = set()
        self._flights: dict[tuple[str, bytes, int], trio.CancelScope] = {}
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._started = time.monotonic()
        self._retry_at = 0.0
        self._disk = DiskTrouble()  # shard writes failing (a full disk): back off
        self._wanted: set[bytes] = set()
        self.server = WeightServer(
            store, self._manifests, self.limiter, self.newest, self._bump, self._misbehaved
        )

    # -- public -------------------------------------------------------------------------

    def note_installed(self, version: int, digest: bytes) -> None:
        """Count `version` (file digest `digest`) as installed: the caller already wrote it
        to the store, outside this sync's own fetches."""
        self._installed[version] = digest

    def installed(self) -> dict[int, bytes]:
        """Installed versions and their digests."""
        return dict(self._installed)

    def newest(self) -> int | None:
        """The newest installed version, or None."""
        return max(self._installed) if self._installed else None

    def path(self, version: int) -> Path:
        """The file of an installed version."""
        return self.store.version_path(version)

    async def load_state_dict(self, version: int) -> dict[str, Any]:
        """The torch tensors of an installed version, memory-mapped from its file (nothing
        read into memory until a tensor is; mapped off the event loop)."""
        path = self.store.version_path(version)
        try:
            return await trio.to_thread.run_sync(mapped_state_dict, path)
        except CheckpointError as exc:
            raise WeightsError(f"version {version} is not readable: {exc}") from None

    def status(self) -> dict[str, Any]:
        """Installed versions, the download's progress, uploads and counters, for `status`."""
        prog = self.sched.progress()
        elapsed = max(time.monotonic() - self._started, 1e-9)
        left = prog["bytes_total"] - prog["bytes_done"]
        rate = self.counters.get("bytes_downloaded", 0) / elapsed
        newest = self.newest()
        return {
            "installed": sorted(self._installed),
            "target": self.target,
            "download": {
                **prog,
                "rate_mib_s": round(rate / 2**20, 2),
                "eta_s": round(left / rate, 1) if rate > 0 and left > 0 else None,
            }
            if self.target > (newest if newest is not None else -1)
            else None,
            "uploaded_bytes": self.limiter.sent,
            "published_at": {str(v): t for v, t in self.published_at.items()},
            "installed_at": {str(v): t for v, t in self.installed_at.items()},
            "counters": dict(self.counters),
            "error": self.error,
        }

    async def wait_installed(self, version: int, say: Any = None, every_s: float = 5.0) -> None:
        """Wait until `version` (or newer) is installed, calling `say(line)` with the
        download's progress (rate, ETA) every `every_s`. The caller puts a deadline on it."""
        last = -math.inf
        while (-1 if (newest := self.newest()) is None else newest) < version:
            if say is not None and time.monotonic() - last >= every_s:
                last = time.monotonic()
                st = self.status()
                d = st["download"] or {}
                say(
                    f"waiting for policy version {version}: {d.get('bytes_done', 0) / 2**20:.1f}"
                    f" of {d.get('bytes_total', 0) / 2**20:.1f} MiB, {d.get('rate_mib_s', 0)} MiB/s,"
                    f" ETA {d.get('eta_s')} s"
                )
            with trio.move_on_after(every_s):
                await self._changed.wait()

    def _bump(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _notify(self, held_changed: bool = True) -> None:
        """Wake whoever waits on a change; `held_changed`: what we hold may have changed
        (watchers of our have-map recompute it)."""
        if held_changed:
            self.server.held_changed()
        self._changed.set()
        self._changed = trio.Event()

    # -- version 0 and publishing ----------------------------------------------------------

    async def adopt_base(self, base: BaseWeights) -> bytes:
        """Install the model's weights as version 0 (if nothing is installed), after
        checking them against the run manifest's `model_digest` when it is set. `base`: a
        model directory (`trainer.checkpoint.ModelDirWeights`, digest already known), a
        state dict or checkpoint bytes. Hashing and writing run in a worker thread; nothing
        of the checkpoint is kept."""
        digest = await trio.to_thread.run_sync(
            adopt_into, self.store, base, self.peer.manifest.model_digest, 0 in self._installed
        )
        if 0 not in self._installed:
            self._installed[0] = digest
            self._notify()
        return digest

    async def publish(self, weights: bytes | Mapping[str, Any] | str | os.PathLike[str]) -> int:
        """Sign, install and announce `weights` as the next version; see the docstring."""
        if self.peer.identity.peer_id not in self.peer.manifest.trainer_keys:
            raise WeightsError("this node's key is not one of the run manifest's trainer_keys")
        newest = self.newest()
        version = 0 if newest is None else max(newest, self.target) + 1
        parent = None if newest is None else (newest, self._installed[newest])
        dtype = self.peer.manifest.weights_dtype
        staged = self.store.staging()
        try:
            full, delta = await trio.to_thread.run_sync(
                lambda: export_to_file(
                    self.store,
                    staged,
                    version,
                    weights,
                    parent,
                    dtype,
                    max_shard_bytes=self.settings.shard_bytes,
                )
            )
            announce = b""
            for manifest, payload in [
                (full, None),
                *([(delta.manifest, delta.payload)] if delta else []),
            ]:
                env = seal(
                    self.peer.identity,
                    manifest,
                    run_id=self.run_id,
                    policy_version=version,
                    seq=self.peer.seq.next(),
                    timestamp_ms=int(time.time() * 1000),
                )
                mid = content_id(env)

                def keep(
                    m: WeightManifest = manifest,
                    data: bytes | None = payload,
                    env: bytes = env,
                    mid: bytes = mid,
                ) -> None:
                    self.store.put_manifest(mid, m, env)
                    if data is None:
                        self.store.install_file(version, staged, m.file_digest)
                        return
                    view = memoryview(data)
                    for s in m.shards:
                        self.store.put_shard(
                            mid, s.index, view[s.offset : s.offset + s.size], digest_known=True
                        )

                await trio.to_thread.run_sync(keep)
                self._manifests[mid] = manifest
                self.server.published.add(mid)
                announce = env  # the delta (exported last) when there is one
        finally:
            staged.unlink(missing_ok=True)
        self._installed[version] = full.file_digest
        self.target = max(self.target, version)
        self.published_at[version] = time.time()
        self.installed_at[version] = time.time()
        self._set_version(version)
        await self._prune()
        await self.peer.outbox.put(self.peer.topics["weights"], announce)
        self._bump("published")
        return version

    # -- inputs from the peer ------------------------------------------------------------

    def on_admitted(self, item: Admitted) -> None:
        """An admitted weight manifest (gossip or pulled); runs on the event loop."""
        if item.kind not in (Kind.WEIGHT_ANNOUNCE, Kind.WEIGHT_MANIFEST):
            return
        m: WeightManifest = item.obj
        if m.total_bytes > self.settings.max_version_bytes:
            self._bump("refused_oversized")
            self.error = (
                f"version {m.version}: {m.total_bytes} bytes is over the limit of "
                f"{self.settings.max_version_bytes} (weights.max_version_mib); not downloaded"
            )
            log.warning(self.error)
            return
        if item.envelope.policy_version != m.version:
            return  # signed by a trainer key but inconsistent: ignore
        if item.content_id in self._manifests:
            return
        self._manifests[item.content_id] = m
        signer = peer_id_to_b58(item.envelope.signer)
        if item.kind is Kind.WEIGHT_ANNOUNCE and signer in self.peer.host.connected_peers():
            # The trainer installs a version before it announces it: it holds every shard,
            # so we need not wait for its have-map to ask it.
            self.sched.on_have(signer, item.content_id, range(len(m.shards)), trio.current_time())
        for peer, have in self._peer_have.items():  # pushed before we knew the manifest
            if item.content_id in have:
                self._apply_have(peer, item.content_id, have[item.content_id])
        if self._nursery is not None:
            self._nursery.start_soon(self._keep_manifest, item.content_id, m, item.data)
        if m.version > self.target:
            self.target = m.version
            self._bump("announced")
        self._notify()

    async def _keep_manifest(self, mid: bytes, m: WeightManifest, env: bytes) -> None:
        try:
            await trio.to_thread.run_sync(self.store.put_manifest, mid, m, env)
        except WeightsError as exc:
            self.error = str(exc)
            return
        self._notify()  # our have-map lists it now if we hold any of its shards

    def known_top(self) -> int:
        """The newest version this node knows of: its target, or what a peer said it has."""
        return max([self.target, *self._peer_versions.values()])

    def on_hello(self, peer: str, version: int) -> None:
        """Remember the newest version `peer` said it has."""
        self._peer_versions[peer] = version

    def on_peer_gone(self, peer: str) -> None:
        """`peer` disconnected: its requests are cancelled and asked elsewhere, no blame."""
        self._peer_versions.pop(peer, None)
        self._peer_have.pop(peer, None)
        self._watch_fails.pop(peer, None)
        self._dispatch(self.sched.on_peer_gone(peer, trio.current_time()))
        self._notify(held_changed=False)

    # -- serving (`node.weights.serve`) ---------------------------------------------------

    async def serve(self, stream: Any) -> None:
        """The shard protocol's stream handler: one request, answered by `server`."""
        await self.server.serve(stream)

    def _misbehaved(self, peer: str, offence: penalties.Offence, why: str) -> None:
        self.peer.report(peer, offence.cost, why, offence.name)

    # -- the download loop -------------------------------------------------------------------

    async def run(self) -> None:
        """Load what is stored, then fetch and install until cancelled."""
        self._installed = await trio.to_thread.run_sync(self.store.installed)
        for mid, m in await trio.to_thread.run_sync(self.store.manifests):
            self._manifests[mid] = m
        self.target = max(
            [self.target, *self._installed, *(m.version for m in self._manifests.values())]
        )
        if self._installed:
            self._set_version(max(self._installed))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._watch_loop)
            while True:
                await self._step(nursery)
                with trio.move_on_after(self.settings.tick_s):
                    await self._changed.wait()

    def _behind(self) -> bool:
        newest = self.newest()
        top = max([self.target, *self._peer_versions.values()])
        return newest is None or top > newest

    def _offers(self) -> list[Offer]:
        out = []
        for mid, m in self._manifests.items():
            if (
                m.kind == "delta"
                and self._installed.get(m.base_version, m.base_digest) != m.base_digest
            ):
                continue  # our base is another set of weights: this patch cannot apply
            out.append(Offer(mid, m.version, m.kind, m.base_version, m.total_bytes))
        return out

    async def _step(self, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        for action in self.sched.tick(now):
            self._do(action, nursery)
        newest = self.newest()
        if newest is not None and self.target <= newest:
            return
        steps = plan(self.target, self._installed, self._offers())
        if steps is None:
            return  # manifests still unknown: the poll loop asks peers for them
        for o in steps:
            m = self._manifests[o.manifest_id]
            if o.manifest_id not in self._wanted:
                held = await trio.to_thread.run_sync(self.store.have, o.manifest_id)
                self.sched.want(o.manifest_id, [s.size for s in m.shards], held)
                self._wanted.add(o.manifest_id)
        if all(self.sched.complete(o.manifest_id) for o in steps):
            if time.monotonic() >= self._retry_at:
                await self._install(steps)
            return
        if not self._disk.ready(time.monotonic()):
            return  # the last shard could not be written: ask again after the pause
        for action in self.sched.next_requests(now):
            self._do(action, nursery)

    def _do(self, action: Any, nursery: trio.Nursery) -> None:
        if isinstance(action, Request):
            # trio declares `cancelled_caught` with attrs' `init=False`, which pyright reads
            # as a constructor argument
            scope = trio.CancelScope()  # pyright: ignore[reportCallIssue]
            self._flights[(action.peer, action.manifest_id, action.index)] = scope
            nursery.start_soon(self._fetch, action, scope)
        elif isinstance(action, Cancel):
            scope = self._flights.pop((action.peer, action.manifest_id, action.index), None)
            if scope is not None:
                scope.cancel()
        elif isinstance(action, DropPeer):
            self._bump("peers_dropped")
            log.info("weights: not asking %s until later: %s", action.peer[:12], action.reason)

    async def _fetch(self, req: Request, scope: trio.CancelScope) -> None:
        key = (req.peer, req.manifest_id, req.index)
        m = self._manifests[req.manifest_id]
        info = m.shards[req.index]
        now = trio.current_time
        try:
            with scope:
                try:
                    data = await shard_exchange.fetch_shard(
                        self.peer.host, req.peer, self.run_id, req.manifest_id, req.index, info.size
                    )
                except shard_exchange.ShardBusy:
                    self._bump("shard_fetch_busy")
                    self.sched.on_busy(req.peer, req.manifest_id, req.index, now())
                    return
                except PeerError as exc:
                    self._bump("shard_fetch_failed")
                    log.info("weights: shard %d from %s failed: %s", req.index, req.peer[:12], exc)
                    self._dispatch(
                        self.sched.on_failed(req.peer, req.manifest_id, req.index, now())
                    )
                    return
                if data is None:
                    self.sched.on_missing(req.peer, req.manifest_id, req.index, now())
                    return
                try:  # the store checks the digest (once, off the event loop) before writing
                    await trio.to_thread.run_sync(
                        self.store.put_shard, req.manifest_id, req.index, data
                    )
                except BadShard:
                    self._bump("bad_shards_received")
                    self._misbehaved(
                        req.peer, penalties.BAD_SHARD, "shard failed its signed digest"
                    )
                    self._dispatch(self.sched.on_bad(req.peer, req.manifest_id, req.index, now()))
                    return
                except ManifestGone:
                    # newer versions pruned it while this shard was on its way: unwanted now
                    self._bump("shards_of_pruned_manifests")
                    self._dispatch(self.sched.forget(req.manifest_id))
                    return
                except WeightsError as exc:
                    self.error = str(exc)
                    self.sched.on_missing(req.peer, req.manifest_id, req.index, now())
                    self._bump("shard_write_failed")
                    if self._disk.failed(time.monotonic()):
                        log.warning("weights: %s: downloads paused, retried with backoff", exc)
                    self._retry_at = self._disk.retry_at
                    return
                if self._disk.ok():
                    log.warning("weights: shards are written again")
                self._bump("bytes_downloaded", len(data))
                self._bump("shards_verified")
                self.server.held_changed()
                self._dispatch(self.sched.on_done(req.peer, req.manifest_id, req.index, now()))
        finally:
            self._flights.pop(key, None)
            self._notify(held_changed=False)

    def _dispatch(self, actions: list[Any]) -> None:
        if self._nursery is not None:
            for a in actions:
                self._do(a, self._nursery)

    async def _install(self, steps: list[Offer]) -> None:
        for o in steps:
            m = self._manifests[o.manifest_id]
            fn = self.store.install_full if m.kind == "full" else self.store.install_delta
            try:
                await trio.to_thread.run_sync(fn, o.manifest_id)
            except WeightsError as exc:
                self.error = str(exc)
                log.warning("weights: install of version %d failed: %s", m.version, exc)
                self._retry_at = time.monotonic() + 5.0
                self._bump("install_failed")
                if m.kind == "delta":  # e.g. a patch that does not apply: fetch the full one
                    self._manifests.pop(o.manifest_id, None)
                return
            self._installed[m.version] = m.file_digest
            self.installed_at[m.version] = time.time()
            self.sched.forget(o.manifest_id)
            self._wanted.discard(o.manifest_id)
            self._bump("installed")
            self.error = None
            log.info("weights: installed version %d (%s)", m.version, m.kind)
        self._set_version(max(self._installed))
        await self._prune()

    def _set_version(self, version: int) -> None:
        self.peer.set_policy_version(version)
        self._notify()

    async def _prune(self) -> None:
        s = self.peer.manifest.max_staleness
        newest = max(self._installed)
        keep = {v for v in self._installed if v > newest - s - 1}
        snaps = [v for v in self._installed if is_snapshot(v, self.peer.manifest.snapshot_every)]
        if snaps:
            keep.add(max(snaps))
        dropped = await trio.to_thread.run_sync(self.store.prune, keep)
        for v in dropped:
            self._installed.pop(v, None)
        floor = min(keep)
        for mid in [k for k, m in self._manifests.items() if m.version < floor]:
            self._manifests.pop(mid, None)
            self.server.forget(mid)

    # -- have-maps ---------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Keep one have-map watch open to each connected peer (up to `watch_peers`)."""
        assert self._nursery is not None
        while True:
            now = trio.current_time()
            for peer in self.peer.host.connected_peers():
                if len(self._watching) >= self.settings.watch_peers:
                    break
                if peer not in self._watching and self._watch_fails.get(peer, (0, 0.0))[1] <= now:
                    self._watching.add(peer)
                    self._nursery.start_soon(self._watch_one, peer)
            await trio.sleep(0.5)

    async def _watch_one(self, peer: str) -> None:
        async def on_have(have: dict[bytes, bytes]) -> None:
            await self._on_have_map(peer, have)

        self._bump("watches_opened")
        try:
            await shard_exchange.watch_have(self.peer.host, peer, self.run_id, on_have)
            self._watch_fails.pop(peer, None)
        except PeerError as exc:
            fails = self._watch_fails.get(peer, (0, 0.0))[0] + 1
            delay = min(60.0, self.settings.watch_retry_s * 2 ** (fails - 1))
            self._watch_fails[peer] = (fails, trio.current_time() + delay)
            log.debug("weights: have-map watch of %s ended: %s", peer[:12], exc)
        finally:
            self._watching.discard(peer)

    async def _on_have_map(self, peer: str, have: dict[bytes, bytes]) -> None:
        self._peer_have[peer] = have
        fetched = 0
        for mid, bits in have.items():
            if mid in self._manifests:
                self._apply_have(peer, mid, bits)
                continue
            if mid in self._tried or fetched >= MAX_MANIFEST_FETCHES or not self._behind():
                continue
            self._tried.add(mid)
            fetched += 1
            try:
                env = await shard_exchange.fetch_manifest(self.peer.host, peer, self.run_id, mid)
            except PeerError:
                continue
            if env is not None and content_id(env) == mid:
                # admitted manifests arrive through `on_admitted`, which applies `have`
                await self.peer.admit(peer, Kind.WEIGHT_MANIFEST, env)
        self._notify(held_changed=False)

    def _apply_have(self, peer: str, mid: bytes, bits: bytes) -> None:
        n = len(self._manifests[mid].shards)
        self.sched.on_have(peer, mid, shard_exchange.from_bitfield(bits, n), trio.current_time())


BaseWeights = ModelDirWeights | Mapping[str, Any] | bytes


def adopt_into(
    store: WeightsStore, base: BaseWeights, want: bytes | None, installed: bool
) -> bytes:
    """Version 0's digest; checked against `want` (the run's `model_digest`) when set, and
    written to the store unless a version 0 is `installed` already. One hash pass (none
    for a model directory, whose digest was taken when it was named), one write; blocking:
    call it in a thread."""
    try:
        if isinstance(base, ModelDirWeights):
            digest, src = base.digest, base.stream()
        else:
            src = (
                stream_bytes(bytes(base))
                if isinstance(base, bytes | bytearray)
                else stream_state_dict(base)
            )
            digest = src.digest()
    except (CheckpointError, OSError) as exc:
        raise WeightsError(f"the model's weights: {exc}") from None
    if want and digest != want:
        raise WeightsError(
            f"the model's weights digest {digest.hex()[:16]}... does not match the run "
            f"manifest's model_digest {want.hex()[:16]}...: wrong model for this run"
        )
    if installed:
        return digest
    staged = store.staging()
    try:
        hasher = new_hasher() if isinstance(base, ModelDirWeights) else None
        with open(staged, "wb") as fh:
            src.write_to(fh, hasher)
        if hasher is not None and hasher.digest() != digest:
            raise WeightsError("the model directory's weights changed while the node started")
        store.install_file(0, staged, digest)
    except CheckpointError as exc:
        raise WeightsError(f"the model's weights: {exc}") from None
    except OSError as exc:
        raise WeightsError(f"cannot write version 0: {exc.strerror or exc}") from None
    finally:
        staged.unlink(missing_ok=True)
    return digest


def export_to_file(
    store: WeightsStore,
    path: Path,
    version: int,
    weights: bytes | Mapping[str, Any] | str | os.PathLike[str],
    parent: tuple[int, bytes] | None,
    dtype: str,
    *,
    max_shard_bytes: int,
) -> tuple[WeightManifest, Exported | None]:
    """Write `weights` as version `version` to `path` while exporting it (`trainer.export.
    export_stream`): its full manifest and, from `parent` = (installed version, digest),
    its delta. The parent is read tensor by tensor from the store. Blocking: call it in
    a thread."""
    try:
        base = VersionFile(store.version_path(parent[0])) if parent is not None else None
    except CheckpointError as exc:
        raise WeightsError(f"cannot publish: the previous version: {exc}") from None
    try:
        names = {t.name for t in base.index} if base is not None else set()
        src = version_stream(weights, names, dtype)
        ref = (
            Parent(parent[0], parent[1], base.header, base.read)
            if base is not None and parent is not None
            else None
        )
        with open(path, "wb") as fh:
            return export_stream(
                version,
                src,
                fh.write,
                ref,
                max_shard_bytes=max_shard_bytes,
                difference=dtype != "float32",
            )
    except ExportError as exc:
        raise WeightsError(f"cannot publish version {version}: {exc}") from None
    except OSError as exc:
        raise WeightsError(f"cannot publish version {version}: {exc.strerror or exc}") from None
    finally:
        if base is not None:
            base.close()


def version_bytes(
    weights: bytes | Mapping[str, Any] | str | os.PathLike[str], names: set[str], dtype: str
) -> bytes:
    """The canonical bytes a run publishes for `weights` (`version_stream`, in memory)."""
    return version_stream(weights, names, dtype).to_bytes()


def version_stream(
    weights: bytes | Mapping[str, Any] | str | os.PathLike[str], names: set[str], dtype: str
) -> Streamed:
    """The canonical checkpoint a run publishes for `weights` (a state dict, checkpoint bytes or
    a `.safetensors` path), as a stream: tied tensors under `names` (the previous version's)
    when they have one, floating tensors cast to the run's `weights_dtype` `dtype` unless it
    is "float32", which publishes them as given. Blocking: call it in a thread."""
    cast = None if dtype == "float32" else dtype
    try:
        if isinstance(weights, bytes | bytearray):
            if cast is None:
                return stream_bytes(bytes(weights))
            return stream_state_dict(to_state_dict(bytes(weights)), cast=cast)
        if isinstance(weights, str | os.PathLike):
            if cast is None:
                return stream_files([Path(weights)])
            return stream_state_dict(mapped_state_dict(Path(weights)), cast=cast)
        return stream_state_dict(weights, prefer=names, cast=cast)
    except (CheckpointError, OSError) as exc:
        raise WeightsError(f"cannot publish: {exc}") from None
