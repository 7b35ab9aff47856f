"""Adversaries: what a byzantine virtual peer does instead of (or beside) the protocol.

What lives here: the behaviours (`Behaviour`) and `AdversaryConfig` (the share of peers
given each, and their rates). The swarm (`swarm_sim.swarm`) asks `behaviour[p]` when it
publishes, forwards, answers a pull, or runs a heartbeat; the honest peers facing them
run only the real rules (`protocol.admission`, `protocol.peer_score`).

    SPAM       publishes its own validly signed headers at `spam_rate` per second to every
               connected peer (over admission's signer rate they are dropped free; past
               the per-sender rate and its overrun allowance the connection pays)
    INVALID    sends forged headers (bad signature) at `invalid_rate` to every peer
    DUPLICATE  republishes one unit of work (same body digest) under fresh headers
    REPLAY     re-sends other peers' old messages to its neighbours, as a relay
    WITHHOLD   announces and forwards headers but never serves a body pull
    SHOP       publishes like a worker but only one assignment counter in 1/`shop_keep`
               (the solved ones, say); the trainer's `protocol.accounting.GapCharges`
               charges it once its gaps pass the allowance

Not modelled yet (the rule it attacks is not in `protocol/` yet): false vouching (verdict
authority).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

__all__ = ["AdversaryConfig", "Behaviour"]


class Behaviour(enum.IntEnum):
    """What a simulated peer does: honest, or one of the attacks."""

    HONEST = 0
    SPAM = 1
    INVALID = 2
    DUPLICATE = 3
    REPLAY = 4
    WITHHOLD = 5
    SHOP = 6


@dataclass(frozen=True, slots=True)
class AdversaryConfig:
    """Which share of peers misbehaves how, and at what rates."""

    fractions: dict[str, float] = field(default_factory=dict)  # behaviour name -> share
    spam_rate: float = 50.0
    invalid_rate: float = 5.0
    duplicate_rate: float = 2.0
    replay_rate: float = 5.0
    shop_keep: float = 0.25  # share of its counters a shopper publishes
    start_s: float = 10.0  # when they start misbehaving

    def __post_init__(self) -> None:
        for name, share in self.fractions.items():
            if name.upper() not in Behaviour.__members__ or name.upper() == "HONEST":
                raise ValueError(f"unknown adversary behaviour {name!r}")
            if not 0 <= share <= 1:
                raise ValueError(f"adversary share of {name} must be in [0, 1]")
        if not 0 < self.shop_keep <= 1:
            raise ValueError("adversary shop_keep must be in (0, 1]")
        if sum(self.fractions.values()) > 1:
            raise ValueError("adversary shares add up to more than 1")

    def assign(self, n: int, rng: random.Random, exclude: set[int]) -> bytearray:
        """One behaviour per peer; peers in `exclude` (trainer, ...) stay honest."""
        out = bytearray(n)
        pool = [p for p in range(n) if p not in exclude]
        rng.shuffle(pool)
        i = 0
        for name in sorted(self.fractions):
            k = round(self.fractions[name] * n)
            for p in pool[i : i + k]:
                out[p] = Behaviour[name.upper()]
            i += k
        return out
