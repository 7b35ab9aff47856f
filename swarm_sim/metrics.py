"""What a simulation measures, and the summary figures computed from it.

What lives here: `Metrics` (raw samples gathered during a run: per-delivery latency and
its lower bound, per-message delivery among peers online for its whole lifetime, counts)
and `percentile`. Everything summarised is rounded, so `results.json` is byte-identical
for a seed.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Metrics", "percentile"]


def percentile(values: array | Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank on the sorted values), None when there are none."""
    if not len(values):
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


@dataclass(slots=True)
class Metrics:
    """Raw samples and counts gathered during a run (module docstring)."""

    latency_ms: array = field(default_factory=lambda: array("f"))  # header, first admission
    bound_ms: array = field(default_factory=lambda: array("f"))
    body_latency_ms: array = field(default_factory=lambda: array("f"))
    body_bound_ms: array = field(default_factory=lambda: array("f"))
    deliveries: int = 0
    duplicates: int = 0
    duplicates_suppressed: int = 0  # copies known to be late when sent (network's count)
    early: int = 0  # deliveries before their lower bound (must stay 0)
    delivered_offline: int = 0  # handler ran while the receiver was offline (must stay 0)
    messages: int = 0
    eligible: int = 0  # (message, receiver) pairs online for the message's whole lifetime
    eligible_delivered: int = 0
    by_minute: dict[int, list[int]] = field(default_factory=dict)  # minute -> [elig, got]
    rejects: Counter = field(default_factory=Counter)
    honest_penalized: int = 0  # score penalties honest peers gave honest peers
    honest_penalized_reasons: Counter = field(default_factory=Counter)
    pulls_ok: int = 0
    pulls_failed: int = 0
    pull_retries: int = 0
    ihave: int = 0
    iwant_served: int = 0
    grafts: int = 0
    prunes: int = 0
    bans: int = 0
    bans_honest: int = 0  # of them, bans of honest peers (the rest: attackers)
    adversary_mesh: list[tuple[float, int]] = field(default_factory=list)  # (t, slots)
    version_spread: list[tuple[float, int, int, int]] = field(default_factory=list)
    stale_at_trainer: int = 0
    used_at_trainer: int = 0
    joins: int = 0
    leaves: int = 0

    def delivered(self, latency_s: float, bound_s: float) -> None:
        """Record one delivery's latency and its lower bound (seconds)."""
        self.deliveries += 1
        self.latency_ms.append(latency_s * 1000.0)
        self.bound_ms.append(bound_s * 1000.0)
        if latency_s < bound_s - 1e-9:
            self.early += 1

    def close(self, t0: float, eligible: int, got: int) -> None:
        """Record a message's delivery among the peers eligible for it."""
        self.eligible += eligible
        self.eligible_delivered += got
        b = self.by_minute.setdefault(int(t0 // 60), [0, 0])
        b[0] += eligible
        b[1] += got

    def summary(self) -> dict:
        """The summary figures of the run, rounded."""
        ratios = [a / b for a, b in zip(self.latency_ms, self.bound_ms, strict=True) if b > 0]
        body_ratios = [
            a / b for a, b in zip(self.body_latency_ms, self.body_bound_ms, strict=True) if b > 0
        ]
        lat99, bound99 = percentile(self.latency_ms, 0.99), percentile(self.bound_ms, 0.99)
        return {
            "messages": self.messages,
            "deliveries": self.deliveries,
            "delivery_ratio": _r(
                self.eligible_delivered / self.eligible if self.eligible else None, 6
            ),
            "latency_p50_ms": _r(percentile(self.latency_ms, 0.50), 2),
            "latency_p99_ms": _r(lat99, 2),
            "lower_bound_ratio_p50": _r(percentile(ratios, 0.50)),
            "lower_bound_ratio_p99": _r(percentile(ratios, 0.99)),
            # Every latency is at least its bound, so the bounds' p99 bounds the p99 latency.
            "latency_p99_bound_ms": _r(bound99, 2),
            "latency_p99_over_bound": _r(lat99 / bound99 if lat99 and bound99 else None),
            "duplicates_per_delivery": _r(
                (self.duplicates + self.duplicates_suppressed) / self.deliveries
                if self.deliveries
                else None,
                4,
            ),
            "early_deliveries": self.early,
            "delivered_offline": self.delivered_offline,
            "body_latency_p50_ms": _r(percentile(self.body_latency_ms, 0.50), 2),
            "body_latency_p99_ms": _r(percentile(self.body_latency_ms, 0.99), 2),
            "body_lower_bound_ratio_p99": _r(percentile(body_ratios, 0.99)),
            "pulls_ok": self.pulls_ok,
            "pulls_failed": self.pulls_failed,
            "pull_retries": self.pull_retries,
            "ihave_sent": self.ihave,
            "iwant_served": self.iwant_served,
            "grafts": self.grafts,
            "prunes": self.prunes,
            "bans": self.bans,
            "bans_honest": self.bans_honest,
            "bans_attackers": self.bans - self.bans_honest,
            "honest_penalized": self.honest_penalized,
            "honest_penalized_reasons": dict(sorted(self.honest_penalized_reasons.items())),
            "rejects": dict(sorted(self.rejects.items())),
            "joins": self.joins,
            "leaves": self.leaves,
        }
