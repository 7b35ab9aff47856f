"""A checkpoint broadcast: shards from the trainer through a swarm of peers.

What lives here: `BroadcastConfig` and `simulate_broadcast`, which moves `size_bytes` in
`shard_bytes` shards from the origin (peer 0) to every other peer over the network model
(`swarm_sim.network`: FIFO uplink and downlink queues, latency), and compares the slowest
peer's completion with the bounds of `swarm_sim.bounds`.

The schedule: each peer keeps `downloads` shard requests open and each holder serves at
most `uploads` at once; a peer asks for the rarest shard it lacks that a holder with a
free upload slot has, from the one (origin included) with the earliest expected finish
(its uplink queue plus shard / uplink) among `candidates` sampled at random; a peer that
finds none waits for the next completed transfer. Until the broadcast issue lands its pure shard
scheduler in `protocol/`, this is the simulator's own stand-in for that rule; once it
does, this module drives that one instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    downloads: int = 2  # open shard requests per peer
    uploads: int = 2  # shards a peer serves at once
    candidates: int = 64  # holders compared per request
    max_s: float = 86_400.0

    def __post_init__(self) -> None:
        if self.peers < 1 or self.size_bytes <= 0 or self.shard_bytes <= 0:
            raise ValueError("a broadcast needs peers, a size and a shard size")
        if self.origin_up_mbps <= 0 or min(self.downloads, self.uploads, self.candidates) < 1:
            raise ValueError("origin_up_mbps > 0, downloads >= 1, candidates >= 1")


def simulate_broadcast(cfg: BroadcastConfig, net_cfg: NetConfig, seed: int = 0) -> dict:
    """Run one broadcast; returns figures (seconds) and the completion times."""
    loop = EventLoop()
    n = cfg.peers + 1
    net = Network(
        loop, replace(net_cfg, max_conns=max(net_cfg.max_conns, n)), n, derive_rng(seed, "network")
    )
    net.up[0] = cfg.origin_up_mbps * 125_000
    rng = derive_rng(seed, "broadcast")
    shards = math.ceil(cfg.size_bytes / cfg.shard_bytes)
    sizes = [min(cfg.shard_bytes, cfg.size_bytes - i * cfg.shard_bytes) for i in range(shards)]
    have = [set() for _ in range(n)]
    have[0] = set(range(shards))
    holders = [[0] for _ in range(shards)]
    pending = [set() for _ in range(n)]
    done_at = [0.0] * n
    for p in range(n):
        net.set_online(p, True)

    uploads = [0] * n
    waiting: list[int] = []  # peers that found no holder with a free upload slot

    def expected_finish(src: int, dst: int, size: int) -> float:
        return max(loop.now, net.up_free[src]) + size / min(net.up[src], net.down[dst])

    def request(p: int) -> bool:
        lacking = [s for s in range(shards) if s not in have[p] and s not in pending[p]]
        lacking.sort(key=lambda s: (len(holders[s]), s))  # rarest first
        for s in lacking:
            hs = [q for q in holders[s] if uploads[q] < cfg.uploads]
            if not hs:
                continue
            cands = hs if len(hs) <= cfg.candidates else rng.sample(hs, cfg.candidates)
            src = min(cands, key=lambda q: (expected_finish(q, p, sizes[s]), q))
            pending[p].add(s)
            uploads[src] += 1
            net.send(src, p, sizes[s], "shard", arrived, (p, s, src), need_conn=False)
            return True
        return False

    def arrived(p: int, s: int, src: int) -> None:
        uploads[src] -= 1
        pending[p].discard(s)
        have[p].add(s)
        holders[s].append(p)
        if len(have[p]) == shards:
            done_at[p] = loop.now
        elif not request(p):
            waiting.append(p)
        retry = waiting[:]
        waiting.clear()
        for q in retry:
            if len(pending[q]) < cfg.downloads and len(have[q]) + len(pending[q]) < shards:
                if not request(q):
                    waiting.append(q)

    order = list(range(1, n))
    rng.shuffle(order)
    for p in order:
        for _ in range(cfg.downloads):
            if not request(p):
                waiting.append(p)
                break
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
        "completion_times_s": [round(t, 3) for t in sorted(times)],
    }
