"""`bench broadcast` real part: 1 origin + N receivers as processes on loopback.

Every peer's uploads are capped by the node's own limiter (`network.upload_limit_mib_s`,
10 MiB/s here), so the figures measure the schedule, not 2 shared cores. The origin holds a
trainer key and publishes a random (incompressible) checkpoint, 256 MiB (64 MiB with
`--quick`), in shards of 4 MiB (2 MiB quick). Phases, one run:

1. capped, 4 receivers: `lower_bound_ratio_4`; then, with the origin's cap lifted and
   the other receivers stopped (and their leaving settled: `_settle`), one receiver fetches every shard again straight from the
   origin over their one connection, one shard request after the other:
   `stream_mib_per_s` (one transfer between two peers); and with as many requests in
   flight as the node's scheduler keeps to one peer (`ScheduleConfig.per_peer`, 2):
   `stream_mib_per_s_2_in_flight` (no faster here: both ends are CPU-bound, and two
   interleaved streams cost the receiver more per byte). Two runs of each (one with
   `--quick`), alternated; the means.
2. capped, 8 receivers and one liar (it holds the checkpoint and serves every shard with
   one byte flipped): `completion_max_s`, `completion_p50_s` (from the publish to each
   receiver's install), `lower_bound_s` (size / cap), `lower_bound_ratio`,
   `origin_upload_ratio` (shard bytes the origin uploaded / size), `bad_shards_injected`
   (bad shards the liar served), `bad_shards_installed` (receivers whose installed bytes do
   not hash to the signed digest: verify-before-store makes this 0).

Each phase publishes only once the swarm has formed (`_settle`: every peer connected to
and watched by every other, then 1 s): joining is not part of a broadcast.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from node.console import say as _say
from protocol.identity import Identity
from protocol.shard_schedule import ScheduleConfig
from trainer.checkpoint import canonical_bytes

CAP_MIB_S = 10.0
MiB = 2**20


def make_checkpoint(total: int, seed: int = 0) -> bytes:
    """Random float32 tensors of 8 MiB each (rows of 4 KiB), `total` bytes of data."""
    rng = np.random.default_rng(seed)
    tensors = {}
    left, i = total, 0
    while left > 0:
        n = min(8 * MiB, left)
        rows = max(1, n // 4096)
        data = rng.integers(0, 2**32, size=rows * 1024, dtype=np.uint32).tobytes()
        tensors[f"layer{i:03d}.weight"] = ("F32", (rows, 1024), data)
        left -= len(data)
        i += 1
    return canonical_bytes(tensors)


class Proc:
    """One `weights_peer` process, driven over its stdin and stdout."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "swarm_node_bench.parts.weights_peer", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.info: dict[str, Any] = {}

    def started(self) -> Proc:
        """Wait for the process's start-up line (its peer id and address)."""
        self.info = self.read(180)  # its banner: peer id and address
        return self

    def read(self, timeout: float) -> dict[str, Any]:
        """The next JSON line from the process (fails after `timeout` seconds)."""

        assert self.p.stdout is not None
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            raise RuntimeError("bench peer did not answer in time")
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"bench peer exited ({self.p.poll()})")
        return json.loads(line)

    def send(self, cmd: dict[str, Any]) -> None:
        """Send one JSON command."""
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(cmd) + "\n").encode())
        self.p.stdin.flush()

    def ask(self, cmd: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        """Send one JSON command and read its answer."""
        self.send(cmd)
        return self.read(timeout)


def _stop_all(procs: list[Proc], timeout_s: float = 15.0) -> None:
    """Ask every peer to quit at once, then wait for each (killed past `timeout_s`)."""
    for p in procs:
        if p.p.poll() is None:
            try:
                p.send({"cmd": "quit"})
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.p.kill()
            p.p.wait()


def _settle(procs: list[Proc], timeout_s: float = 30.0, quiet_s: float = 1.0) -> float:
    """Wait until the swarm has formed: every peer connected to every other and watched
    by all of them (have-map watches), and to no one else (peers that left are gone),
    then `quiet_s` more for the joining work (peer exchange, catch-up, subscriptions) to
    die down, so the publish measures the broadcast, not the join (10 processes joining
    keep 2 cores busy for ~5 s). Returns the seconds it took; after `timeout_s` it goes
    on regardless."""
    t0 = time.monotonic()
    n = len(procs) - 1
    while time.monotonic() - t0 < timeout_s:
        stats = [p.ask({"cmd": "stats"}, timeout=30) for p in procs]
        if all(s["peers"] == n and s["watched_by"] >= n for s in stats):
            break
        time.sleep(0.25)
    time.sleep(quiet_s)
    return round(time.monotonic() - t0, 2)


def _phase(
    root: Path,
    name: str,
    ckpt_path: Path,
    size: int,
    receivers: int,
    cap: float,
    shard: int,
    liar: bool,
    stream: int,
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    trainer = Identity.generate()
    run_id = f"bench-{name}"
    common = [
        "--run-id",
        run_id,
        "--trainer-key",
        trainer.peer_id_b58,
        "--shard-bytes",
        str(shard),
        "--upload-limit",
        str(cap),
    ]
    procs: list[Proc] = []
    try:
        origin = Proc(
            [
                *common,
                "--key",
                trainer.private_bytes().hex(),
                "--data-dir",
                str(root / name / "origin"),
                "--checkpoint",
                str(ckpt_path),
            ],
            env,
        ).started()
        procs.append(origin)
        boot = ["--bootstrap", origin.info["addr"]]
        recv = []
        for i in range(receivers):  # start them together, then wait for each banner
            recv.append(Proc([*common, *boot, "--data-dir", str(root / name / f"r{i}")], env))
        procs += recv
        bad = None
        if liar:
            bad = Proc(
                [
                    *common,
                    *boot,
                    "--data-dir",
                    str(root / name / "liar"),
                    "--liar",
                    "--checkpoint",
                    str(ckpt_path),
                ],
                env,
            )
            procs.append(bad)
        for p in procs[1:]:
            p.started()
        out: dict[str, Any] = {"settle_s": _settle(procs)}
        pub = origin.ask({"cmd": "publish"})
        for r in recv:
            r.send({"cmd": "wait", "version": pub["version"], "timeout": 300})
        done = [r.read(330) for r in recv]
        times = [d["done_at"] - pub["published_at"] for d in done if d["done_at"]]
        out.update(
            {
                "receivers": receivers,
                "completed": len(times),
                "completion_max_s": round(max(times), 2) if len(times) == receivers else None,
                "completion_p50_s": round(statistics.median(times), 2) if times else None,
                "installed_bad": sum(1 for d in done if d["done_at"] and not d["ok"]),
            }
        )
        stats = origin.ask({"cmd": "stats"})
        out["origin_upload_ratio"] = round(stats["uploaded"] / size, 3)
        if bad is not None:
            out["bad_shards_injected"] = bad.ask({"cmd": "stats"})["served_bad"]
        if stream:  # the cap off, the other receivers gone: one transfer between two peers
            _stop_all(recv[1:])
            origin.ask({"cmd": "cap", "mib_s": 0})
            out["stream_settle_s"] = _settle([origin, recv[0]], timeout_s=10.0)
            out["stream"] = {}
            for k in (1, ScheduleConfig().per_peer) * stream:  # alternated, `stream` runs each
                r = recv[0].ask(
                    {
                        "cmd": "stream",
                        "peer": origin.info["peer_id"],
                        "version": pub["version"],
                        "in_flight": k,
                    }
                )
                out["stream"].setdefault(k, []).append(r["mib_per_s"])
        return out
    finally:
        _stop_all(procs)


def _mean(xs: list[float]) -> float:
    return round(statistics.mean(xs), 1)


def real_part(quick: bool) -> dict[str, Any]:
    """The real part: a checkpoint from 1 origin to N receivers as processes on loopback."""
    size = (64 if quick else 256) * MiB
    shard = (2 if quick else 4) * MiB
    lower = size / (CAP_MIB_S * MiB)
    with tempfile.TemporaryDirectory(prefix="bench-broadcast-") as tmp:
        root = Path(tmp)
        ckpt = make_checkpoint(size)
        path = root / "ckpt.safetensors"
        path.write_bytes(ckpt)
        size = len(ckpt)
        lower = size / (CAP_MIB_S * MiB)
        _say(
            f"real: checkpoint {size / MiB:.0f} MiB, shards {shard / MiB:.0f} MiB, "
            f"cap {CAP_MIB_S} MiB/s, lower bound {lower:.1f} s"
        )
        four = _phase(
            root, "four", path, size, 4, CAP_MIB_S, shard, liar=False, stream=1 if quick else 2
        )
        _say(f"real: 4 receivers, then an uncapped stream {four}")
        eight = _phase(root, "eight", path, size, 8, CAP_MIB_S, shard, liar=True, stream=0)
        _say(f"real: 8 receivers + liar {eight}")

    def ratio(x: float | None) -> float | None:
        return None if x is None else round(x / lower, 3)

    return {
        "checkpoint_bytes": size,
        "upload_cap_mib_s": CAP_MIB_S,
        "completion_max_s": eight["completion_max_s"],
        "completion_p50_s": eight["completion_p50_s"],
        "lower_bound_s": round(lower, 2),
        "lower_bound_ratio": ratio(eight["completion_max_s"]),
        "origin_upload_ratio": eight["origin_upload_ratio"],
        "lower_bound_ratio_4": ratio(four["completion_max_s"]),
        "bad_shards_injected": eight.get("bad_shards_injected", 0),
        "bad_shards_installed": eight["installed_bad"] + four["installed_bad"],
        "stream_mib_per_s": _mean(four["stream"][1]),
        "stream_mib_per_s_2_in_flight": _mean(four["stream"][ScheduleConfig().per_peer]),
        "receivers_completed": eight["completed"],
    }
