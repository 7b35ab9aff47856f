"""`swarm-node bench gossip`: rollout gossip among 8 real peer processes on loopback.

Each peer is a full node (`node.testing.net_peer`: host, admission, SQLite store, body
pulls). Producers publish signed ~20 KB records (header gossiped, body pulled; token ids,
log-probs and real TOPLOC proofs built from random activations) at a fixed rate for a
fixed time; every peer pulls every body. Midway one non-producing peer is frozen with
SIGSTOP and later another is killed with SIGKILL; we measure how long until every other
peer has dropped each. Figures:

    delivery_ratio        bodies stored at live receivers / (records x live receivers)
    latency_p50_ms/p99    record signed -> body admitted and stored, at receivers, in the
                          main phase (at the offered rate, through the freeze and the kill)
    header_latency_p50_ms record signed -> header admitted, main phase
    latency_all_phases_*  the same over every phase, saturation steps included
    records_per_s         records delivered per second, measured at the receivers (bodies
                          stored per receiver, from the first publish until delivery ended)
    offered_records_per_s what the producers were asked to publish per second
    header_batch_mean     signed headers per gossip message the producers sent
    cpu_s_per_record      all processes' CPU seconds / records delivered to all receivers,
                          over short phases of the same load run side by side with the
                          unbatched ones (batched, unbatched, in turn; 3 pairs, quick 1):
                          `cpu_phases`, their ratio `cpu_batched_over_unbatched`; the main
                          phase's own figure (it also pays for the frozen and killed peers)
                          is `cpu_s_per_record_main`
    *_unbatched           the same load with batching off (one header per message)
    max_full_delivery_records_per_s[_unbatched]
                          saturation: the offered rate is raised step by step until some
                          receiver misses records by the step's deadline; the highest rate
                          delivered in full, with batching on (and off)
    store_writes_per_record  store transactions at the receivers (headers and bodies share
                          batches) / records delivered to all receivers, main phase
    validator_wait_ms_p99 time a gossip message spends in the GossipSub topic validator
                          (admission; a message still being written is accepted `Later`),
                          the largest of the receivers' p99s, main phase
    forward_after_store_ms_p99  from that answer to the message being durable and handed
                          to the mesh (the store write it waited for), largest p99
    rss_mb_max            largest resident set of any peer process
    frozen_peer_detect_s  SIGSTOP -> dropped by every live peer
    killed_peer_detect_s  SIGKILL -> dropped by every live peer

The run's parameters (peers, producers, rate, sizes, duration, loopback RTT) are in the
result too, so the simulator can be asked to predict these figures. `--quick`: 10 s of
publishing, then short unbatched and saturation phases.

Producers publish like inference workers: a generation batch of `--burst` records
(`inference.batch_size`, 8) at once, at the offered mean rate.

Options (after `--quick`): `--peers N` (8), `--producers N` (4), `--rate R` per producer
per second (2), `--duration S` (45; quick 10), `--size TOKENS` completion tokens (1024),
`--burst B` records per generation batch (8).
`--quick` also runs the unbatched phase and saturation with shorter windows.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import psutil
import trio

from node.config import NODE_KEYS
from node.console import sayer
from node.errors import CommandError
from node.peer.peer import PeerConfig
from node.testing.peer_process import PeerProcess
from node.testing.records import make_proof_pool, net_manifest, synthetic_record
from protocol.codec import decode
from protocol.identity import Identity
from protocol.wire import RolloutRecord

DEAD_AFTER_S = 4.0  # the peers' heartbeat timeout (passed to each as --dead-after)
# A worker publishes each generation batch at once (`inference.batch_size`), not one
# record at a time: producers here do the same, at the same mean rate.
WORKER_BATCH = next(k.default for k in NODE_KEYS if k.name == "inference.batch_size")
CPU_PAIRS, CPU_PAIRS_QUICK = 3, 1  # batched/unbatched phase pairs for the CPU figures
SATURATION_RATES = (4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)  # per producer per second


_say = sayer("bench gossip")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


class Swarm:
    """The peer processes of one run: started, watched for memory, frozen or killed, stopped."""

    def __init__(self, opts: argparse.Namespace, tmp: Path, pool_path: Path) -> None:
        self.opts, self.tmp, self.pool_path = opts, tmp, pool_path
        self.procs: list[PeerProcess] = []
        self.rss_max = 0.0  # MiB, largest resident set seen
        self.excluded: set[str] = set()  # peer ids frozen or killed

    def sample_rss(self) -> None:
        """Update the largest resident set size seen among the peer processes."""

        for p in self.procs:
            try:
                self.rss_max = max(
                    self.rss_max, psutil.Process(p.proc.pid).memory_info().rss / 2**20
                )
            except psutil.Error:
                pass

    async def spawn(self, i: int, boot: str | None) -> PeerProcess:
        """Start peer `i`, bootstrapping from `boot` when given."""
        args = [
            "--data-dir",
            str(self.tmp / f"p{i}"),
            "--proof-pool",
            str(self.pool_path),
            "--dead-after",
            str(DEAD_AFTER_S),
            "--max-life",
            str(self.opts.duration + 900),
        ]
        if boot:
            args += ["--bootstrap", boot]
        return await PeerProcess.start(
            *args,
            module="node.testing.net_peer",
            stderr_path=str(self.tmp / f"p{i}.log"),
            timeout=120,
        )

    async def start(self) -> None:
        """The bootstrap peer, then the others at once, in index order in `procs`."""
        t0 = time.monotonic()
        boot = await self.spawn(0, None)
        self.procs.append(boot)
        rest: dict[int, PeerProcess] = {}

        async def one(i: int) -> None:
            rest[i] = await self.spawn(i, boot.addrs[0])

        async with trio.open_nursery() as nursery:
            for i in range(1, self.opts.peers):
                nursery.start_soon(one, i)
        self.procs += [rest[i] for i in sorted(rest)]
        _say(f"{self.opts.peers} peers started in {time.monotonic() - t0:.1f} s")

    async def wait_connected(self) -> None:
        """Until every peer has min(peers - 1, 5) connections (at most 45 s)."""
        want = min(self.opts.peers - 1, 5)
        with trio.move_on_after(45):
            while True:
                counts = [len((await _stats(p))["connected"]) for p in self.procs]
                if min(counts) >= want:
                    break
                await trio.sleep(0.5)
        _say(f"connected: {counts}")

    async def detect(self, victim: PeerProcess, sig: int) -> float | None:
        """Sends `sig` to the victim; seconds until no other live peer lists it as
        connected (None: not within 30 s)."""
        os.kill(victim.proc.pid, sig)
        at = time.monotonic()
        self.excluded.add(victim.peer_id)
        observers = self.live()
        with trio.move_on_after(30):
            while True:
                seen = [victim.peer_id in (await _stats(p))["connected"] for p in observers]
                if not any(seen):
                    return round(time.monotonic() - at, 2)
                await trio.sleep(0.25)
        return None

    def live(self) -> list[PeerProcess]:
        """The peers not excluded from the figures."""
        return [p for p in self.procs if p.peer_id not in self.excluded]

    async def stop(self) -> None:
        """Frozen peers continued, then every peer stopped."""
        for p in self.procs:
            if p.proc.poll() is None:
                try:
                    os.kill(p.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        async with trio.open_nursery() as nursery:
            for p in self.procs:
                nursery.start_soon(p.stop, 5.0)


async def _stats(p: PeerProcess) -> dict[str, Any]:
    return await p.ask({"cmd": "stats"}, timeout=60)


@dataclass
class MainPhase:
    """The main phase: publishing at the offered rate through a freeze and a kill."""

    start: float  # monotonic time of the first publish
    frozen_s: float | None = None  # SIGSTOP -> dropped by every live peer
    killed_s: float | None = None  # SIGKILL -> dropped by every live peer
    produced_ids: set[str] = field(default_factory=set)
    delivered: int = 0  # bodies stored at the receivers
    delivered_at: float = 0.0  # monotonic time delivery ended


async def _publish_with_faults(swarm: Swarm, producers: list[PeerProcess]) -> MainPhase:
    """Producers publish for `duration`; a quarter in, the last peer is frozen, half-way
    the one before it killed (with at least 3 non-producing peers)."""
    opts = swarm.opts
    frozen = swarm.procs[-1] if opts.peers - opts.producers >= 3 else None
    killed = swarm.procs[-2] if frozen is not None else None
    n_each = int(opts.rate * opts.duration)
    main = MainPhase(start=time.monotonic())
    for p in producers:
        await p.ask(
            {
                "cmd": "produce",
                "n": n_each,
                "rate": opts.rate,
                "size": opts.size,
                "burst": opts.burst,
            }
        )
    _say(f"{len(producers)} producers x {n_each} records at {opts.rate}/s")
    while time.monotonic() - main.start < opts.duration:
        swarm.sample_rss()
        elapsed = time.monotonic() - main.start
        if frozen is not None and main.frozen_s is None and elapsed > opts.duration / 4:
            main.frozen_s = await swarm.detect(frozen, signal.SIGSTOP)
            _say(f"frozen peer dropped by all after {main.frozen_s} s")
        elif killed is not None and main.killed_s is None and elapsed > opts.duration / 2:
            main.killed_s = await swarm.detect(killed, signal.SIGKILL)
            _say(f"killed peer dropped by all after {main.killed_s} s")
        await trio.sleep(0.5)
    return main


async def _await_delivery(
    swarm: Swarm, main: MainPhase, producers: list[PeerProcess], receivers: list[PeerProcess]
) -> None:
    """Until every receiver holds every produced record (at most 30 s)."""
    for p in producers:
        main.produced_ids |= await _ids(p)
    _say(f"publishing done: {len(main.produced_ids)} records; waiting for delivery")
    settle_until = time.monotonic() + 30
    have: dict[str, set[str]] = {}
    while time.monotonic() < settle_until:
        swarm.sample_rss()
        for p in receivers:
            have[p.peer_id] = await _ids(p) & main.produced_ids
        if all(len(v) == len(main.produced_ids) for v in have.values()):
            break
        await trio.sleep(1.0)
    main.delivered_at = time.monotonic()
    main.delivered = sum(len(v) for v in have.values())


async def _main_figures(receivers: list[PeerProcess]) -> dict[str, Any]:
    """Latencies, store writes and validator waits of the main phase alone: the saturation
    steps push the rate past what the peers can carry and would fill the tail with
    queueing delay."""
    out: dict[str, Any] = {
        "body_lat": [],
        "header_lat": [],
        "store_writes": 0,
        "validator_waits": [],
        "forward_waits": [],
    }
    for p in receivers:
        s = await _stats(p)
        out["body_lat"] += s["body_latency_ms"]
        out["header_lat"] += s["header_latency_ms"]
        out["store_writes"] += s["counters"].get("store_batches", 0)
        if s.get("validator_wait_ms_p99") is not None:
            out["validator_waits"].append(s["validator_wait_ms_p99"])
        if s.get("forward_after_store_ms_p99") is not None:
            out["forward_waits"].append(s["forward_after_store_ms_p99"])
    return out


async def _cpu_pairs(
    producers: list[PeerProcess], receivers: list[PeerProcess], opts: argparse.Namespace
) -> dict[int, list[dict[str, Any]]]:
    """CPU per record side by side: the same load in short phases, batching on and off in
    turn (the main phase also pays for the frozen and killed peers); header batch -> phases."""
    pairs: dict[int, list[dict[str, Any]]] = {PeerConfig.header_batch: [], 1: []}
    for _ in range(CPU_PAIRS_QUICK if opts.quick else CPU_PAIRS):
        for batch in pairs:
            step = await _phase(
                producers,
                receivers,
                opts.rate,
                opts.window,
                opts.size,
                batch=batch,
                burst=opts.burst,
            )
            pairs[batch].append(step)
            _say(f"header batch {batch}: {step}")
    return pairs


async def _final_figures(receivers: list[PeerProcess]) -> dict[str, Any]:
    """Over every phase: failure counters and rejections summed, body latencies, loopback RTTs."""
    diag: dict[str, int] = {}
    body_lat: list[float] = []
    rtts: list[float] = []
    for p in receivers:
        s = await _stats(p)
        for k in ("pull_errors", "pull_gave_up", "overloaded_drops", "store_failed"):
            diag[k] = diag.get(k, 0) + s["counters"].get(k, 0)
        for k, v in s["rejected"].items():
            diag[f"rejected_{k}"] = diag.get(f"rejected_{k}", 0) + v
        body_lat += s["body_latency_ms"]
        if s.get("rtt_ms_median") is not None:
            rtts.append(s["rtt_ms_median"])
    return {"diag": diag, "body_lat": body_lat, "rtts": rtts}


async def _bench(opts: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    pool_path = tmp / "proofs.msgpack"
    packed = msgpack.packb([list(p) for p in make_proof_pool(8, opts.size)])
    assert packed is not None
    pool_path.write_bytes(packed)
    swarm = Swarm(opts, tmp, pool_path)
    try:
        await swarm.start()
        await swarm.wait_connected()
        producers = swarm.procs[: opts.producers]
        cpu0 = _cpu_s(swarm.procs)
        main = await _publish_with_faults(swarm, producers)
        receivers = swarm.live()  # producers also receive each other's records
        await _await_delivery(swarm, main, producers, receivers)
        figures = await _main_figures(receivers)
        cpu_main = _cpu_s(swarm.procs) - cpu0
        batch_means = [m for p in producers if (m := (await _stats(p)).get("header_batch_mean"))]
        pairs = await _cpu_pairs(producers, receivers, opts)
        saturation = {}
        for batch in (PeerConfig.header_batch, 1):
            saturation[batch] = await _saturate(producers, receivers, opts, batch)
            _say(f"saturation with header batch {batch}: {saturation[batch]}")
        final = await _final_figures(receivers)
        return _report(
            opts,
            swarm,
            main,
            producers,
            receivers,
            figures,
            cpu_main,
            batch_means,
            pairs,
            saturation,
            final,
        )
    finally:
        await swarm.stop()


def _report(
    opts: argparse.Namespace,
    swarm: Swarm,
    main: MainPhase,
    producers: list[PeerProcess],
    receivers: list[PeerProcess],
    figures: dict[str, Any],
    cpu_main: float,
    batch_means: list[float],
    pairs: dict[int, list[dict[str, Any]]],
    saturation: dict[int, dict[str, Any]],
    final: dict[str, Any],
) -> dict[str, Any]:
    """The result: the figures listed in the module docstring, then the run's parameters."""
    delivered, produced = main.delivered, main.produced_ids
    batched, unbatched = (_mean_phase(pairs[b]) for b in pairs)
    b_cpu, u_cpu = batched["cpu_s_per_record"], unbatched["cpu_s_per_record"]
    return {
        "delivery_ratio": round(delivered / (len(produced) * len(receivers)), 4)
        if produced
        else None,
        "latency_p50_ms": _pct(figures["body_lat"], 0.50),
        "latency_p99_ms": _pct(figures["body_lat"], 0.99),
        "header_latency_p50_ms": _pct(figures["header_lat"], 0.50),
        "latency_all_phases_p50_ms": _pct(final["body_lat"], 0.50),
        "latency_all_phases_p99_ms": _pct(final["body_lat"], 0.99),
        "records_per_s": round(delivered / len(receivers) / (main.delivered_at - main.start), 2),
        "offered_records_per_s": round(opts.rate * len(producers), 2),
        "header_batch_mean": round(statistics.mean(batch_means), 2) if batch_means else None,
        "cpu_s_per_record": b_cpu,
        "records_per_s_unbatched": unbatched["records_per_s"],
        "cpu_s_per_record_unbatched": u_cpu,
        "cpu_batched_over_unbatched": round(b_cpu / u_cpu, 3) if b_cpu and u_cpu else None,
        "cpu_s_per_record_main": round(cpu_main / delivered, 5) if delivered else None,
        "store_writes_per_record": round(figures["store_writes"] / delivered, 4)
        if delivered
        else None,
        "validator_wait_ms_p99": max(figures["validator_waits"])
        if figures["validator_waits"]
        else None,
        "forward_after_store_ms_p99": max(figures["forward_waits"])
        if figures["forward_waits"]
        else None,
        "cpu_phases": {"batched": pairs[PeerConfig.header_batch], "unbatched": pairs[1]},
        "max_full_delivery_records_per_s": saturation[PeerConfig.header_batch]["max_full"],
        "max_full_delivery_records_per_s_unbatched": saturation[1]["max_full"],
        "saturation": {
            "batched": saturation[PeerConfig.header_batch]["steps"],
            "unbatched": saturation[1]["steps"],
        },
        "rss_mb_max": round(swarm.rss_max, 1),
        "frozen_peer_detect_s": main.frozen_s,
        "killed_peer_detect_s": main.killed_s,
        "diagnostics": final["diag"],
        "params": _params(opts, len(produced), len(receivers), final["rtts"]),
    }


def _params(
    opts: argparse.Namespace, records: int, live_receivers: int, rtts: list[float]
) -> dict[str, Any]:
    """The run's parameters, so the simulator can be asked to predict the figures."""
    record_bytes = _record_size(opts.size)
    return {
        "peers": opts.peers,
        "producers": opts.producers,
        "rate_per_producer_per_s": opts.rate,
        "records_per_generation_batch": opts.burst,
        "duration_s": opts.duration,
        "completion_tokens": opts.size,
        "record_bytes": record_bytes[0],
        "header_bytes": record_bytes[1],
        "records": records,
        "live_receivers": live_receivers,
        "heartbeat_dead_after_s": DEAD_AFTER_S,
        "loopback_rtt_ms_median": round(statistics.median(rtts), 3) if rtts else None,
        "transport": "tcp+noise+yamux, gossipsub headers, stream body pull",
        "cpus": os.cpu_count(),
    }


def _cpu_s(procs: list[PeerProcess]) -> float:
    """User + system CPU seconds of every peer process so far (gone ones count 0)."""

    total = 0.0
    for p in procs:
        try:
            t = psutil.Process(p.proc.pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def _ids(p: PeerProcess, own: bool = False) -> set[str]:
    answer = await p.ask({"cmd": "ids", "own": own}, timeout=60)
    if "ids" not in answer:
        raise RuntimeError(f"peer {p.peer_id[-6:]} answered {answer!r} to 'ids'")
    return set(answer["ids"])


async def _phase(
    producers: list[PeerProcess],
    receivers: list[PeerProcess],
    rate: float,
    window: float,
    size: int,
    batch: int,
    deadline_s: float | None = None,
    burst: int = 1,
) -> dict[str, Any]:
    """Every producer publishes `rate * window` new records at `rate`/s with header batch
    `batch`; wait until every receiver holds them all, or `deadline_s` after the start
    (default: window + 30 s). Returns delivery ratio, records/s at the receivers, CPU s per
    delivered record."""
    await _settle(list({p.peer_id: p for p in producers + receivers}.values()))
    before = {p.peer_id: await _ids(p) for p in receivers}
    mine = {p.peer_id: await _ids(p, own=True) for p in producers}
    for p in producers:
        await p.ask({"cmd": "batch", "n": batch})
    n_each = max(1, int(rate * window))
    procs = list({p.peer_id: p for p in producers + receivers}.values())
    cpu0 = _cpu_s(procs)
    start = time.monotonic()
    for p in producers:
        await p.ask({"cmd": "produce", "n": n_each, "rate": rate, "size": size, "burst": burst})
    deadline = start + (window + 30.0 if deadline_s is None else deadline_s)
    want = n_each * len(producers)
    got: dict[str, int] = {}
    new_ids: set[str] = set()
    while True:
        for p in producers:
            new_ids |= await _ids(p, own=True) - mine[p.peer_id]
        for p in receivers:
            got[p.peer_id] = len((await _ids(p) - before[p.peer_id]) & new_ids)
        # Done once everything arrived and the offered schedule is over: both modes then
        # pay the same seconds of idle cost (heartbeats) on the same records.
        done = (
            len(new_ids) >= want
            and all(v >= want for v in got.values())
            and time.monotonic() >= start + n_each / rate
        )
        if done or time.monotonic() >= deadline:
            break
        await trio.sleep(0.5)
    elapsed = time.monotonic() - start
    delivered = sum(got.values())
    cpu = _cpu_s(procs) - cpu0
    for p in producers:  # a step past its deadline must not spill into the next one
        await p.ask({"cmd": "stop"})
    return {
        "offered_records_per_s": rate * len(producers),
        "delivery_ratio": round(delivered / (want * len(receivers)), 4),
        "records_per_s": round(delivered / len(receivers) / elapsed, 2),
        "cpu_s_per_record": round(cpu / delivered, 5) if delivered else None,
        "seconds": round(elapsed, 1),
    }


async def _settle(procs: list[PeerProcess], limit_s: float = 30.0) -> None:
    """Wait (at most `limit_s`) until no peer has headers queued or bodies to pull: the
    backlog of a step past its deadline must not run into the next step's figures."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        busy = 0
        for p in procs:
            s = await p.ask({"cmd": "stats"})
            busy += int(s.get("outbox_pending", 0)) + int(s.get("pull_pending", 0))
        if not busy:
            return
        await trio.sleep(0.5)
    _say(f"still busy after {limit_s:.0f} s; measuring anyway")


def _mean_phase(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Records/s and CPU s per record over several phases of one load (None-safe)."""
    out: dict[str, Any] = {}
    for key in ("records_per_s", "cpu_s_per_record", "delivery_ratio"):
        vals = [s[key] for s in steps if s.get(key) is not None]
        out[key] = round(statistics.mean(vals), 5) if vals else None
    return out


async def _saturate(
    producers: list[PeerProcess], receivers: list[PeerProcess], opts: argparse.Namespace, batch: int
) -> dict[str, Any]:
    """Raise the offered rate until some receiver misses records by the step's deadline
    (window + 3 s); the highest offered rate delivered in full."""
    steps = []
    best = None
    for rate in SATURATION_RATES[1::2] if opts.quick else SATURATION_RATES:
        step = await _phase(
            producers,
            receivers,
            rate,
            opts.window,
            opts.size,
            batch,
            deadline_s=opts.window + 3.0,
            burst=opts.burst,
        )
        steps.append(step)
        if step["delivery_ratio"] < 1.0:
            break
        best = step["offered_records_per_s"]
        await trio.sleep(1.0)  # let queues empty before the next step
    return {"max_full": best, "steps": steps}


def _record_size(n_completion: int) -> tuple[int, int]:
    rec = synthetic_record(Identity.generate(), net_manifest(), 0, n_completion=n_completion)
    return len(rec), len(decode(RolloutRecord, rec).header)


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments as in the module docstring); returns its figures."""
    parser = argparse.ArgumentParser(prog="swarm-node bench gossip")
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--burst",
        type=int,
        default=WORKER_BATCH,
        help="records a producer publishes at once (a worker's generation batch)",
    )
    parser.add_argument("--window", type=float, default=None, help="seconds per later phase step")
    opts = parser.parse_args(args)
    opts.quick = quick
    if opts.duration is None:
        opts.duration = 10.0 if quick else 45.0
    if opts.window is None:
        opts.window = 3.0 if quick else 8.0
    if not 2 <= opts.peers <= 32 or not 1 <= opts.producers <= opts.peers or opts.burst < 1:
        raise CommandError("--peers must be 2..32, --producers 1..peers, --burst >= 1")
    with tempfile.TemporaryDirectory(prefix="bench-gossip-") as tmp:
        return trio.run(_bench, opts, Path(tmp))
