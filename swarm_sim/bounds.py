"""Lower bounds: the earliest a message could arrive, and the fastest a broadcast could end.

Unicast and gossip. The simulator's network (`swarm_sim.network`) makes any one hop
a -> b of n bytes take at least  lat*(a, b) + n / min(up_a, down_b) + cpu(n), where lat*
is the shortest-path closure of the latency matrix (jitter only adds). Any relay path
p -> x1 -> ... -> r costs at least the direct hop: latencies by the triangle inequality
of lat*; serialisation because the first hop alone takes >= n / up_p and the last
>= n / down_r, so the path takes >= max(n/up_p, n/down_r) = n / min(up_p, down_r); and
the CPU cost is paid at least once. So the direct hop from the signer, both online, is
the shortest path through peers online at the time, and `Network.min_delay` is the bound
each delivery is compared with: no delivery can come earlier (tests check it), and
actual / bound says how much the overlay costs.

Broadcast of S bytes in chunks of c to N receivers, origin uplink B0, receivers'
uplinks B_i and downlinks D_i (Mundinger et al., "Optimal scheduling of peer-to-peer file
dissemination", 2008; the cooperative swarm bound of DESIGN.md):

    star     N * S / B0                              the origin sends every copy
    chain    S / B + (N - 1) * c / B                 pipelined chain at the median uplink B
    tree     min over fan-out k of  k*S/B + (ceil(log_k N) - 1) * k*c/B   relay tree
    bound    max( S/B0 + ceil(log2 N) * c / B_max,   the last chunk leaves the origin and
                                                     holders at most double per c/B_max
                  N * S / (B0 + sum B_i),            all copies go through the uplinks
                  S / min D_i )                      the slowest receiver downloads S
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["broadcast_bounds"]


def broadcast_bounds(
    size: float, chunk: float, origin_up: float, ups: Sequence[float], downs: Sequence[float]
) -> dict[str, float]:
    """Bounds and the classic schedules' times (seconds) for one broadcast (bytes, bytes/s)."""
    n = len(ups)
    if n < 1 or size <= 0 or chunk <= 0:
        raise ValueError("a broadcast needs receivers, a size and a chunk size")
    b = statistics.median(ups)
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    star = n * size / origin_up
    chain = size / b + (n - 1) * chunk / b
    tree = math.inf
    for k in range(2, 17):
        depth = max(1, math.ceil(math.log(n, k) - 1e-9))
        tree = min(tree, k * size / b + (depth - 1) * k * chunk / b)
    bound = max(
        size / origin_up + rounds * chunk / max(ups),
        n * size / (origin_up + sum(ups)),
        size / min(downs),
    )
    return {"lower_bound_s": bound, "star_s": star, "chain_s": chain, "tree_s": tree}
