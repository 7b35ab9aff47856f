"""Two real peer processes on loopback, with admission's signer rate lowered by their
configuration so the run is cheap: a worker asked to produce at 4x that rate for 30 s is
paced by its outbox, never banned nor charged, stays connected, and delivers what its peer
admits (a margin below the rate; the peer pulls the bodies, some through catch-up before
their paced headers arrive: those headers are copies, free)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node.peer.peer import PACE_MARGIN
from node.testing.peer_process import PeerProcess

pytestmark = [pytest.mark.network, pytest.mark.slow]

RATE, BURST, RUN_S = 4.0, 20.0, 30.0  # the burst holds a header batch (16)


async def _spawn(tmp: Path, name: str, *extra: str) -> PeerProcess:
    args = [
        "--data-dir",
        str(tmp / name),
        "--max-life",
        "120",
        "--signer-rate",
        str(RATE),
        "--signer-burst",
        str(BURST),
    ]
    return await PeerProcess.start(
        *args,
        *extra,
        module="node.testing.net_peer",
        stderr_path=str(tmp / f"{name}.log"),
        timeout=90,
    )


async def test_a_worker_at_four_times_the_signer_rate_is_paced_and_never_banned(
    tmp_path: Path,
) -> None:
    procs: list[PeerProcess] = []
    try:
        peer = await _spawn(tmp_path, "peer", "--role", "trainer")
        procs.append(peer)
        worker = await _spawn(tmp_path, "worker", "--bootstrap", peer.addrs[0])
        procs.append(worker)
        with trio.fail_after(30):
            while not (await worker.ask({"cmd": "stats"}))["connected"]:
                await trio.sleep(0.2)
        started = time.monotonic()
        await worker.ask(
            {"cmd": "produce", "n": int(4 * RATE * RUN_S), "rate": 4 * RATE, "burst": 4, "size": 16}
        )
        await trio.sleep(RUN_S)
        await worker.ask({"cmd": "stop"})
        elapsed = time.monotonic() - started
        await trio.sleep(3)  # what is in flight lands
        got_stats = await peer.ask({"cmd": "stats"}, timeout=60)
        w = await worker.ask({"cmd": "stats"}, timeout=60)
        counters = got_stats["counters"]
        assert got_stats["banned"] == 0, got_stats["rejected"]
        assert w["peer_id"] in got_stats["connected"] and not w["dropped_by"], w["dropped_by"]
        # Paced a margin below the rate; a receiver that falls behind (2 shared cores) may
        # validate two batches at one instant and drop a few over the signer's burst: free.
        assert (
            got_stats["rejected"].get("rate_limited", 0) <= 0.1 * counters["in_rollout_header"]
        ), counters
        # it delivers what its peer admits: at least the paced rate, at most the peer's rate
        headers = counters["stored_rollout_header"] + got_stats["rejected"].get("duplicate", 0)
        assert headers >= 0.85 * PACE_MARGIN * RATE * RUN_S, (counters, elapsed)
        assert counters["in_rollout_header"] <= RATE * (elapsed + 5) + BURST, (counters, elapsed)
        assert counters["stored_rollout_record"] >= 0.85 * PACE_MARGIN * RATE * RUN_S, counters
    finally:
        for p in procs:
            await p.stop()
