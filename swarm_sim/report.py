"""Write a run's outputs: results.json, PNG plots, and a short report.md embedding them.

What lives here: `write_outputs(out_dir, results, info)`. `results.json` is written with
sorted keys and a fixed layout (byte-identical for a seed); the plots and the report
carry the wall time too. Plots (matplotlib, Agg backend, made only when there is data):

    latency_cdf.png         header propagation latency CDF, with the lower bound's CDF, log time axis
    delivery_over_time.png  delivery ratio per minute of publication (churn shows here)
    bytes_per_peer.png      CDF of bytes sent + received per peer
    version_spread.png      lowest / 1st percentile / highest policy version over time
    adversary_mesh.png      mesh slots honest peers give attackers, over time
    broadcast_cdf.png       (broadcast) completion time CDF with the lower bound
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm_sim.runner import RunInfo

__all__ = ["start_note", "write_outputs"]

_FIGURES_IN_REPORT = (
    "peers",
    "virtual_s",
    "delivery_ratio",
    "latency_p50_ms",
    "latency_p99_ms",
    "lower_bound_ratio_p50",
    "lower_bound_ratio_p99",
    "latency_p99_over_bound_p99",
    "duplicates_per_delivery",
    "body_latency_p50_ms",
    "body_latency_p99_ms",
    "pulls_failed",
    "bans",
    "bans_honest",
    "bans_attackers",
    "honest_penalized",
    "stale_at_trainer",
    "used_at_trainer",
    "version_reach_99_s_p50",
    "version_reach_99_s_max",
    "completion_max_s",
    "completion_p50_s",
    "lower_bound_s",
    "lower_bound_ratio",
    "star_s",
    "chain_s",
    "tree_s",
)


def _plots(out: Path, results: dict[str, Any]) -> list[tuple[str, str]]:
    import matplotlib  # deferred: heavy import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: heavy import

    s, fig = results["series"], results["figures"]
    made: list[tuple[str, str]] = []

    def save(name: str, title: str) -> None:
        plt.title(title)
        plt.grid(alpha=0.3)
        plt.tight_layout()
        plt.savefig(out / name, dpi=90)
        plt.close()
        made.append((name, title))

    def cdf(values: list[float]) -> tuple[list[float], list[float]]:
        return values, [i / (len(values) - 1) for i in range(len(values))]

    if s.get("latency_cdf_ms"):
        plt.figure(figsize=(6, 4))
        plt.plot(*cdf(s["latency_cdf_ms"]), label="delivered")
        plt.plot(*cdf(s["bound_cdf_ms"]), "--", label="lower bound")
        if min(s["latency_cdf_ms"]) > 0 and min(s["bound_cdf_ms"], default=1) > 0:
            plt.xscale("log")  # the first second matters; the tail runs to many seconds
        plt.xlabel("ms after signing")
        plt.ylabel("share of deliveries")
        plt.legend()
        save("latency_cdf.png", "Header propagation latency")
    if s.get("delivery_by_minute"):
        rows = [r for r in s["delivery_by_minute"] if r[3] is not None]
        plt.figure(figsize=(6, 3.5))
        plt.plot([r[0] for r in rows], [r[3] for r in rows], marker=".")
        plt.xlabel("minute of publication")
        plt.ylabel("delivery ratio")
        save("delivery_over_time.png", "Delivery among peers online throughout")
    if s.get("bytes_per_peer_cdf"):
        plt.figure(figsize=(6, 3.5))
        plt.plot(*cdf([b / 1e6 for b in s["bytes_per_peer_cdf"]]))
        plt.xlabel("MB sent + received")
        plt.ylabel("share of peers")
        save("bytes_per_peer.png", "Bytes per peer")
    if s.get("version_spread"):
        rows = s["version_spread"]
        plt.figure(figsize=(6, 3.5))
        for i, label in ((1, "lowest"), (2, "1st percentile"), (3, "highest")):
            plt.step([r[0] for r in rows], [r[i] for r in rows], where="post", label=label)
        plt.xlabel("virtual s")
        plt.ylabel("policy version")
        plt.legend()
        save("version_spread.png", "Policy versions held by workers")
    if s.get("adversary_mesh_slots"):
        rows = s["adversary_mesh_slots"]
        plt.figure(figsize=(6, 3.5))
        plt.plot([r[0] for r in rows], [r[1] for r in rows])
        plt.xlabel("virtual s")
        plt.ylabel("mesh slots")
        save("adversary_mesh.png", "Mesh slots honest peers give attackers")
    if s.get("completion_cdf_s"):
        plt.figure(figsize=(6, 4))
        plt.plot(*cdf(s["completion_cdf_s"]), label="completion")
        plt.axvline(
            fig["lower_bound_s"], ls="--", color="k", label="lower bound for the slowest peer"
        )
        plt.xlabel("s")
        plt.ylabel("share of peers")
        plt.legend()
        save("broadcast_cdf.png", "Checkpoint broadcast completion")
    return made


def start_note(results: dict[str, Any]) -> str | None:
    """What the swarm knew when it started (gossip runs): a cold start, or a warm one."""
    workload = results["settings"].get("workload")
    if workload is None:
        return None
    if workload.get("warm_start"):
        return "warm start: every peer knows every signer (a swarm that has run before)"
    refused = results["figures"].get("rejects", {}).get("new_identities", 0)
    return (
        "cold start: every peer meets every other for the first time (no signer known);"
        f" {refused:,} headers refused as new identities"
    )


def write_outputs(out_dir: Path, results: dict[str, Any], info: RunInfo) -> list[Path]:
    """Write results.json, the plots and report.md into `out_dir`; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    res = out_dir / "results.json"
    res.write_text(json.dumps(results, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    plots = _plots(out_dir, results)
    fig = results["figures"]
    lines = [
        f"# Simulation: {results['scenario']} (seed {results['seed']})",
        "",
        f"{info.events:,} events in {info.wall_s:,.1f} s wall"
        f" ({info.events_per_s:,.0f} events/s). Full figures and settings: `results.json`.",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    note = start_note(results)
    if note is not None:
        lines[3:3] = [note[0].upper() + note[1:] + ".", ""]
    lines += [f"| {k} | {fig[k]} |" for k in _FIGURES_IN_REPORT if fig.get(k) is not None]
    if fig.get("rejects"):
        lines += [
            "",
            "Rejections by reason: " + ", ".join(f"{k} {v}" for k, v in fig["rejects"].items()),
        ]
    for name, title in plots:
        lines += ["", f"## {title}", "", f"![{title}]({name})"]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [res, report, *(out_dir / n for n, _ in plots)]
