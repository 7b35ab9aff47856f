"""A checkpoint broadcast: shards from the trainer through a swarm of peers.

What lives here: `BroadcastConfig` and `simulate_broadcast`, which moves `size_bytes` in
`shard_bytes` shards from the origin (peer 0) to every other peer over the network model
(`swarm_sim.network`: FIFO uplink and downlink queues, latency), and compares the slowest
peer's completion with the bounds of `swarm_sim.bounds`. `_Broadcast` holds one
broadcast's state; its methods are the events.

The schedule is the real node's: every receiver runs `protocol.shard_schedule.
ShardScheduler` (rarest first, best measured source, endgame, stall deadlines), fed with
the have-maps of its neighbours (a random graph of `neighbours` links per peer; the origin
is the neighbour of `origin_fanout` peers). A peer that completes a shard announces its
have-map to its neighbours at once (announcements are not queued on the network); a
request takes the link's latency and no bandwidth queue (the real node caps only shard
bytes, so that small frames are not starved behind a slow peer's own shard uploads); a
server sends one
shard at a time from its queue of requests, skipping those whose client got the shard
meanwhile (cancelled), and a copy already on the wire arrives and is ignored
(`bytes_wasted`). A server declines a request while its uplink has more than
`UPLOAD_MAX_WAIT_S` of queued bytes (`upload_busy`), except the origin, which sends each
shard once before any twice instead (`first_copies_first`; declining redirects nobody
while its copies are the only ones). As in the real node, the first answers "busy"
(`on_busy`: the client leaves that server alone for about a shard's time) and the
second "not held" (`on_missing`: the client asks it for other shards at once and hears
its have-map again after the real node's keepalive).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from protocol.shard_schedule import (
    HAVE_KEEPALIVE_S,
    ShardScheduler,
    first_copies_first,
    upload_busy,
)
from swarm_sim.bounds import broadcast_bounds
from swarm_sim.core import EventLoop, derive_rng
from swarm_sim.metrics import percentile
from swarm_sim.network import NetConfig, Network

__all__ = ["BroadcastConfig", "simulate_broadcast"]


@dataclass(frozen=True, slots=True)
class BroadcastConfig:
    """One checkpoint broadcast: its size and shards, the peers and their links."""

    peers: int = 1000  # receivers (the origin is one more)
    size_bytes: int = 1_000_000_000
    shard_bytes: int = 64_000_000
    origin_up_mbps: float = 1000.0
    neighbours: int = 8  # have-map links each peer opens
    origin_fanout: int = 16  # peers that have the origin as a neighbour
    tick_s: float = 5.0  # scheduler ticks (stall deadlines)
    max_s: float = 86_400.0

    def __post_init__(self) -> None:
        if self.peers < 1 or self.size_bytes <= 0 or self.shard_bytes <= 0:
            raise ValueError("a broadcast needs peers, a size and a shard size")
        if self.origin_up_mbps <= 0 or min(self.neighbours, self.origin_fanout) < 1:
            raise ValueError("origin_up_mbps > 0, neighbours >= 1, origin_fanout >= 1")


MANIFEST = b"\x01" * 32


def simulate_broadcast(cfg: BroadcastConfig, net_cfg: NetConfig, seed: int = 0) -> dict:
    """Run one broadcast; returns figures (seconds) and the completion times."""
    b = _Broadcast(cfg, net_cfg, seed)
    b.start()
    b.loop.run(cfg.max_s)
    return b.figures()


def _random_links(cfg: BroadcastConfig, n: int, rng: random.Random) -> list[set[int]]:
    """Have-map links: `neighbours` random peers each (both ways), and the origin (peer 0)
    as a neighbour of `origin_fanout` random peers."""
    links: list[set[int]] = [set() for _ in range(n)]
    for p in range(1, n):
        for q in rng.sample(range(1, n), min(cfg.neighbours, n - 1)):
            if q != p:
                links[p].add(q)
                links[q].add(p)
    for p in rng.sample(range(1, n), min(cfg.origin_fanout, n - 1)):
        links[p].add(0)
        links[0].add(p)
    return links


class _Broadcast:
    """One broadcast in progress: the network, each peer's scheduler, the shards it holds
    and, per server, its queue of requests. Peer 0 is the origin and holds every shard."""

    def __init__(self, cfg: BroadcastConfig, net_cfg: NetConfig, seed: int) -> None:
        self.cfg = cfg
        self.loop = loop = EventLoop()
        self.n = n = cfg.peers + 1
        self.net = net = Network(loop, net_cfg, n, derive_rng(seed, "network"))
        net.up[0] = cfg.origin_up_mbps * 125_000
        rng = derive_rng(seed, "broadcast")
        self.shards = shards = math.ceil(cfg.size_bytes / cfg.shard_bytes)
        self.sizes = [
            min(cfg.shard_bytes, cfg.size_bytes - i * cfg.shard_bytes) for i in range(shards)
        ]
        for p in range(n):
            net.set_online(p, True)
        self.links = _random_links(cfg, n, rng)
        self.have: list[set[int]] = [set() for _ in range(n)]
        self.have[0] = set(range(shards))
        self.sched = [ShardScheduler(salt=p.to_bytes(4, "big")) for p in range(n)]
        self.done_at = [0.0] * n
        self.wasted = 0
        self.queue: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
        self.sending = bytearray(n)  # per server: a shard is on its uplink
        self.queued_bytes = [0] * n
        self.served: list[dict[int, int]] = [{} for _ in range(n)]  # shard -> copies sent

    def start(self) -> None:
        """Every receiver wants the shards; those linked to the origin know it holds all."""
        everything = frozenset(range(self.shards))
        for p in range(1, self.n):
            self.sched[p].want(MANIFEST, self.sizes)
            if 0 in self.links[p]:
                self.sched[p].on_have("0", MANIFEST, everything, 0.0)
        for p in range(1, self.n):
            self.pump(p)
        self.loop.after(self.cfg.tick_s, self.tick)

    def pump(self, p: int) -> None:
        """Send `p`'s scheduler's requests (each arrives after the link's latency)."""
        net, loop = self.net, self.loop
        for req in self.sched[p].next_requests(loop.now):
            src = int(req.peer)
            loop.after(net.base[net.region[p]][net.region[src]], self.serve, src, p, req.index)

    def serve(self, src: int, p: int, idx: int) -> None:
        """`src` answers `p`'s request for shard `idx`: busy, not held (or declined by the
        origin), or queued for its uplink."""
        net, now, sched = self.net, self.loop.now, self.sched[p]
        whole = src == 0  # the publisher: its copies are the only ones (first copies first)
        held = idx in self.have[src]
        queued = max(net.up_free[src] - now, 0.0) * net.up[src] + self.queued_bytes[src]
        if held and src != 0 and upload_busy(queued, net.up[src]):
            sched.on_busy(str(src), MANIFEST, idx, now)
            self.pump(p)
            return
        declined = held and whole and not first_copies_first(self.served[src], self.shards, idx)
        if not held or declined:
            sched.on_missing(str(src), MANIFEST, idx, now)
            if declined:  # the real node's have-map keepalive tells p again
                self.loop.after(HAVE_KEEPALIVE_S, self.reannounce, src, p)
            self.pump(p)
            return
        if whole:
            self.served[src][idx] = self.served[src].get(idx, 0) + 1
        self.queue[src].append((p, idx))
        self.queued_bytes[src] += self.sizes[idx]
        if not self.sending[src]:
            self.upload_next(src)

    def reannounce(self, src: int, p: int) -> None:
        if len(self.have[p]) < self.shards:
            self.sched[p].on_have(str(src), MANIFEST, frozenset(self.have[src]), self.loop.now)
            self.pump(p)

    def upload_next(self, src: int) -> None:
        """The server sends its queued requests one at a time; a request whose client
        meanwhile got the shard elsewhere is skipped (the client cancelled it)."""
        self.sending[src] = False
        queue = self.queue[src]
        while queue:
            p, idx = queue.popleft()
            self.queued_bytes[src] -= self.sizes[idx]
            if idx in self.have[p]:
                continue
            self.sending[src] = True
            self.net.send(
                src, p, self.sizes[idx], "shard", self.arrived, (p, idx, src), need_conn=False
            )
            self.loop.at(self.net.up_free[src], self.upload_next, src)
            return

    def arrived(self, p: int, idx: int, src: int) -> None:
        """Shard `idx` reached `p`: it announces its have-map to its neighbours at once."""
        now, have = self.loop.now, self.have[p]
        if idx in have:
            self.wasted += self.sizes[idx]  # a cancelled endgame copy
            return
        self.sched[p].on_done(str(src), MANIFEST, idx, now)
        have.add(idx)
        if len(have) == self.shards:
            self.done_at[p] = now
        frozen = frozenset(have)
        for q in sorted(self.links[p]):
            if q != 0 and len(self.have[q]) < self.shards:
                self.sched[q].on_have(str(p), MANIFEST, frozen, now)
                self.pump(q)
        self.pump(p)

    def tick(self) -> None:
        """Scheduler ticks (stall deadlines) while any receiver is unfinished."""
        unfinished = False
        for p in range(1, self.n):
            if len(self.have[p]) < self.shards:
                unfinished = True
                self.sched[p].tick(self.loop.now)
                self.pump(p)
        if unfinished:
            self.loop.after(self.cfg.tick_s, self.tick)

    def figures(self) -> dict:
        """Completion times and the bounds they are compared with."""
        cfg, net, n, shards = self.cfg, self.net, self.n, self.shards
        unfinished = sum(1 for p in range(1, n) if len(self.have[p]) < shards)
        times = [self.done_at[p] for p in range(1, n) if len(self.have[p]) == shards]
        bounds = broadcast_bounds(
            cfg.size_bytes, cfg.shard_bytes, net.up[0], net.up[1:].tolist(), net.down[1:].tolist()
        )
        completion = max(times) if times and not unfinished else None
        p50 = percentile(times, 0.5)
        return {
            "peers": cfg.peers,
            "shards": shards,
            "completion_max_s": None if completion is None else round(completion, 3),
            "completion_p50_s": None if p50 is None else round(p50, 3),
            "unfinished": unfinished,
            "lower_bound_s": round(bounds["lower_bound_s"], 3),
            "lower_bound_ratio": None
            if completion is None
            else round(completion / bounds["lower_bound_s"], 4),
            "star_s": round(bounds["star_s"], 3),
            "chain_s": round(bounds["chain_s"], 3),
            "tree_s": round(bounds["tree_s"], 3),
            "events": self.loop.events,
            "bytes_sent": net.c.bytes_sent,
            "bytes_wasted": self.wasted,
            "completion_times_s": [round(t, 3) for t in sorted(times)],
        }
