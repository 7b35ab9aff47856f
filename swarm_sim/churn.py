"""Churn: how long peers stay, how long they are away, and how they leave.

What lives here: `ChurnConfig` and its draws. Session lengths are exponential or
Weibull (shape k; k < 1 gives the heavy tail measured in deployed peer-to-peer
networks), offline gaps exponential. A leave is a crash with probability `crash_fraction`
(neighbours notice only after `dead_after_s`, and keep sending into the void until then)
or graceful (neighbours are told at once). A peer that comes back rejoins with the same
identity and its stored state (scores, bans, sequence counter), as the real node does
from its SQLite store; its connections and mesh start empty.

`churn_per_hour` is the share of the online population that leaves per hour; with
exponential sessions the mean session is 1 / churn_per_hour hours.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["ChurnConfig"]


@dataclass(frozen=True, slots=True)
class ChurnConfig:
    """How peers leave and come back: session lengths, time away, crashes."""

    churn_per_hour: float = 0.0  # 0: nobody leaves
    distribution: str = "exponential"  # or "weibull"
    weibull_shape: float = 0.6
    offline_mean_s: float = 600.0
    crash_fraction: float = 0.5
    dead_after_s: float = 4.0  # how long neighbours take to notice a crash

    def __post_init__(self) -> None:
        if self.churn_per_hour < 0 or self.offline_mean_s <= 0 or self.dead_after_s < 0:
            raise ValueError("churn_per_hour >= 0, offline_mean_s > 0, dead_after_s >= 0")
        if self.distribution not in ("exponential", "weibull"):
            raise ValueError("churn distribution is 'exponential' or 'weibull'")
        if not 0 <= self.crash_fraction <= 1 or self.weibull_shape <= 0:
            raise ValueError("crash_fraction in [0, 1], weibull_shape > 0")

    @property
    def enabled(self) -> bool:
        """Whether any peer leaves."""
        return self.churn_per_hour > 0

    def session_s(self, rng: random.Random) -> float:
        """A random session length (seconds online before leaving)."""
        mean = 3600.0 / self.churn_per_hour
        if self.distribution == "exponential":
            return rng.expovariate(1.0 / mean)
        k = self.weibull_shape
        scale = mean / math.gamma(1.0 + 1.0 / k)  # same mean as the exponential
        return rng.weibullvariate(scale, k)

    def offline_s(self, rng: random.Random) -> float:
        """A random time away (seconds)."""
        return rng.expovariate(1.0 / self.offline_mean_s)

    def crashes(self, rng: random.Random) -> bool:
        """Whether a leaving peer crashes (rather than leaving cleanly)."""
        return rng.random() < self.crash_fraction
