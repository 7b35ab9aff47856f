"""The devnet's report: totals read from the nodes' status files, `report.json`, the
plots (progress.png, workers.png, learning.png) and the summary lines printed at the end.
Reads what the nodes wrote; starts, signals and stops nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from node.commands.devnet_evaluation import final_text
from node.commands.devnet_nodes import NodeProc
from node.roles.rollout_fates import shares
from node.store.store import DB_FILENAME, Store, StoreError
from protocol.identity import peer_text
from trainer.groups import paired_ci95


def node_totals(nodes: list[NodeProc]) -> dict[str, Any]:
    """The swarm's totals, from each node's last status read."""
    produced = sum(
        n.status.get("role_status", {}).get("produced", 0) for n in nodes if n.role == "inference"
    )
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    tstat = trainer.status.get("role_status", {}) if trainer else {}
    validators = [n.status.get("role_status", {}) for n in nodes if n.role == "validator"]
    inference_rewards = [
        (
            n.status.get("role_status", {}).get("reward_mean"),
            n.status.get("role_status", {}).get("produced", 0),
        )
        for n in nodes
        if n.role == "inference"
    ]
    weighted = [(r * k, k) for r, k in inference_rewards if r is not None and k]
    # Rollouts the trainer refused as beyond the staleness bound, as the workers' receipts
    # account them: they were delivered too late to use, not lost.
    too_stale = sum(
        n.status.get("delivery", {}).get("too_stale", 0) for n in nodes if n.role == "inference"
    )
    return {
        "produced": produced,
        "too_stale": too_stale,
        "trainer_bodies": (
            trainer.status.get("counters", {}).get("stored_rollout_record", 0) if trainer else 0
        ),
        "trainer_verified": tstat.get("verified", 0),
        # what became of the work at the trainer (`fates`), and what audits or the trainer refused
        "trained": (tstat.get("fates") or {}).get("trained", 0),
        "stale": (tstat.get("fates") or {}).get("stale", 0),
        "refused": sum(v.get("failed", 0) for v in validators) + (tstat.get("rejected", 0) or 0),
        "trainer_rejected": tstat.get("rejected", 0),
        "trainer_usable": tstat.get("usable_at_version", 0),
        "audited": sum(v.get("passed", 0) + v.get("failed", 0) for v in validators),
        "audits_passed": sum(v.get("passed", 0) for v in validators),
        "audits_failed": sum(v.get("failed", 0) for v in validators),
        **audit_backlog(validators),
        "reward_mean": round(sum(a for a, _ in weighted) / sum(k for _, k in weighted), 4)
        if weighted
        else None,
        "peers_min": min((n.status.get("peers", 0) for n in nodes), default=0),
    }


def rollout_fates(nodes: list[NodeProc], produced: int) -> dict[str, Any]:
    """What became of the `produced` rollouts, from the trainer's `fates`
    (`node.roles.rollout_fates.shares`: counts and shares of trained, stale, unverified,
    incomplete_group, other); with `error` instead of shares when its counts explain more
    than was produced (a node's last status lagged, one killed at the stop)."""
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    counts = (trainer.status.get("role_status", {}).get("fates") or {}) if trainer else {}
    try:
        return shares(produced, counts)
    except ValueError as exc:
        return {"produced": produced, "counts": counts, "error": str(exc)}


def audit_backlog(validators: list[dict[str, Any]]) -> dict[str, int]:
    """The validators' audit backlog: sampled rollouts still queued (the queue is bounded:
    `audit_queue_capacity` in all), and those dropped unaudited because the queue was full
    or because the trainer could no longer use them."""
    return {
        "audits_sampled": sum(v.get("sampled", 0) for v in validators),
        "audit_queued": sum(v.get("queued", 0) for v in validators),
        "audit_queue_capacity": sum(v.get("queue_capacity", 0) for v in validators),
        "audit_dropped_full": sum(v.get("queue_full", 0) for v in validators),
        "audit_dropped_stale": sum(v.get("dropped_stale", 0) for v in validators),
    }


def _plots(out: Path, series: list[dict[str, Any]], nodes: list[NodeProc]) -> list[str]:
    try:
        import matplotlib  # deferred: heavy import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: heavy import
    except ImportError:
        return []
    written = []
    if series:
        fig, ax = plt.subplots(figsize=(7, 4))
        ts = [p["t"] for p in series]
        for key, label in (
            ("produced", "produced (workers)"),
            ("trainer_bodies", "received by trainer"),
            ("audited", "audited (validators)"),
            ("trainer_verified", "verified at trainer"),
            ("trained", "trained on"),
            ("stale", "too stale to train"),
            ("refused", "refused (failed audit or trainer)"),
        ):
            ax.plot(ts, [p.get(key, 0) for p in series], label=label)
        drain = next((p["t"] for p in series if p.get("phase") == "drain"), None)
        if drain is not None:
            ax.axvline(drain, color="grey", linestyle=":", label="workers paused (drain)")
        ax.set_xlabel("seconds")
        ax.set_ylabel("rollouts")
        ax.set_title("devnet progress")
        ax.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "progress.png", dpi=100)
        plt.close(fig)
        written.append("progress.png")
    panels = []  # (title, x labels, x title, [(label, values, bottom)], y label)

    def figures(role: str, *keys: str) -> tuple[list[str], list[list[int]]]:
        these = [n for n in nodes if n.role == role]
        return [n.name for n in these], [
            [n.status.get("role_status", {}).get(k, 0) or 0 for n in these] for k in keys
        ]

    workers = [n for n in nodes if n.role == "inference"]
    if workers:
        names = [n.name for n in workers]
        made = [n.status.get("role_status", {}).get("produced", 0) or 0 for n in workers]
        # each worker's own account of its rollouts (`Store.own_work`)
        own = [n.status.get("delivery") or {} for n in workers]
        trained = [min(m, d.get("trained", 0)) for m, d in zip(made, own, strict=True)]
        stale = [d.get("too_stale", 0) for d in own]
        refused = [d.get("refused", 0) for d in own]
        rest = [
            max(0, m - t - s - r) for m, t, s, r in zip(made, trained, stale, refused, strict=True)
        ]
        stack, bottom = [], [0] * len(workers)
        for label, values in (
            ("trained", trained),
            ("too stale", stale),
            ("refused", refused),
            ("not yet known", rest),
        ):
            stack.append((label, values, list(bottom)))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        panels.append(("workers (what became of their rollouts)", names, "node", stack, "rollouts"))
    names, (passed, failed) = figures("validator", "passed", "failed")
    if names:
        panels.append(
            (
                "validators",
                names,
                "node",
                [("passed", passed, None), ("failed", failed, passed)],
                "audits",
            )
        )
    trainer = [n for n in nodes if n.role == "trainer"]
    if trainer:
        t = trainer[0]
        got = t.status.get("counters", {}).get("stored_rollout_record", 0)
        verified = t.status.get("role_status", {}).get("verified", 0) or 0
        trained = (t.status.get("role_status", {}).get("fates") or {}).get("trained", 0) or 0
        panels.append(
            (
                "trainer",
                ["received", "verified", "trained"],
                t.name,
                [("rollouts", [got, verified, trained], None)],
                "rollouts",
            )
        )
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 1, 4), squeeze=False)
        for ax, (title, names, xlabel, bars, ylabel) in zip(axes[0], panels, strict=True):
            tops = [0.0] * len(names)
            for label, values, bottom in bars:
                ax.bar(names, values, bottom=bottom, label=label)
                tops = [t + v for t, v in zip(tops, values, strict=True)]
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.tick_params(axis="x", labelrotation=30)
            if len(bars) > 1:  # headroom above the bars for the legend
                ax.set_ylim(0, max(max(tops), 1) * 1.35)
                ax.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "workers.png", dpi=100)
        plt.close(fig)
        written.append("workers.png")
    return written


def version_spread(nodes: list[NodeProc]) -> list[dict[str, Any]]:
    """Per published version: when the trainer published it, and how long until each
    inference worker first generated with it or a newer one (its hot swap; a worker may
    skip a version it received together with the next); `spread_s` is the time to the last
    worker, None while some worker never got there."""
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    if trainer is None:
        return []
    published = (trainer.status.get("weights") or {}).get("published_at") or {}
    workers = [n for n in nodes if n.role == "inference"]
    out = []
    for v, t in sorted(published.items(), key=lambda kv: int(kv[0])):
        reached = {}
        for n in workers:
            swaps = (n.status.get("role_status") or {}).get("swaps") or {}
            times = [s for sv, s in swaps.items() if int(sv) >= int(v)]  # v or a newer one
            if times:
                reached[n.name] = round(min(times) - t, 2)
        out.append(
            {
                "version": int(v),
                "published_at": t,
                "workers_reached": len(reached),
                "workers": len(workers),
                "per_worker_s": reached,
                "spread_s": max(reached.values())
                if len(reached) == len(workers) and reached
                else None,
            }
        )
    return out


def version_line(v: dict[str, Any], stopped_at: float) -> str:
    """One summary line for an entry of `version_spread`."""
    head = f"devnet: version {v['version']}: "
    if v["spread_s"] is not None:
        return f"{head}all {v['workers']} workers generating with it within {v['spread_s']:g} s of its publication"
    before = max(0.0, stopped_at - v["published_at"])
    return (
        f"{head}{v['workers_reached']}/{v['workers']} workers generating with it when the "
        f"swarm stopped, {before:.0f} s after its publication"
    )


def solve_rate_ci95(rate: float, tasks: int) -> float:
    """Half-width of the normal-approximation 95% interval of a solve rate over `tasks`."""
    return 1.96 * math.sqrt(max(rate * (1 - rate), 0.25 / tasks) / tasks) if tasks > 0 else 0.0


def heldout_gain(series: list[dict[str, Any]]) -> dict[str, Any]:
    """The last evaluation's held-out solve rate less the first's, with the 95% interval
    of that change paired over the same tasks (`trainer.groups.paired_ci95`; the trainer
    scores the same tasks with the same sampling seeds each time); empty unless both carry
    their tasks' outcomes (`solved`)."""
    if len(series) < 2:
        return {}
    first, last = series[0].get("solved"), series[-1].get("solved")
    if not first or not last or len(first) != len(last):
        return {}
    before, after = [int(c) for c in first], [int(c) for c in last]
    low, high = paired_ci95(before, after)
    gain = (sum(after) - sum(before)) / len(before)
    return {"gain": round(gain, 4), "gain_ci95": [round(low, 4), round(high, 4)]}


def gain_text(learning: dict[str, Any]) -> str:
    """The course of the run (the trainer's checks, `heldout_gain`) in words, or ""."""
    if "checks_gain" not in learning:
        return ""
    low, high = learning["checks_gain_ci95"]
    return (
        f"during the run ({learning['checks_tasks']} tasks, 1 sample): "
        f"{learning['checks_first_solve_rate']:.3f} -> {learning['checks_last_solve_rate']:.3f}, "
        f"{learning['checks_gain']:+.3f} (95% {low:+.3f} to {high:+.3f})"
    )


def learning(
    out: Path, nodes: list[NodeProc], final: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The trainer's held-out evaluations (one at the start, one per published version),
    summarised with the gain (`heldout_gain`), the closing evaluation `final` as given,
    and `learning.png`."""
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    series = (trainer.status.get("role_status", {}).get("learning") or []) if trainer else []
    summary: dict[str, Any] = {"series": series}
    if final is not None:
        summary["final"] = final
    if series:
        # the trainer's checks during the run; the closing evaluation is `final`
        summary.update(
            checks_first_solve_rate=series[0]["solve_rate"],
            checks_last_solve_rate=series[-1]["solve_rate"],
            checks_last_version=series[-1]["version"],
            checks_tasks=trainer_eval_tasks(),
            **{f"checks_{k}": v for k, v in heldout_gain(series).items()},
        )
    try:
        import matplotlib  # deferred: heavy import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: heavy import
    except ImportError:
        return summary
    if not series:
        return summary
    from matplotlib.ticker import MaxNLocator  # deferred: heavy import

    closing = final is not None and "gain" in final
    fig, axes = plt.subplots(
        1,
        3 if closing else 2,
        figsize=(15 if closing else 10, 4),
        gridspec_kw={"width_ratios": [2, 2, 1]} if closing else None,
    )
    a1, a2 = axes[0], axes[1]
    versions = [p["version"] for p in series]
    ts = [p["t"] for p in series]
    rates = [p["solve_rate"] for p in series]
    rewards = [p["reward_mean"] if p["reward_mean"] is not None else float("nan") for p in series]
    half = [solve_rate_ci95(r, summary["checks_tasks"]) for r in rates]
    summary["solve_rate_ci95"] = [
        [round(r - h, 4), round(r + h, 4)] for r, h in zip(rates, half, strict=True)
    ]
    shown = [
        v
        for v in (
            *(r - h for r, h in zip(rates, half, strict=True)),
            *(r + h for r, h in zip(rates, half, strict=True)),
            *(x for x in rewards if x == x),
        )
        if v == v
    ]
    low, high = max(0.0, min(shown) - 0.05), min(1.0, max(shown) + 0.05)
    for ax, x, label in (
        (a1, versions, "policy version"),
        (a2, ts, "seconds since the trainer started"),
    ):
        ax.errorbar(
            x,
            rates,
            yerr=half,
            fmt="o-",
            capsize=3,
            label=f"held-out solve rate (95% interval, {summary['checks_tasks']} tasks)",
        )
        ax.plot(x, rewards, "s--", label="mean reward (last training batch)")
        ax.axhline(
            series[0]["solve_rate"], color="grey", linestyle=":", label="warm-start solve rate"
        )
        ax.set_xlabel(label)
        ax.set_ylabel("solve rate / reward")
        ax.set_ylim(low, high)
        ax.legend(fontsize=8)
    a1.xaxis.set_major_locator(MaxNLocator(integer=True))
    a1.set_title("devnet learning")
    if closing and final is not None:
        _closing_panel(axes[2], final)
    if closing and final is not None:  # the headline: the closing, paired 512-task result
        fig.suptitle(final_text(final), fontsize=11, fontweight="bold")
        a1.set_title(f"devnet learning: {gain_text(summary)}", fontsize=8)
    elif "checks_gain" in summary:
        fig.suptitle(gain_text(summary), fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=100)
    plt.close(fig)
    summary["plot"] = "learning.png"
    return summary


def _closing_panel(ax: Any, final: dict[str, Any]) -> None:
    """The closing evaluation: the warm start and the last version side by side, each
    with its 95% interval, the gain's paired interval in the title."""
    rates = [final["warm_start_solve_rate"], final["final_solve_rate"]]
    n = final["tasks"] * final["samples_per_task"]
    half = [solve_rate_ci95(r, n) for r in rates]
    ax.bar([0, 1], rates, yerr=half, capsize=6, color=["grey", "tab:blue"])
    ax.set_xticks([0, 1], ["warm start", f"version {final['version']}"])
    ax.set_ylabel("held-out solve rate")
    ax.set_ylim(max(0.0, min(rates) - max(half) - 0.05), min(1.0, max(rates) + max(half) + 0.05))
    low, high = final["gain_ci95"]
    ax.set_title(
        f"after the stop: {final['tasks']} tasks x {final['samples_per_task']} samples\n"
        f"gain {final['gain']:+.3f} (95% {low:+.3f} to {high:+.3f})",
        fontsize=9,
    )


def trainer_eval_tasks() -> int:
    """How many held-out tasks the trainer's learning evaluation scores
    (`node.roles.trainer`)."""
    from node.roles.trainer import LEARN_EVAL_TASKS  # deferred: heavy import

    return LEARN_EVAL_TASKS


def write_report(
    root: Path,
    head: dict[str, Any],
    nodes: list[NodeProc],
    series: list[dict[str, Any]],
    final: dict[str, Any],
) -> dict[str, Any]:
    """`head` (parameters, how and when the run stopped) followed by the totals, the
    nodes, the time series, the versions, the learning (with the closing evaluation
    `final`, `devnet_evaluation.final_evaluation`) and the plots, written to
    `root/report.json` with the plots beside it; returns the report."""
    totals = node_totals(nodes)
    report = {
        **head,
        "totals": totals,
        # delivered / (produced - too stale): the definition of `bench churn`
        "delivery_to_trainer": (
            round(totals["trainer_bodies"] / (totals["produced"] - totals["too_stale"]), 4)
            if totals["produced"] > totals["too_stale"]
            else None
        ),
        "nodes": [
            {
                "name": n.name,
                "role": n.role,
                "peer_id": n.peer_id,
                "exit_code": n.exit_code,
                "log": str(n.log.relative_to(root)),
                "status": n.status,
            }
            for n in nodes
        ],
        "series": series,
        "versions": version_spread(nodes),
        "penalties": penalties(nodes),
        "fates": rollout_fates(nodes, totals["produced"]),
    }
    report["plots"] = _plots(root, series, nodes)
    report["learning"] = learning(root, nodes, final)
    if "plot" in report["learning"]:
        report["plots"].append(report["learning"]["plot"])
    (root / "report.json").write_text(json.dumps(report, indent=2))
    return report


MAX_PENALTY_LINES = 100_000  # ledger lines read per node


def penalties(nodes: list[NodeProc]) -> list[dict[str, Any]]:
    """Every penalty a node's admission or role charged (its store's ledger: charges only),
    grouped by (node, peer charged, reason), with the peer named when it is one of ours
    (`honest`: every devnet node is) and the first line's detail."""
    names = {n.peer_id: n.name for n in nodes if n.peer_id}
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for n in nodes:
        path = n.dir / "data" / DB_FILENAME
        if not path.is_file():
            continue
        try:
            with Store(path) as store:
                lines = store.ledger(direction="in", outcome="rejected", limit=MAX_PENALTY_LINES)
        except StoreError:
            continue
        for e in lines:
            peer = peer_text(e.peer) if e.peer is not None else "-"
            key = (n.name, peer, e.reason or "-")
            g = groups.setdefault(
                key,
                {
                    "by": n.name,
                    "peer": names.get(peer, peer),
                    "honest": peer in names,
                    "reason": e.reason or "-",
                    "kind": e.kind,
                    "count": 0,
                    "detail": e.detail,
                },
            )
            g["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["count"], g["by"], g["peer"]))


def penalty_lines(found: list[dict[str, Any]]) -> list[str]:
    """The penalties in a few lines: how many against our own (honest) nodes, then each."""
    honest = sum(g["count"] for g in found if g["honest"])
    out = [
        f"devnet: penalties: {sum(g['count'] for g in found)} charged, {honest} of them "
        "against the devnet's own (honest) nodes"
    ]
    out += [
        f"devnet:   {g['by']} charged {g['peer']} {g['count']}x {g['reason']} ({g['kind']}: "
        f"{g['detail']})"
        for g in found[:20]
    ]
    return out


def audit_line(totals: dict[str, Any]) -> str:
    """The audit backlog in one line (see `audit_backlog`)."""
    capacity = totals.get("audit_queue_capacity", 0)
    return (
        f"devnet: audits: {totals.get('audits_sampled', 0)} rollouts sampled, "
        f"{totals['audits_passed'] + totals['audits_failed']} audited, "
        f"{totals.get('audit_queued', 0)} still queued when the swarm stopped"
        f"{f' (queue bound {capacity})' if capacity else ''}, "
        f"{totals.get('audit_dropped_full', 0)} dropped unaudited as the queue was full, "
        f"{totals.get('audit_dropped_stale', 0)} as too stale for the trainer"
    )


def fates_line(fates: dict[str, Any]) -> str:
    """What became of the produced rollouts in one line (`rollout_fates`)."""
    if "error" in fates or not fates.get("produced"):
        return (
            f"devnet: rollout fates: {fates.get('counts')} ({fates.get('error', 'none produced')})"
        )
    return "devnet: of {} rollouts produced: {}".format(
        fates["produced"],
        ", ".join(f"{n} {k} ({fates[k]:.0%})" for k, n in fates["counts"].items()),
    )


def versions_line(versions: list[dict[str, Any]]) -> str:
    """The versions published and how fast they reached the workers, in one line (each
    version's spread stays in report.json, `versions`)."""
    if not versions:
        return "devnet: no policy version published"
    spreads = sorted(v["spread_s"] for v in versions if v["spread_s"] is not None)
    late = len(versions) - len(spreads)
    reach = (
        f"the workers generated with each within {spreads[len(spreads) // 2]:g} s of its "
        f"publication (median), {spreads[-1]:g} s at most"
        if spreads
        else "none reached every worker"
    )
    tail = f"; {late} not yet at every worker at the stop" if late else ""
    return f"devnet: {len(versions)} versions published; {reach}{tail}"


MAX_SUMMARY_LINES = 10


def summary_lines(report: dict[str, Any], nodes: list[NodeProc], root: Path) -> list[str]:
    """The closing lines (at most MAX_SUMMARY_LINES): what became of the rollouts, the
    audits, the learning (the closing paired evaluation first), penalties, versions, nodes
    that did not stop cleanly, and where the report is."""
    learned = report.get("learning", {})
    lines = [fates_line(report.get("fates", {})), audit_line(report["totals"])]
    if "final" in learned:
        lines.append(f"devnet: {final_text(learned['final'])}")
    if gain_text(learned):
        lines.append(f"devnet: {gain_text(learned)}")
    found = report.get("penalties", [])
    lines += penalty_lines(found)[:1]
    honest = [g for g in found if g["honest"]]
    if honest:
        lines.append(penalty_lines(honest)[1])
    lines.append(versions_line(report["versions"]))
    bad = [n.name for n in nodes if n.exit_code not in (0, None)]
    if bad:
        lines.append(f"devnet: nodes that did not stop cleanly: {', '.join(bad)} (see their logs)")
    plots = ", ".join(report.get("plots", []))
    lines.append(f"devnet: report in {root} (report.json{'; ' + plots if plots else ''})")
    return lines[:MAX_SUMMARY_LINES]


def say_summary(console: Any, report: dict[str, Any], nodes: list[NodeProc], root: Path) -> None:
    """Print `summary_lines`."""
    for line in summary_lines(report, nodes, root):
        console.print(line)
