"""A checkpoint broadcast: shards from the trainer through a swarm of peers.

What lives here: `BroadcastConfig` and `simulate_broadcast`, which moves `size_bytes` in
`shard_bytes` shards from the origin (peer 0) to every other peer over the network model
(`swarm_sim.network`: FIFO uplink and downlink queues, latency), and compares the slowest
peer's completion with the bounds of `swarm_sim.bounds`.

The schedule is the real node's: every receiver runs `protocol.shard_schedule.
ShardScheduler` (rarest first, best measured source, endgame, stall deadlines), fed with
the have-maps of its neighbours (a random graph of `neighbours` links per peer; the origin
is the neighbour of `origin_fanout` peers). A peer that completes a shard announces its
have-map to its neighbours at once (announcements are not queued on the network); a
request takes the link's latency and no bandwidth queue (the real node caps only shard
bytes, so that small frames are not starved; queued behind whole 64 MB shards, a
10 Mb/s peer's requests waited up to 51 s behind its own uploads); a server sends one
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
    loop = EventLoop()
    n = cfg.peers + 1
    net = Network(loop, net_cfg, n, derive_rng(seed, "network"))
    net.up[0] = cfg.origin_up_mbps * 125_000
    rng = derive_rng(seed, "broadcast")
    shards = math.ceil(cfg.size_bytes / cfg.shard_bytes)
    sizes = [min(cfg.shard_bytes, cfg.size_bytes - i * cfg.shard_bytes) for i in range(shards)]
    for p in range(n):
        net.set_online(p, True)
    links: list[set[int]] = [set() for _ in range(n)]
    for p in range(1, n):
        for q in rng.sample(range(1, n), min(cfg.neighbours, n - 1)):
            if q != p:
                links[p].add(q)
                links[q].add(p)
    for p in rng.sample(range(1, n), min(cfg.origin_fanout, n - 1)):
        links[p].add(0)
        links[0].add(p)
    have: list[set[int]] = [set() for _ in range(n)]
    have[0] = set(range(shards))
    sched = [ShardScheduler(salt=p.to_bytes(4, "big")) for p in range(n)]
    done_at = [0.0] * n
    wasted = [0]
    queue: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
    busy = bytearray(n)
    queued_bytes = [0] * n
    served: list[dict[int, int]] = [{} for _ in range(n)]

    def pump(p: int) -> None:
        for req in sched[p].next_requests(loop.now):
            src = int(req.peer)
            loop.after(net.base[net.region[p]][net.region[src]], serve, src, p, req.index)

    def serve(src: int, p: int, idx: int) -> None:
        whole = src == 0  # the publisher: its copies are the only ones (first copies first)
        held = idx in have[src]
        queued = max(net.up_free[src] - loop.now, 0.0) * net.up[src] + queued_bytes[src]
        if held and src != 0 and upload_busy(queued, net.up[src]):
            sched[p].on_busy(str(src), MANIFEST, idx, loop.now)
            pump(p)
            return
        declined = held and whole and not first_copies_first(served[src], shards, idx)
        if not held or declined:
            sched[p].on_missing(str(src), MANIFEST, idx, loop.now)
            if declined:  # the real node's have-map keepalive tells p again
                loop.after(HAVE_KEEPALIVE_S, reannounce, src, p)
            pump(p)
            return
        if whole:
            served[src][idx] = served[src].get(idx, 0) + 1
        queue[src].append((p, idx))
        queued_bytes[src] += sizes[idx]
        if not busy[src]:
            upload_next(src)

    def reannounce(src: int, p: int) -> None:
        if len(have[p]) < shards:
            sched[p].on_have(str(src), MANIFEST, frozenset(have[src]), loop.now)
            pump(p)

    def upload_next(src: int) -> None:
        """The server sends its queued requests one at a time; a request whose client
        meanwhile got the shard elsewhere is skipped (the client cancelled it)."""
        busy[src] = False
        while queue[src]:
            p, idx = queue[src].popleft()
            queued_bytes[src] -= sizes[idx]
            if idx in have[p]:
                continue
            busy[src] = True
            net.send(src, p, sizes[idx], "shard", arrived, (p, idx, src), need_conn=False)
            loop.at(net.up_free[src], upload_next, src)
            return

    def arrived(p: int, idx: int, src: int) -> None:
        if idx in have[p]:
            wasted[0] += sizes[idx]  # a cancelled endgame copy
            return
        sched[p].on_done(str(src), MANIFEST, idx, loop.now)
        have[p].add(idx)
        if len(have[p]) == shards:
            done_at[p] = loop.now
        frozen = frozenset(have[p])
        for q in sorted(links[p]):
            if q != 0 and len(have[q]) < shards:
                sched[q].on_have(str(p), MANIFEST, frozen, loop.now)
                pump(q)
        pump(p)

    def tick() -> None:
        busy = False
        for p in range(1, n):
            if len(have[p]) < shards:
                busy = True
                sched[p].tick(loop.now)
                pump(p)
        if busy:
            loop.after(cfg.tick_s, tick)

    everything = frozenset(range(shards))
    for p in range(1, n):
        sched[p].want(MANIFEST, sizes)
        if 0 in links[p]:
            sched[p].on_have("0", MANIFEST, everything, 0.0)
    for p in range(1, n):
        pump(p)
    loop.after(cfg.tick_s, tick)
    loop.run(cfg.max_s)
    unfinished = sum(1 for p in range(1, n) if len(have[p]) < shards)
    times = [done_at[p] for p in range(1, n) if len(have[p]) == shards]
    bounds = broadcast_bounds(
        cfg.size_bytes, cfg.shard_bytes, net.up[0], net.up[1:].tolist(), net.down[1:].tolist()
    )
    completion = max(times) if times and not unfinished else None
    return {
        "peers": cfg.peers,
        "shards": shards,
        "completion_max_s": None if completion is None else round(completion, 3),
        "completion_p50_s": None if not times else round(percentile(times, 0.5), 3),
        "unfinished": unfinished,
        "lower_bound_s": round(bounds["lower_bound_s"], 3),
        "lower_bound_ratio": None
        if completion is None
        else round(completion / bounds["lower_bound_s"], 4),
        "star_s": round(bounds["star_s"], 3),
        "chain_s": round(bounds["chain_s"], 3),
        "tree_s": round(bounds["tree_s"], 3),
        "events": loop.events,
        "bytes_sent": net.c.bytes_sent,
        "bytes_wasted": wasted[0],
        "completion_times_s": [round(t, 3) for t in sorted(times)],
    }
