"""A GossipSub v1.1 mesh model: the per-peer router state and its heartbeat rules.

What lives here: `GossipConfig` (D, D_lo, D_hi, D_lazy, heartbeat, gossip history) and
`Router`, one per virtual peer: its mesh, its message cache of the last
`history_gossip` heartbeats, and the heartbeat's decisions (prune peers whose score fell
below zero, graft up to D from connected peers with score >= 0 when under D_lo, prune the
lowest-scored down to D when over D_hi, choose D_lazy non-mesh peers for IHAVE). Scores
are read from the peer's `protocol.admission.Admission` (`protocol.peer_score`), through
the `score` function the caller passes; this module keeps no score of its own.

What it leaves to the caller (`swarm_sim.swarm`): sending, GRAFT/PRUNE delivery (applied
to both ends at once; the control bytes are counted, not queued), IWANT answers, and
duplicate suppression (the router's seen-cache is `SimMessage.got`).

Left out of the model: topic fan-out (every peer subscribes the one topic), flood
publishing, opportunistic grafting, the score's P1-P7 components (our score is
admission's: penalties per fault, rewards per admitted message, decay).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["GossipConfig", "Router", "sample"]


@dataclass(frozen=True, slots=True)
class GossipConfig:
    """GossipSub's mesh degrees, heartbeat and cache windows, as the node's."""

    d: int = 6
    d_lo: int = 4
    d_hi: int = 12
    d_lazy: int = 6
    heartbeat_s: float = 1.0
    history_gossip: int = 3  # heartbeats of message ids advertised in IHAVE
    prune_backoff_s: float = 60.0
    seen_ttl_s: float = 120.0  # how long the seen-cache remembers a message id
    control_bytes: int = 64  # one GRAFT, PRUNE, or the frame of an IHAVE / IWANT
    id_bytes: int = 34  # one message id inside IHAVE / IWANT

    def __post_init__(self) -> None:
        if not 1 <= self.d_lo <= self.d <= self.d_hi:
            raise ValueError("GossipSub needs 1 <= D_lo <= D <= D_hi")
        if self.seen_ttl_s <= 0:
            raise ValueError("seen_ttl_s must be > 0")
        if self.d_lazy < 0 or self.heartbeat_s <= 0 or self.history_gossip < 1:
            raise ValueError("D_lazy >= 0, heartbeat > 0 and history_gossip >= 1")


def sample(rng: random.Random, population: list[int], k: int) -> list[int]:
    """`rng.sample(population, k)`: the one place peers are sampled (heartbeat, gossip)."""
    return rng.sample(population, k)


class Router:
    """One peer's mesh and gossip cache."""

    __slots__ = ("backoff", "dirty", "history", "live", "mcache", "mesh", "suspect")

    def __init__(self, history: int) -> None:
        self.mesh: set[int] = set()
        self.history = history
        self.mcache: deque[list] = deque([[] for _ in range(history)], maxlen=history)
        # Heartbeats (shifts) until the cache is empty again: > 0 exactly when a window
        # holds a message, so the heartbeat can skip an idle router without looking.
        self.live = 0
        self.dirty = True  # a score may have dropped below zero / mesh size changed
        self.backoff: dict[int, float] = {}  # peer -> no re-graft before this time
        # Peers this one ever penalised: only their scores can be below zero (a score
        # starts at 0, rewards only raise it), so only they need reading (kept on restart).
        self.suspect: set[int] = set()

    def reset(self) -> None:
        """Forget the mesh and cache (a restart keeps scores, not connections)."""
        self.mesh.clear()
        for w in self.mcache:
            w.clear()
        self.live = 0
        self.backoff.clear()
        self.dirty = True

    def add(self, msg: object) -> None:
        """Cache a message in the newest window (it is advertised for `history` beats)."""
        self.mcache[-1].append(msg)
        self.live = self.history

    def maintain(
        self,
        connected: set[int],
        score: Callable[[int], float],
        cfg: GossipConfig,
        rng: random.Random,
        now: float,
    ) -> tuple[list[int], list[int]]:
        """The mesh part of a heartbeat: returns (graft, prune) peer lists."""
        prune: list[int] = []
        mesh = self.mesh
        if self.dirty:
            for p in sorted(mesh):
                if p not in connected or score(p) < 0:
                    prune.append(p)
            for p in prune:
                mesh.discard(p)
            self.dirty = False
        graft: list[int] = []
        if len(mesh) < cfg.d_lo:
            cands = [
                p
                for p in sorted(connected)
                if p not in mesh and self.backoff.get(p, 0.0) <= now and score(p) >= 0
            ]
            rng.shuffle(cands)
            graft = cands[: cfg.d - len(mesh)]
            mesh.update(graft)
        elif len(mesh) > cfg.d_hi:
            ranked = sorted(mesh, key=lambda p: (score(p), -p))
            drop = ranked[: len(mesh) - cfg.d]
            for p in drop:
                mesh.discard(p)
            prune.extend(drop)
        for p in prune:
            self.backoff[p] = now + cfg.prune_backoff_s
        return graft, prune

    def gossip_targets(
        self,
        connected: Sequence[int],
        score: Callable[[int], float],
        cfg: GossipConfig,
        rng: random.Random,
    ) -> list[int]:
        """Peers to send IHAVE to this heartbeat (non-mesh, score >= 0); `connected` in
        ascending order (`Network.sorted_conns`)."""
        if not self.live or cfg.d_lazy == 0:
            return []
        mesh, suspect = self.mesh, self.suspect
        # Only a suspect can score below zero (see `suspect`): ask the score of those only.
        cands = [p for p in connected if p not in mesh and (p not in suspect or score(p) >= 0)]
        if len(cands) <= cfg.d_lazy:
            return cands
        return sample(rng, cands, cfg.d_lazy)

    def shift(self) -> None:
        """End of a heartbeat: the oldest window of the cache falls out."""
        self.mcache.append([])
        if self.live:
            self.live -= 1
