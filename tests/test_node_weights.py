"""Weight broadcast between real peers (py-libp2p on loopback, in one trio process):
publish, swarm fetch, delta install, and bad input of each kind (corrupt shard, unsigned or foreign manifest, ...)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path

import numpy as np
import pytest
import trio

from node.exchange import shards as shard_exchange
from node.host.host import PeerUnreachable
from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from node.weights.store import WeightsError, WeightsStore
from node.weights.sync import WeightSettings
from protocol.codec import decode
from protocol.envelope import open_envelope, seal
from protocol.identity import Identity
from protocol.wire import RolloutRecord, WeightManifest
from tests.support import polling
from trainer.checkpoint import canonical_bytes, weights_digest
from trainer.export import full_manifest

pytestmark = pytest.mark.network

SHARD = 64 * 1024


def ckpt(seed: int, n: int = 256 * 1024, change: float = 0.0, base_seed: int = 0) -> bytes:
    """A canonical checkpoint of 4 tensors (`n` float32 values in all)."""
    rng = np.random.default_rng(base_seed)
    w = rng.standard_normal(n).astype(np.float32)
    if change:
        r = np.random.default_rng(seed)
        m = r.random(n) < change
        w = np.where(m, w + 1e-2, w).astype(np.float32)
    q = n // 4
    return canonical_bytes(
        {f"t{i}": ("F32", (q // 64, 64), w[i * q : (i + 1) * q].tobytes()) for i in range(4)}
    )


def settings(**kw) -> WeightSettings:  # type: ignore[no-untyped-def]
    base = dict(shard_bytes=SHARD)
    base.update(kw)
    return WeightSettings(**base)


def cfg(tmp: Path, name: str, manifest, identity=None, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    weights = kw.pop("weights", settings())
    return PeerConfig(
        manifest=manifest,
        identity=identity or Identity.generate(),
        data_dir=tmp / name,
        roles=("relay",),
        weights=weights,
        **kw,
    )


until = functools.partial(polling.until, timeout=90.0)


def run_manifest(name: str, trainer: Identity):  # type: ignore[no-untyped-def]
    return dataclasses.replace(net_manifest(name), trainer_keys=(trainer.peer_id,), max_staleness=1)


@contextlib.asynccontextmanager
async def trainer_and_two(tmp: Path, name: str):  # type: ignore[no-untyped-def]
    """The trainer of run `name` and two relays bootstrapped from it."""
    trainer = Identity.generate()
    manifest = run_manifest(name, trainer)
    async with open_peer(cfg(tmp, "t", manifest, trainer)) as t:
        boot = (t.host.listen_addrs()[0],)
        async with (
            open_peer(cfg(tmp, "a", manifest, bootstrap=boot)) as a,
            open_peer(cfg(tmp, "b", manifest, bootstrap=boot)) as b,
        ):
            yield t, a, b


async def test_publish_reaches_peers_then_patches_install(tmp_path: Path) -> None:
    trainer = Identity.generate()
    manifest = run_manifest("wb", trainer)
    v0 = ckpt(0)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        boot = (t.host.listen_addrs()[0],)
        async with (
            open_peer(cfg(tmp_path, "a", manifest, bootstrap=boot)) as a,
            open_peer(cfg(tmp_path, "b", manifest, bootstrap=boot)) as b,
        ):
            assert await t.weights.publish(v0) == 0
            await until(
                "v0 everywhere", lambda: a.weights.newest() == 0 and b.weights.newest() == 0
            )
            assert a.weights.store.read_version(0) == v0
            full_bytes = a.weights.counters["bytes_downloaded"]
            assert full_bytes >= len(v0)
            v1 = ckpt(1, change=0.01)
            assert await t.weights.publish(v1) == 1
            await until(
                "v1 everywhere", lambda: a.weights.newest() == 1 and b.weights.newest() == 1
            )
            assert b.weights.store.read_version(1) == v1
            assert a.policy_version == 1 and a.admission.version == 1
            delta_bytes = a.weights.counters["bytes_downloaded"] - full_bytes
            assert delta_bytes < len(v1) / 5  # the patch, not the full version
            v2 = ckpt(2, change=0.01)
            await t.weights.publish(v2)
            await until("v2", lambda: a.weights.newest() == 2)
            assert sorted(a.weights.installed()) == [0, 1, 2]  # S + 1 = 2 kept, plus snapshot 0
            st = a.stats()["weights"]
            assert st["installed"] == [0, 1, 2] and st["download"] is None


async def test_joiner_fetches_manifests_from_have_maps(tmp_path: Path) -> None:
    trainer = Identity.generate()
    manifest = run_manifest("join", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        await t.weights.publish(ckpt(0))
        await t.weights.publish(ckpt(1, change=0.01))
        async with open_peer(
            cfg(tmp_path, "j", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as j:
            await until("the joiner installs v1", lambda: j.weights.newest() == 1)
            assert j.weights.store.read_version(1) == ckpt(1, change=0.01)
            assert 0 not in j.weights.installed()  # fewest bytes: the full v1, no chain


async def test_manifest_from_a_non_trainer_key_is_refused(tmp_path: Path) -> None:
    trainer, mallory = Identity.generate(), Identity.generate()
    manifest = run_manifest("unauth", trainer)
    async with open_peer(cfg(tmp_path, "m", manifest, mallory)) as m:
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(m.host.listen_addrs()[0],))
        ) as a:
            with pytest.raises(WeightsError, match="trainer_keys"):
                await m.weights.publish(ckpt(0))
            env = seal(
                mallory,
                full_manifest(3, ckpt(0), max_shard_bytes=SHARD),
                run_id="unauth",
                policy_version=3,
                seq=m.seq.next(),
                timestamp_ms=int(trio.current_time() * 0) or _now_ms(),
            )
            await m.host.wait_for_topic_peers(m.topics["weights"], 1, 10)
            await m.host.publish(m.topics["weights"], env)
            await until("a rejects it", lambda: a.rejects.get("unauthorized", 0) >= 1)
            assert a.weights.target == 0 and a.weights.newest() is None
            assert a.admission.scores.score(m.host.peer_id, _now_ms() / 1000) < 0


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


async def test_bad_and_truncated_shards_are_fetched_elsewhere(tmp_path: Path) -> None:
    trainer = Identity.generate()
    manifest = run_manifest("bad", trainer)
    v0 = ckpt(0)
    async with open_peer(
        cfg(tmp_path, "t", manifest, trainer, weights=settings(upload_limit_mib_s=2))
    ) as t:
        await t.weights.publish(v0)
        boot = (t.host.listen_addrs()[0],)
        async with open_peer(cfg(tmp_path, "liar", manifest, bootstrap=boot)) as liar:
            await until("liar has v0", lambda: liar.weights.newest() == 0)
            real = liar.weights.store.read_shard
            calls = {"n": 0}

            def corrupt(mid: bytes, index: int) -> bytes | None:
                data = real(mid, index)
                calls["n"] += 1
                if data is None:
                    return None
                if calls["n"] % 2:
                    return bytes([data[0] ^ 1]) + data[1:]  # flipped bit: fails the digest
                return data[: len(data) // 2]  # truncated

            liar.weights.store.read_shard = corrupt  # type: ignore[method-assign]
            async with open_peer(
                cfg(tmp_path, "a", manifest, bootstrap=(liar.host.listen_addrs()[0], *boot))
            ) as a:
                await until("a installs v0", lambda: a.weights.newest() == 0)
                assert a.weights.store.read_version(0) == v0
                c = a.weights.counters
                assert calls["n"] >= 1
                assert c.get("bad_shards_received", 0) + c.get("shard_fetch_failed", 0) >= 1
                if c.get("bad_shards_received"):
                    assert a.admission.scores.score(liar.host.peer_id, _now_ms() / 1000) < 0


async def test_oversized_manifest_refused_before_download(tmp_path: Path) -> None:
    trainer = Identity.generate()
    manifest = run_manifest("big", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        small = settings(max_version_bytes=100_000)
        async with open_peer(
            cfg(tmp_path, "a", manifest, weights=small, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            await t.host.wait_for_topic_peers(t.topics["weights"], 1, 10)
            await t.weights.publish(ckpt(0))
            await until("refused", lambda: a.weights.counters.get("refused_oversized", 0) >= 1)
            await trio.sleep(0.5)
            assert a.weights.counters.get("bytes_downloaded", 0) == 0
            assert "over the limit" in (a.weights.status()["error"] or "")


async def test_restart_mid_download_resumes_without_refetching(tmp_path: Path) -> None:
    trainer = Identity.generate()
    manifest = run_manifest("resume", trainer)
    v0 = ckpt(0, n=512 * 1024)  # 2 MiB, 32 shards; the trainer uploads 1 MiB/s
    async with open_peer(
        cfg(tmp_path, "t", manifest, trainer, weights=settings(upload_limit_mib_s=1))
    ) as t:
        await t.weights.publish(v0)
        boot = (t.host.listen_addrs()[0],)
        acfg = cfg(tmp_path, "a", manifest, bootstrap=boot)
        async with open_peer(acfg) as a:
            await until("some shards", lambda: a.weights.counters.get("shards_verified", 0) >= 4)
            assert a.weights.newest() is None
        first = a.weights.counters["shards_verified"]  # counted until the peer stopped
        assert first < 32
        async with open_peer(acfg) as a2:
            await until("installed after restart", lambda: a2.weights.newest() == 0)
            second = a2.weights.counters.get("shards_verified", 0)
            n_shards = len(full_manifest(0, v0, max_shard_bytes=SHARD).shards)
            assert first + second == n_shards  # no verified shard fetched twice
            assert a2.weights.store.read_version(0) == v0


async def test_disk_full_keeps_the_previous_version(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    trainer = Identity.generate()
    manifest = run_manifest("full", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        await t.weights.publish(ckpt(0))
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            await until("v0", lambda: a.weights.newest() == 0)

            def full_disk(*_a, **_k):  # type: ignore[no-untyped-def]
                raise WeightsError("disk full while writing 1.safetensors")

            monkeypatch.setattr(a.weights.store, "install_bytes", full_disk)
            monkeypatch.setattr(a.weights.store, "install_file", full_disk)  # a patch's result
            await t.weights.publish(ckpt(1, change=0.01))
            await until("install failed", lambda: a.weights.counters.get("install_failed", 0) >= 1)
            assert a.weights.newest() == 0 and a.policy_version == 0
            assert "disk full" in a.weights.status()["error"]
            monkeypatch.undo()
            await until("v1 after space came back", lambda: a.weights.newest() == 1, timeout=30)


def test_store_refuses_a_patch_on_the_wrong_base_and_a_foreign_shard(tmp_path: Path) -> None:
    from protocol.content_id import content_id
    from trainer.export import export_version

    store = WeightsStore.open(tmp_path)
    a, b, other = ckpt(0), ckpt(1, change=0.01), ckpt(5, base_seed=9)
    store.install_bytes(0, other, weights_digest(other))  # our v0 is different weights
    delta = export_version(1, b, parent=(0, a), max_shard_bytes=SHARD)[1]
    mid = content_id(b"delta")
    store.put_manifest(mid, delta.manifest, b"env")
    for s in delta.manifest.shards:
        store.put_shard(mid, s.index, delta.payload[s.offset : s.offset + s.size])
    with pytest.raises(WeightsError, match="base version 0 not installed"):
        store.install_delta(mid)
    with pytest.raises(ValueError, match="digest"):
        store.put_shard(mid, 0, b"x" * delta.manifest.shards[0].size)  # a shard of another manifest
    with pytest.raises(WeightsError, match="signed digest"):
        store.install_bytes(1, a, weights_digest(b))
    assert sorted(store.installed()) == [0]
    store.close()


def test_a_shard_of_a_pruned_manifest_is_refused_with_its_own_error(tmp_path: Path) -> None:
    """Found by the devnet test: a validator crashed (exit 1) when a shard arrived after
    newer versions had pruned its manifest (`ValueError` out of the fetch task). The store
    now says so with `ManifestGone`, which the fetcher takes as "no longer wanted"."""
    from node.weights.store import ManifestGone
    from protocol.content_id import content_id
    from trainer.export import export_version

    store = WeightsStore.open(tmp_path)
    full = export_version(1, ckpt(1), parent=None, max_shard_bytes=SHARD)[0]
    mid = content_id(b"full-1")
    with pytest.raises(ManifestGone):
        store.put_shard(mid, 0, full.payload[: full.manifest.shards[0].size])
    assert issubclass(ManifestGone, WeightsError)
    store.close()


def test_a_full_version_is_assembled_in_place_and_installed_by_rename(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Shards of a full version go straight into one file at their offsets (served from it
    while the rest arrives); the install checks that file's digest and renames it (no
    second copy written). A full disk says so; a shard placed outside the checkpoint and a
    file that does not hash to the signed digest are refused."""
    import errno
    import os

    from protocol.content_id import content_id
    from trainer.export import export_version

    store = WeightsStore.open(tmp_path)
    data = ckpt(3)
    full = export_version(0, data, parent=None, max_shard_bytes=SHARD)[0]
    m, mid = full.manifest, content_id(b"full-0")
    store.put_manifest(mid, m, b"env")
    piece = [full.payload[s.offset : s.offset + s.size] for s in m.shards]
    for s in reversed(m.shards[1:]):  # out of order, as a swarm delivers them
        store.put_shard(mid, s.index, piece[s.index])
    assert store.read_shard(mid, 2) == piece[2] and store.read_shard(mid, 0) is None
    with pytest.raises(WeightsError, match="1 shards missing"):
        store.install_full(mid)

    def no_space(*_a, **_k):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(WeightsError, match="disk full"):
        store.put_shard(mid, 0, piece[0])
    monkeypatch.undo()
    assert 0 not in store.have(mid)
    store.put_shard(mid, 0, piece[0])
    inode = os.stat(tmp_path / "weights" / "parts" / f"{mid.hex()}.full").st_ino
    assert store.install_full(mid) == 0
    assert os.stat(store.version_path(0)).st_ino == inode  # renamed, not copied
    assert store.read_version(0) == data and store.installed() == {0: weights_digest(data)}
    assert store.read_shard(mid, 0) == piece[0]

    lying = dataclasses.replace(m, version=1, file_digest=content_id(b"other weights"))
    wide = dataclasses.replace(
        m, version=2, shards=(dataclasses.replace(m.shards[-1], offset=m.total_bytes),)
    )
    for v, bad in ((1, lying), (2, wide)):
        store.put_manifest(content_id(b"bad-%d" % v), bad, b"env")
    for s in lying.shards:
        store.put_shard(content_id(b"bad-1"), s.index, piece[s.index])
    with pytest.raises(WeightsError, match="signed digest"):
        store.install_full(content_id(b"bad-1"))
    with pytest.raises(WeightsError, match="outside"):
        store.put_shard(content_id(b"bad-2"), 0, piece[-1])
    assert sorted(store.installed()) == [0]
    store.close()


async def test_wait_installed_returns_for_version_zero(tmp_path: Path) -> None:
    trainer = Identity.generate()
    async with open_peer(cfg(tmp_path, "t", run_manifest("w0", trainer), trainer)) as t:
        await t.weights.publish(ckpt(0))
        with trio.fail_after(5):
            await t.weights.wait_installed(0)


async def test_have_maps_are_pushed_and_an_idle_swarm_opens_no_streams(tmp_path: Path) -> None:
    # Polling have-maps cost two stream setups per peer pair and period: 9 idle peers kept
    # 2 cores busy. A watch is one long-lived stream per pair; nothing is opened while idle.
    async with trainer_and_two(tmp_path, "push") as (t, a, b):
        await t.weights.publish(ckpt(0))
        await until("v0 everywhere", lambda: a.weights.newest() == 0 == b.weights.newest())
        await trio.sleep(1.5)
        opened = {
            p.identity.peer_id: p.weights.counters.get("watches_opened", 0) for p in (t, a, b)
        }
        served = t.weights.counters.get("shards_served", 0)
        await trio.sleep(4.0)  # past the keepalive: watches stay open, nothing is polled
        for p in (t, a, b):
            assert p.weights.counters.get("watches_opened", 0) == opened[p.identity.peer_id]
            assert p.weights._peer_have  # the keepalives kept coming
        assert t.weights.counters.get("shards_served", 0) == served
        # a change is pushed: a joiner learns of v0 from a's have-map, no poll period
        t0 = trio.current_time()
        async with open_peer(
            cfg(tmp_path, "c", t.manifest, bootstrap=(a.host.listen_addrs()[0],))
        ) as c:
            await until("c has v0", lambda: c.weights.newest() == 0, timeout=30)
            assert trio.current_time() - t0 < 15


async def test_a_peer_pushing_have_maps_too_fast_is_cut_off(tmp_path: Path) -> None:
    import msgpack

    from node.exchange import shards as shard_exchange
    from node.host.host import PeerError

    trainer = Identity.generate()
    manifest = run_manifest("flood", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:

        async def flood(stream) -> None:  # type: ignore[no-untyped-def]
            await stream.receive(128)
            for _ in range(10_000):
                await stream.send(msgpack.packb([]))

        t.host.set_stream_handler(shard_exchange.protocol_id(manifest.run_id), flood)
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            got: list[dict[bytes, bytes]] = []

            async def on_have(have: dict[bytes, bytes]) -> None:
                got.append(have)

            with trio.fail_after(20), pytest.raises(PeerError, match="faster"):
                await shard_exchange.watch_have(
                    a.host, t.identity.peer_id_b58, manifest.run_id, on_have
                )
            assert 5 <= len(got) < 100


async def test_a_peer_gets_at_most_two_watches_served_at_once(tmp_path: Path) -> None:
    # Each served watch is a task for up to WATCH_MAX_S: a peer opening watches in a loop
    # must not pile them up on us.
    from node.exchange import shards as shard_exchange
    from node.host.host import PeerError
    from protocol.shard_schedule import MAX_WATCHES_PER_PEER

    trainer = Identity.generate()
    manifest = run_manifest("watchcap", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        await t.weights.publish(ckpt(0))
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            tid = t.identity.peer_id_b58
            await until(
                "a watches t", lambda: t.weights.server.watchers.get(a.identity.peer_id_b58) == 1
            )

            async def on_have(have: dict[bytes, bytes]) -> None:
                pass

            async with trio.open_nursery() as nursery:
                nursery.start_soon(shard_exchange.watch_have, a.host, tid, manifest.run_id, on_have)
                await until(
                    "a second watch",
                    lambda: t.weights.server.watchers.get(a.identity.peer_id_b58) == 2,
                )
                with trio.fail_after(10), pytest.raises(PeerError):  # the third is closed at once
                    await shard_exchange.watch_have(a.host, tid, manifest.run_id, on_have)
                assert t.weights.server.watchers[a.identity.peer_id_b58] == MAX_WATCHES_PER_PEER
                nursery.cancel_scope.cancel()


async def test_a_future_version_must_be_backed_by_its_sender(tmp_path: Path) -> None:
    """future_version: a peer that gossips rollouts of a version nobody published
    is asked for the newest manifest it holds and, holding none, pays; asked the same, the
    trainer shows the manifest it signed."""
    trainer = Identity.generate()
    manifest = run_manifest("fv", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        for i in range(4):
            await t.weights.publish(ckpt(i, change=0.01 * (i > 0)))
        liar_id = Identity.generate()
        boot = (t.host.listen_addrs()[0],)
        async with open_peer(cfg(tmp_path, "liar", manifest, liar_id, bootstrap=boot)) as liar:
            env = await shard_exchange.fetch_newest(liar.host, t.host.peer_id, manifest.run_id)
            assert env is not None
            e, m = open_envelope(env, WeightManifest)
            assert m.version == 3 and e.signer == trainer.peer_id
            assert (
                await shard_exchange.fetch_newest(t.host, liar.host.peer_id, manifest.run_id)
                is None
            )

            await liar.host.wait_for_topic_peers(liar.topics["rollouts"], 1, 10)
            await trio.sleep(1.0)  # a GossipSub heartbeat: join the mesh
            for i in range(3):  # version 9: 6 ahead of the trainer's newest
                rec = synthetic_record(liar_id, manifest, i, policy_version=9, n_completion=32)
                await liar.host.publish(liar.topics["rollouts"], decode(RolloutRecord, rec).header)
            await until(
                "the liar to pay for its claim",
                lambda: t.admission.scores.score(liar_id.peer_id_b58, time.time()) < 0,
                timeout=30,
            )
            assert t.rejects["unbacked_version"] == 1  # one question for the three claims
            assert t.rejects["future_version"] == 3


async def test_a_busy_relay_declines_and_only_the_publisher_sends_first_copies_first(
    tmp_path: Path,
) -> None:
    """A capped relay whose queued upload would take over 4 s answers "busy" (no blame,
    `upload_busy`); with room it serves. A relay that finished sends a shard as
    often as it is asked (first copies first is the publisher's rule: a finished receiver
    applying it starved the last receivers in the 1,000-peer simulation); the trainer
    that published the version declines a second copy until every shard went out once."""
    async with trainer_and_two(tmp_path, "busy") as (t, a, b):
        await t.weights.publish(ckpt(0))
        # both relays done: no download of b's asks a for a shard during the test
        await until("v0 everywhere", lambda: a.weights.newest() == 0 == b.weights.newest())
        mid, m = next((k, v) for k, v in a.weights._manifests.items() if v.kind == "full")
        size = m.shards[0].size

        async def ask(p) -> bytes | None:  # type: ignore[no-untyped-def]
            # b asks p directly. Discovery may not have linked the two relays yet, and
            # when both dial at once one of the two connections is closed: dial again.
            for _ in range(20):
                try:
                    return await shard_exchange.fetch_shard(
                        b.host, p.host.peer_id, b.run_id, mid, 0, size
                    )
                except PeerUnreachable:
                    await b.host.connect(p.host.listen_addrs()[0])
                    await trio.sleep(0.1)
            raise AssertionError(f"{p.host.peer_id} stayed unreachable")

        a.weights.limiter.set_rate(1.0)
        with a.weights.limiter.sending(5 * 1024 * 1024):  # 5 s of queue at 1 MiB/s
            with pytest.raises(shard_exchange.ShardBusy):
                await ask(a)
        assert a.weights.counters.get("shards_declined_busy") == 1
        # Shard 0 went out once, the others never: the publisher declines a second
        # copy of it; the relay serves it (twice).
        t.weights.server.served[mid] = {0: 1}
        declined = t.weights.counters.get("shards_declined_for_first_copies", 0)
        assert await ask(t) is None
        assert t.weights.counters["shards_declined_for_first_copies"] == declined + 1
        first = await ask(a)
        assert first is not None and await ask(a) == first
        assert a.weights.counters.get("shards_declined_for_first_copies", 0) == 0
