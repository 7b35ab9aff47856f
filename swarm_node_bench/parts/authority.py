"""`bench adversary`'s sections on the run's own authorities: `equivocation` and `validators`.

`equivocation`: real peers in this process (py-libp2p on loopback, SQLite stores): a hub
and `halves` peers on each side of a split. A trainer key signs two different manifests of
version 2; each half installs its own side, and both sides are announced at once. Per
peer, the time from that moment until it treats the key as failed (it saw both objects,
or the evidence came by gossip):

    detected            every peer holds the evidence (within `deadline_s`)
    evidence_gossiped   how many peers gossiped evidence they found themselves
    time_to_detect_s    the slowest peer's time, s (null if not every peer detected)
    honest_charged      pairs of honest peers where one scored the other below 0

`validators`: `node.testing.judges_sim.figures` (virtual time: two honest validators, one
that fails an honest worker and passes everything else at once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

from node.peer.peer import PeerConfig, open_peer
from node.testing.equivocation import install_side
from node.testing.judges_sim import figures as validators_figures
from node.testing.records import net_manifest
from node.weights.sync import WeightSettings
from protocol.identity import Identity
from trainer.checkpoint import canonical_bytes

SHARD = 64 * 1024


def _weights(seed: int) -> bytes:
    """A small canonical checkpoint (4 float32 tensors)."""
    w = np.random.default_rng(seed).standard_normal(64 * 1024).astype(np.float32)
    q = len(w) // 4
    return canonical_bytes(
        {f"t{i}": ("F32", (q // 64, 64), w[i * q : (i + 1) * q].tobytes()) for i in range(4)}
    )


async def equivocation(halves: int = 2, deadline_s: float = 30.0) -> dict[str, Any]:
    """The `equivocation` section (module docstring)."""
    liar = Identity.generate()
    manifest = dataclasses.replace(net_manifest("equivocation"), trainer_keys=(liar.peer_id,))
    with tempfile.TemporaryDirectory(prefix="bench-equivocation-") as tmp:

        def cfg(name: str, boot: tuple[str, ...] = ()) -> PeerConfig:
            return PeerConfig(
                manifest=manifest,
                identity=Identity.generate(),
                data_dir=Path(tmp) / name,
                roles=("relay",),
                weights=WeightSettings(shard_bytes=SHARD),
                bootstrap=boot,
            )

        async with contextlib.AsyncExitStack() as stack:
            hub = await stack.enter_async_context(open_peer(cfg("hub")))
            boot = (hub.host.listen_addrs()[0],)
            sides = [
                [
                    await stack.enter_async_context(open_peer(cfg(f"{s}{i}", boot)))
                    for i in range(halves)
                ]
                for s in "ab"
            ]
            peers = [hub, *sides[0], *sides[1]]
            with trio.move_on_after(deadline_s):
                while not all(p.host.connected_peers() for p in peers):
                    await trio.sleep(0.1)
            await trio.sleep(1.0)  # gossip meshes form
            envs = []
            for half, data in zip(sides, (_weights(1), _weights(2)), strict=True):
                envs.append([await install_side(p, liar, 2, data, SHARD) for p in half])
            start = time.monotonic()
            for half, half_envs in zip(sides, envs, strict=True):
                await half[0].outbox.put(half[0].topics["weights"], half_envs[0])
            detected_at: dict[int, float] = {}
            with trio.move_on_after(deadline_s):
                while len(detected_at) < len(peers):
                    for i, p in enumerate(peers):
                        if i not in detected_at and p.admission.authority.failed(liar.peer_id):
                            detected_at[i] = time.monotonic() - start
                    await trio.sleep(0.02)
            await trio.sleep(0.5)  # evidence written and gossiped
            now = time.time()
            charged = sum(
                p.admission.scores.score(q.host.peer_id, now) < 0
                for p in peers
                for q in peers
                if q is not p
            )
            every = len(detected_at) == len(peers)
            return {
                "nodes": len(peers),
                "detected": every,
                "nodes_detected": len(detected_at),
                "evidence_gossiped": sum(p.counters["equivocations_gossiped"] for p in peers),
                "evidence_stored": sum(bool(p.store.equivocations()) for p in peers),
                "time_to_detect_s": round(max(detected_at.values()), 3) if every else None,
                "honest_charged": charged,
            }


def sections(names: set[str]) -> dict[str, Any]:
    """The sections named (`equivocation`, `validators`), for `bench adversary`'s figures."""
    out: dict[str, Any] = {}
    if "equivocation" in names:
        out["equivocation"] = trio.run(equivocation)
    if "validators" in names:
        out["validators"] = validators_figures()
    return out
