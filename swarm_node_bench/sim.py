"""`swarm-node bench sim`: the simulator's speed and what it predicts, side by side.

Modes (after `--quick`):

    (none)        default + broadcast, keys of both
    default       1,000 peers, 10 virtual minutes, each publishing one 20 KB rollout per
                  minute, 20% churn per hour, a swarm that has run before (`warm_start`):
                  peers, virtual_s, wall_s, events, events_per_s, delivery_ratio,
                  latency_p50_ms, latency_p99_ms, lower_bound_ratio_p50,
                  lower_bound_ratio_p99 (per delivery: actual / its own bound),
                  latency_p99_bound_ms (the p99 of the bounds, a lower bound of the p99
                  latency), latency_p99_over_bound, duplicates_per_delivery; `cold_start`: the
                  delivery of the quick workload (150 peers, 2 minutes) from nothing, where
                  admission refuses headers of more new signers than it allows
    broadcast     1,000 peers, a 1 GB checkpoint, 64 MB shards, uplinks 10 Mb/s - 1 Gb/s:
                  completion_max_s, lower_bound_s, lower_bound_ratio, star_s, tree_s
    --scale       10,000 peers x 1 virtual hour, 20% churn per hour (the message load
                  is `SCALE_WORKLOAD`'s, see there): wall_s, peak_rss_mb
    --fidelity    the real-peer `bench gossip` setup (read from `--gossip-json FILE`, the
                  JSON line that bench printed; without it bench gossip --quick runs
                  first), simulated with its loopback latency, its generation batches
                  (`burst`), the per-message CPU cost measured here on real signed
                  records (decode + verify) scaled to the real peers' CPU per delivery
                  (`cpu_s_per_record_main`; `cpu_scale_to_real`) and the machine's cores
                  shared by every peer: sim_latency_p50_ms,
                  sim_latency_p99_ms beside latency_p50_ms, latency_p99_ms and the
                  ratios p50_ratio, p99_ratio (sim / real)

`--quick`: default with 150 peers for 2 virtual minutes, broadcast to 150 peers, scale
with 2,000 peers for 5 virtual minutes; under a minute each. `--seed N` (0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time
from pathlib import Path
from typing import Any

from node.console import sayer
from node.errors import CommandError
from protocol.admission import KIND_RULES, Kind
from protocol.codec import decode
from protocol.identity import Identity
from protocol.wire import RolloutRecord
from swarm_sim.broadcast import BroadcastConfig, simulate_broadcast
from swarm_sim.churn import ChurnConfig
from swarm_sim.network import NetConfig
from swarm_sim.runner import progress_printer
from swarm_sim.swarm import Swarm, Workload

# The default measures a swarm that has run before (`warm_start`: peers know each other's
# keys, as after a restart); `cold_start` in its JSON is the quick workload from nothing.
DEFAULT_WORKLOAD = Workload(
    peers=1000,
    duration_s=600,
    publish_interval_s=60,
    header_bytes=600,
    body_bytes=20_000,
    warm_start=True,
)
QUICK_WORKLOAD = Workload(peers=150, duration_s=120, publish_interval_s=60, warm_start=True)
# 10,000 peers for an hour: the mesh, heartbeats, churn and admission state of every peer,
# with 25 workers publishing every 10 minutes (150 rollouts, 1.5 million deliveries):
# what 2 shared cores can carry in 10 minutes (see docs/SIMULATOR.md).
SCALE_WORKLOAD = Workload(
    peers=10_000, duration_s=3600, publish_interval_s=600, publishers=0.0025, pullers=0.002
)
QUICK_SCALE = Workload(
    peers=2000, duration_s=300, publish_interval_s=600, publishers=0.0125, pullers=0.002
)
CHURN = ChurnConfig(churn_per_hour=0.2, offline_mean_s=600)


_say = sayer("bench sim")


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def _gossip(wl: Workload, seed: int, net: NetConfig | None = None) -> tuple[dict, float, int]:
    sw = Swarm(wl, net=net, churn=CHURN, seed=seed)
    t0 = time.monotonic()
    fig = sw.run(
        progress_printer(wl.duration_s + wl.lifetime_s, "bench sim", publish_s=wl.duration_s)
    )
    return fig, time.monotonic() - t0, sw.loop.events


def default(quick: bool, seed: int) -> dict[str, Any]:
    """The default workload (and a cold-start quick run): delivery, latency, wall time."""
    wl = QUICK_WORKLOAD if quick else DEFAULT_WORKLOAD
    _say(f"default: {wl.peers} peers, {wl.duration_s:.0f} virtual s")
    fig, wall, events = _gossip(wl, seed)
    cold_wl = dataclasses.replace(QUICK_WORKLOAD, warm_start=False)
    _say(f"default, cold start: {cold_wl.peers} peers, {cold_wl.duration_s:.0f} virtual s")
    cold, _, _ = _gossip(cold_wl, seed)
    return {
        "peers": wl.peers,
        "virtual_s": wl.duration_s,
        "wall_s": round(wall, 2),
        "events": events,
        "events_per_s": round(events / wall),
        "delivery_ratio": fig["delivery_ratio"],
        "latency_p50_ms": fig["latency_p50_ms"],
        "latency_p99_ms": fig["latency_p99_ms"],
        "lower_bound_ratio_p50": fig["lower_bound_ratio_p50"],
        "lower_bound_ratio_p99": fig["lower_bound_ratio_p99"],
        "latency_p99_bound_ms": fig["latency_p99_bound_ms"],
        "latency_p99_over_bound": fig["latency_p99_over_bound"],
        "duplicates_per_delivery": fig["duplicates_per_delivery"],
        "deliveries": fig["deliveries"],
        "rejects": fig["rejects"],
        "honest_penalized": fig["honest_penalized"],
        "warm_start": wl.warm_start,
        "cold_start": {
            "peers": cold_wl.peers,
            "virtual_s": cold_wl.duration_s,
            "delivery_ratio": cold["delivery_ratio"],
            "rejects": cold["rejects"],
        },
    }


def broadcast(quick: bool, seed: int) -> dict[str, Any]:
    """A weight broadcast through the simulator: how long until the peers hold it."""
    cfg = BroadcastConfig(peers=150 if quick else 1000)
    _say(
        f"broadcast: {cfg.peers} peers, {cfg.size_bytes / 1e9:g} GB in {cfg.shard_bytes / 1e6:g} MB shards"
    )
    t0 = time.monotonic()
    r = simulate_broadcast(cfg, NetConfig(), seed)
    return {
        "broadcast_peers": cfg.peers,
        "completion_max_s": r["completion_max_s"],
        "completion_p50_s": r["completion_p50_s"],
        "lower_bound_s": r["lower_bound_s"],
        "lower_bound_ratio": r["lower_bound_ratio"],
        "star_s": r["star_s"],
        "tree_s": r["tree_s"],
        "chain_s": r["chain_s"],
        "broadcast_bytes_wasted": r["bytes_wasted"],
        "broadcast_wall_s": round(time.monotonic() - t0, 2),
    }


def scale(quick: bool, seed: int) -> dict[str, Any]:
    """The scale workload: the simulator's speed and memory at many peers."""
    wl = QUICK_SCALE if quick else SCALE_WORKLOAD
    _say(f"scale: {wl.peers} peers, {wl.duration_s:.0f} virtual s")
    fig, wall, events = _gossip(wl, seed)
    return {
        "peers": wl.peers,
        "virtual_s": wl.duration_s,
        "wall_s": round(wall, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "events": events,
        "events_per_s": round(events / wall),
        "messages": fig["messages"],
        "deliveries": fig["deliveries"],
        "delivery_ratio": fig["delivery_ratio"],
        "latency_p99_ms": fig["latency_p99_ms"],
    }


def _cpu_costs() -> tuple[float, float]:
    """Seconds to admit one real signed header and one real record (decode + verify)."""
    # The harness loads trio: deferred so that the simulator's peak RSS stays its own.
    from node.testing.records import net_manifest, synthetic_record  # deferred: heavy import

    rec = synthetic_record(Identity.generate(), net_manifest(), 0, n_completion=1024)
    header = decode(RolloutRecord, rec).header
    out = []
    for kind, data in ((Kind.ROLLOUT_HEADER, header), (Kind.ROLLOUT_RECORD, rec)):
        opener = KIND_RULES[kind].opener
        n = 30
        t0 = time.perf_counter()
        for _ in range(n):
            opener(data)
        out.append((time.perf_counter() - t0) / n)
    return out[0], out[1]


def fidelity(quick: bool, seed: int, gossip_json: Path | None) -> dict[str, Any]:
    """The simulator against real `bench gossip` figures (run here, or read from `gossip_json`)."""
    if gossip_json is not None:
        try:
            real = json.loads(gossip_json.read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as exc:
            raise CommandError(f"cannot read bench gossip JSON {gossip_json}: {exc}") from None
    else:
        from swarm_node_bench import gossip  # deferred: heavy import (py-libp2p)

        _say("fidelity: running bench gossip --quick for the real figures")
        real = gossip.run(quick=True, args=[])
    p = real["params"]
    header_s, record_s = _cpu_costs()
    rtt_ms = p.get("loopback_rtt_ms_median") or 0.1
    body = p["record_bytes"] - p["header_bytes"]
    loopback = 200 * 1.048576 * 8  # Mb/s: Noise + Yamux on loopback (docs/DESIGN.md §5)
    per_msg, per_byte = header_s, max(0.0, (record_s - header_s) / max(1, body))
    # A delivery costs a header and a record pull here; the real peers spent
    # `cpu_s_per_record_main` per delivery (every process's CPU / records delivered:
    # gossip, streams, store, proofs, besides decode + verify): scaled to it, in the same
    # proportions. Decode + verify alone is ~1/20 of it, and predicted latencies 1/7.
    sim_delivery_s = 2 * per_msg + (p["header_bytes"] + p["record_bytes"]) * per_byte
    real_delivery_s = real.get("cpu_s_per_record_main") or 0.0
    scale = real_delivery_s / sim_delivery_s if real_delivery_s and sim_delivery_s else 1.0
    net = NetConfig(
        regions=("loopback",),
        latency_ms=((rtt_ms / 2,),),
        jitter=0.1,
        up_mbps=(loopback, loopback),
        down_mbps=(loopback, loopback),
        cpu_per_msg_s=per_msg * scale,
        cpu_per_byte_s=per_byte * scale,
        shared_cpus=int(p.get("cpus") or 0),
    )
    wl = Workload(
        peers=p["peers"],
        duration_s=p["duration_s"],
        publish_interval_s=1.0 / p["rate_per_producer_per_s"],
        burst=int(p.get("records_per_generation_batch") or 1),
        publishers=p["producers"] / max(1, p["peers"] - 1),
        header_bytes=p["header_bytes"],
        body_bytes=body,
        pullers=1.0,
        connect_to=p["peers"] - 1,
    )
    sw = Swarm(wl, net=net, seed=seed)
    fig = sw.run()
    sim50, sim99 = fig["body_latency_p50_ms"], fig["body_latency_p99_ms"]
    r50, r99 = real.get("latency_p50_ms"), real.get("latency_p99_ms")
    return {
        "sim_latency_p50_ms": sim50,
        "sim_latency_p99_ms": sim99,
        "latency_p50_ms": r50,
        "latency_p99_ms": r99,
        "p50_ratio": round(sim50 / r50, 3) if sim50 and r50 else None,
        "p99_ratio": round(sim99 / r99, 3) if sim99 and r99 else None,
        "cpu_per_header_ms": round(header_s * 1000, 3),
        "cpu_per_record_ms": round(record_s * 1000, 3),
        "cpu_scale_to_real": round(scale, 2),
        "sim_delivery_ratio": fig["delivery_ratio"],
        "real_delivery_ratio": real.get("delivery_ratio"),
    }


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the chosen modes (arguments as in the module docstring); returns their figures."""
    parser = argparse.ArgumentParser(prog="swarm-node bench sim")
    parser.add_argument("mode", nargs="?", choices=("default", "broadcast"))
    parser.add_argument("--scale", action="store_true")
    parser.add_argument("--fidelity", action="store_true")
    parser.add_argument("--gossip-json", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(args)
    if opts.scale:
        return scale(quick, opts.seed)
    if opts.fidelity:
        return fidelity(quick, opts.seed, opts.gossip_json)
    out: dict[str, Any] = {}
    if opts.mode in (None, "default"):
        out.update(default(quick, opts.seed))
    if opts.mode in (None, "broadcast"):
        out.update(broadcast(quick, opts.seed))
    return out
