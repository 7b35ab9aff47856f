"""Which weight manifests to fetch to reach a version: the fewest bytes, as a pure function.

A peer may reach version `target` by
- fetching the full version `target` (a "full" manifest), or
- fetching a full version s (say, the newest snapshot) and then the delta patches
  s+1 .. target, or
- starting from a version it has installed, and applying the patches after it.

Each manifest is an edge: a full manifest of v goes from "nothing" to v, a delta manifest
of v goes from its base version to v. The plan is the cheapest path (sum of
`total_bytes`) from any installed version, or from nothing, to `target` (Dijkstra over
versions; ties prefer fewer steps). Only signed, admitted manifests should be offered
(admission in `protocol.admission` decides that); this module only weighs bytes.

Public API: `Offer(manifest_id, version, kind, base_version, total_bytes)`,
`plan(target, installed, offers) -> list[Offer] | None` (None: unreachable; [] when
`target` is installed already), `plan_bytes(steps)`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Offer", "plan", "plan_bytes"]

_NOTHING = -1


@dataclass(frozen=True, slots=True)
class Offer:
    """A known manifest: fetching it costs `total_bytes` and yields `version`."""

    manifest_id: bytes
    version: int
    kind: str  # "full" | "delta"
    base_version: int  # deltas: the version the patch applies to
    total_bytes: int


def plan(target: int, installed: Iterable[int], offers: Iterable[Offer]) -> list[Offer] | None:
    """The cheapest sequence of manifests to fetch (in order) to reach `target`."""
    have = set(installed)
    if target in have:
        return []
    edges: dict[int, list[Offer]] = {}
    for o in offers:
        if o.version > target or o.total_bytes < 0:
            continue
        src = _NOTHING if o.kind == "full" else o.base_version
        if o.kind == "delta" and o.base_version >= o.version:
            continue  # a patch must go forward
        edges.setdefault(src, []).append(o)
    best: dict[int, tuple[int, int]] = {_NOTHING: (0, 0)}
    back: dict[int, Offer] = {}
    heap: list[tuple[int, int, int]] = [(0, 0, _NOTHING)]
    for v in have:
        best[v] = (0, 0)
        heap.append((0, 0, v))
    heapq.heapify(heap)
    while heap:
        cost, steps, v = heapq.heappop(heap)
        if (cost, steps) > best.get(v, (cost, steps)):
            continue
        if v == target:
            break
        for o in edges.get(v, ()):
            cand = (cost + o.total_bytes, steps + 1)
            if o.version not in best or cand < best[o.version]:
                best[o.version] = cand
                back[o.version] = o
                heapq.heappush(heap, (cand[0], cand[1], o.version))
    if target not in back:
        return None
    path: list[Offer] = []
    v = target
    while v in back and v not in have:
        o = back[v]
        path.append(o)
        v = _NOTHING if o.kind == "full" else o.base_version
    path.reverse()
    return path


def plan_bytes(steps: Iterable[Offer]) -> int:
    """The bytes a plan's steps download in all."""
    return sum(o.total_bytes for o in steps)
