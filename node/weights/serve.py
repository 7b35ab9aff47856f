"""The serving side of a peer's policy versions: what it offers other peers' fetches.

Over `/swarm-rl/<run>/shard/1` (`node.exchange.shards.server`, one request per stream) a
peer asks for a watch of our have-map (sent at once and at every change of what we
hold), a manifest envelope, the envelope of our newest version, or a shard. Two rules
decide a shard request (both `protocol.shard_schedule`): the node that published a
version sends each of its shards once before any twice (`first_copies_first`; a request
it declines hears "not held"), and any other node whose capped uplink is past its queue
limit answers "busy". A malformed request costs its sender score.

What lives here: `WeightServer`, built by `node.weights.sync.WeightSync` as its
`server`; it reads the sync's manifests, store and upload limiter and owns the have-map
(read from the store once per change, for every watcher), the watches served per peer
and, for the versions published here, how often each shard went out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from node.exchange import shards as shard_exchange
from node.weights.store import WeightsStore
from node.weights.upload_limit import UploadLimiter
from protocol import penalties
from protocol.shard_schedule import first_copies_first
from protocol.wire import WeightManifest


class WeightServer:
    """See the module docstring. `newest()` is the newest installed version, `bump(name)`
    counts an event, `report(peer, penalty, why)` scores a peer."""

    def __init__(
        self,
        store: WeightsStore,
        manifests: dict[bytes, WeightManifest],
        limiter: UploadLimiter,
        newest: Callable[[], int | None],
        bump: Callable[[str], None],
        report: Callable[[str, penalties.Offence, str], None],
    ) -> None:
        self.store = store
        self.manifests = manifests  # the sync's: every manifest known, by id
        self.limiter = limiter
        self.newest = newest
        self.bump = bump
        self.report = report
        self.served: dict[bytes, dict[int, int]] = {}  # manifest -> shard -> times sent
        self.published: set[bytes] = set()  # manifests this process published
        self.watchers: dict[str, int] = {}  # peer -> watches of our have-map we serve
        self.generation = 0  # bumped at every change of what we hold
        self._held_changed = trio.Event()
        self._have_cache: tuple[int, list[tuple[bytes, bytes]]] = (-1, [])
        self._server = shard_exchange.server(
            limiter,
            self.have_map,
            self.wait_changed,
            self.manifest,
            self.shard,
            self.watchers,
            self.newest_envelope,
            lambda _n: bump("shards_served"),
            lambda peer, reason: report(peer, penalties.BAD_REQUEST, reason),
        )

    def held_changed(self) -> None:
        """What we hold may have changed: watchers recompute the have-map."""
        self.generation += 1
        self._held_changed.set()
        self._held_changed = trio.Event()

    def forget(self, mid: bytes) -> None:
        """Manifest `mid` was pruned: nothing of it is served any more."""
        self.served.pop(mid, None)
        self.published.discard(mid)

    async def serve(self, stream: Any) -> None:
        """Answer one request on `stream` (the peer's stream handler)."""
        await self._server(stream)

    async def manifest(self, mid: bytes) -> bytes | None:
        """The signed envelope of manifest `mid`, or None."""
        return await trio.to_thread.run_sync(self.store.envelope, mid)

    async def shard(self, mid: bytes, index: int) -> bytes | None:
        """Shard `index` of manifest `mid`; None ("not held") where first copies go first;
        raises `shard_exchange.Busy` while our capped uplink is past its queue limit."""
        m = self.manifests.get(mid)
        if m is not None and mid in self.published:
            served = self.served.setdefault(mid, {})
            if not first_copies_first(served, len(m.shards), index):
                self.bump("shards_declined_for_first_copies")
                return None
            served[index] = served.get(index, 0) + 1
        elif self.limiter.busy():
            self.bump("shards_declined_busy")
            raise shard_exchange.Busy
        return await trio.to_thread.run_sync(self.store.read_shard, mid, index)

    async def have_map(self) -> list[tuple[bytes, bytes]]:
        """What we hold, as (manifest id, bitfield); read from the store once per change
        for all watchers."""
        gen = self.generation
        if self._have_cache[0] == gen:
            return self._have_cache[1]

        def read() -> list[tuple[bytes, bytes]]:
            out = []
            for mid, m in list(self.manifests.items()):
                held = self.store.have(mid)
                if held:
                    out.append((mid, shard_exchange.bitfield(held, len(m.shards))))
            return out

        entries = await trio.to_thread.run_sync(read)
        self._have_cache = (gen, entries)
        return entries

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when what we hold changes, or after `timeout_s`."""
        with trio.move_on_after(timeout_s):
            gen = self.generation
            while self.generation == gen:
                await self._held_changed.wait()

    async def newest_envelope(self) -> bytes | None:
        """The signed manifest envelope of the newest version installed (None for none
        above version 0, which needs no manifest)."""
        newest = self.newest()
        if not newest:
            return None
        for mid, m in list(self.manifests.items()):
            if m.version == newest:
                env = await trio.to_thread.run_sync(self.store.envelope, mid)
                if env is not None:
                    return env
        return None
