"""Summary figures a peer's status reports: latency percentiles in milliseconds."""

from __future__ import annotations

from collections.abc import Iterable

from node.host.host import SwarmHost


def p99_ms(values: Iterable[float]) -> float | None:
    """The 99th percentile of durations in seconds, in milliseconds (None when empty)."""
    ordered = sorted(values)
    return round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2) if ordered else None


def rtt_median_ms(host: SwarmHost) -> float | None:
    """The median ping round trip over the connected peers that have one, in milliseconds."""
    rtts = sorted(r for p in host.connected_peers() if (r := host.peer_rtt(p)) == r)
    return round(rtts[len(rtts) // 2] * 1000, 3) if rtts else None
