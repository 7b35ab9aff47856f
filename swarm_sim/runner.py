"""Run a scenario: build the models, drive them, and gather results and plot series.

What lives here: `run_scenario(scenario, seed, progress)` -> a results dict that is a
pure function of (scenario, seed): no wall-clock times in it, floats rounded, keys
sorted when written, so `results.json` is byte-identical for a seed. Wall time and
events per second are reported beside it (`RunInfo`), never inside it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarm_sim.broadcast import simulate_broadcast
from swarm_sim.metrics import percentile
from swarm_sim.scenario import Scenario
from swarm_sim.swarm import Swarm

__all__ = ["RunInfo", "progress_printer", "run_scenario"]


@dataclass(slots=True)
class RunInfo:
    """How long a run took in wall time, and how many events it ran."""

    wall_s: float = 0.0
    events: int = 0

    @property
    def events_per_s(self) -> float:
        """Events per wall second."""
        return self.events / self.wall_s if self.wall_s > 0 else 0.0


ETA_WINDOW_S = 30.0  # the ETA extrapolates the pace of the last this many wall seconds


def progress_printer(
    total_s: float, label: str = "sim", every_fraction: float = 0.0, publish_s: float = 0.0
) -> Callable[[float, int], None]:
    """A progress callback printing virtual time, events and an ETA to stderr.

    `total_s` is the whole run, its drain included (a gossip run publishes for `publish_s`,
    then drains until every message is judged): the progress never passes 100%, and the
    line names the phase ("publishing", then "draining") when `publish_s` is given.

    The ETA extrapolates the recent pace (virtual seconds per wall second over the last
    `ETA_WINDOW_S`), not the pace since the start: a run's first minutes (peers still
    meeting, little traffic yet) go faster than the rest. Before 2% of the run it says
    "ETA estimating". With `every_fraction` > 0 only a line each time the run passes
    another such fraction (a quiet run: 25% steps) is printed."""
    start = time.monotonic()
    samples: deque[tuple[float, float]] = deque([(0.0, 0.0)])  # (wall, virtual)
    next_step = every_fraction

    def show(now: float, events: int) -> None:
        nonlocal next_step
        wall = time.monotonic() - start
        samples.append((wall, now))
        while len(samples) > 2 and wall - samples[1][0] >= ETA_WINDOW_S:
            samples.popleft()
        now = min(now, total_s) if total_s > 0 else now
        frac = min(1.0, now / total_s) if total_s > 0 else 1.0
        if every_fraction > 0:
            if frac < next_step:
                return
            next_step = (math.floor(frac / every_fraction) + 1) * every_fraction
        w0, v0 = samples[0]
        pace = (now - v0) / (wall - w0) if wall > w0 else 0.0
        if frac < 0.02 or pace <= 0:
            eta = "ETA estimating"
        else:
            eta = f"ETA {max(0.0, total_s - now) / pace:,.0f} s"
        phase = ""
        if publish_s > 0:
            phase = "  publishing" if now < publish_s else "  draining"
        print(
            f"{label}: {100 * frac:5.1f}%  virtual {now:,.0f}/{total_s:,.0f} s{phase}"
            f"  {events:,} events  wall {wall:,.0f} s  {eta}",
            file=sys.stderr,
            flush=True,
        )

    return show


def _quantiles(values: Any, n: int = 100) -> list[float]:
    """n + 1 evenly spaced quantiles (a CDF to plot), rounded."""
    if not len(values):
        return []
    s = sorted(values)
    return [round(float(s[min(len(s) - 1, int(i * len(s) / n))]), 3) for i in range(n + 1)]


def _settings(scn: Scenario) -> dict[str, Any]:
    tables = ("workload", "network", "gossip", "churn", "adversary")
    if scn.kind == "broadcast":
        tables = ("broadcast", "network")
    out: dict[str, Any] = {}
    for t in tables:
        d = dataclasses.asdict(getattr(scn, t))
        d.pop("admission", None)
        out[t] = d
    return out


def run_scenario(
    scn: Scenario, seed: int = 0, progress: Callable[[float, int], None] | None = None
) -> tuple[dict[str, Any], RunInfo]:
    """Run `scn` with `seed`; returns (results, run info)."""
    t0 = time.monotonic()
    if scn.kind == "broadcast":
        fig = simulate_broadcast(scn.broadcast, scn.network, seed)
        times = fig.pop("completion_times_s")
        series = {"completion_cdf_s": _quantiles(times)}
        info = RunInfo(time.monotonic() - t0, fig["events"])
        return _results(scn, seed, fig, series), info
    sw = Swarm(scn.workload, scn.network, scn.gossip, scn.churn, scn.adversary, seed=seed)
    fig = sw.run(progress)
    m, net = sw.m, sw.net
    per_peer = sorted(net.sent[i] + net.received[i] for i in range(sw.n))
    reach = _version_reach(sw)
    reach_p50 = percentile(reach, 0.5)
    fig["version_reach_99_s_p50"] = None if reach_p50 is None else round(reach_p50, 3)
    fig["version_reach_99_s_max"] = None if not reach else round(max(reach), 3)
    fig["bytes_per_peer_p50"] = percentile(per_peer, 0.5)
    fig["bytes_per_peer_max"] = per_peer[-1] if per_peer else None
    latency_p99, bound_p99 = percentile(m.latency_ms, 0.99), percentile(m.bound_ms, 0.99)
    fig["latency_p99_over_bound_p99"] = (
        round(latency_p99 / bound_p99, 3)
        if latency_p99 is not None and bound_p99 is not None
        else None
    )
    series = {
        "latency_cdf_ms": _quantiles(m.latency_ms),
        "bound_cdf_ms": _quantiles(m.bound_ms),
        "delivery_by_minute": [
            [k, v[0], v[1], round(v[1] / v[0], 6) if v[0] else None]
            for k, v in sorted(m.by_minute.items())
        ],
        "bytes_per_peer_cdf": _quantiles(per_peer),
        "version_spread": [list(x) for x in m.version_spread],
        "adversary_mesh_slots": [list(x) for x in m.adversary_mesh],
    }
    info = RunInfo(time.monotonic() - t0, sw.loop.events)
    return _results(scn, seed, fig, series), info


def _version_reach(sw: Swarm) -> list[float]:
    """Per version: seconds from announce until 99% of online workers had adopted it
    (read from the samples, so to within `Workload.sample_s`)."""
    out = []
    spread = sw.m.version_spread
    for v, t_announce in sorted(sw.announce_times.items()):
        for t, _lo, p1, _hi in spread:
            if t >= t_announce and p1 >= v:
                out.append(t - t_announce)
                break
    return out


def _results(scn: Scenario, seed: int, fig: dict, series: dict) -> dict[str, Any]:
    return {
        "scenario": scn.name,
        "kind": scn.kind,
        "seed": seed,
        "settings": _settings(scn),
        "figures": fig,
        "series": series,
    }
