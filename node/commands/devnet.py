"""`swarm-node devnet`: a local swarm of real node processes on loopback.

By default: one trainer (also the bootstrap peer), three inference workers and one
validator, on the built-in tiny policy and task mix (built on first use, cached); the
trainer trains and publishes policy versions. Each node is a separate `swarm-node start` process with its own key
and data directory under the report directory; they find each other through the trainer
and peer exchange. Workers generate 16 rollouts a batch (4 groups; at 4 a batch
they made a third as many on 2 cores) and the validator audits all of them, newest policy
version first (a group trains only when its members are verified). The terminal shows live progress (rich); after `--duration` seconds, or
on Ctrl-C or SIGTERM (once or twice), every process gets SIGTERM (then SIGKILL after a
grace period, at once on a second signal), the report of what ran is written and the exit
status is 128 + the signal's number; a node whose devnet dies anyway gets SIGTERM from the
kernel (Linux). The report directory receives:

    report.json      parameters, per-node final status, totals, time series
    progress.png     rollouts produced / received by the trainer / verified over time
    workers.png      per-worker rollouts and validator verdicts
    learning.png     the trainer's held-out solve rate and mean reward against policy
                     version and time, the warm-start level marked (`learning` in report.json)
    nodes/<name>/    each node's key, data directory (SQLite store) and log
    run.toml         the run manifest every node joined
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.errors import CommandError
from protocol.identity import Identity

DEFAULT_DURATION_S = 300.0
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
INFERENCE_NICE = 5
DRAIN_S = 30.0


@dataclass
class NodeProc:
    name: str
    role: str
    dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    peer_id: str = ""
    addr: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None

    def read_status(self) -> None:
        try:
            self.status = json.loads((self.dir / "data" / "status.json").read_text())
        except (OSError, ValueError):
            pass

    def banner(self) -> tuple[str, str]:
        """(peer id, first listen address) from the node's start-up lines, if printed yet."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "", ""
        peer = addr = ""
        for line in text.splitlines():
            if line.startswith("swarm-node: peer "):
                peer = line.split()[-1]
            elif line.strip().startswith("listening on ") and not addr:
                addr = line.strip().split()[-1]
        return peer, addr


def _node_key(root: Path, name: str) -> Identity:
    """The node's key file under `root/nodes/<name>/node.key`, made on first use."""
    from node.keyfile import read_key, write_key

    d = root / "nodes" / name
    d.mkdir(parents=True, exist_ok=True)
    key = d / "node.key"
    if not key.exists():
        write_key(key, Identity.generate())
    return read_key(key)


_PR_SET_PDEATHSIG = 1


def _child_setup(nice: int, parent: int) -> Any:
    """The function a node process runs between fork and exec: a lower CPU priority for
    workers, and (Linux) SIGTERM to the node when the devnet process dies, however it
    dies, so that no node outlives its devnet."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def setup() -> None:
        if nice:
            os.nice(nice)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the devnet died before the request took effect
                os._exit(1)

    return setup


@dataclass
class _Signals:
    """SIGINT / SIGTERM received by the devnet. The first one raises KeyboardInterrupt
    (unless the devnet is already stopping); every later one is only counted, and makes
    the stop SIGKILL what is still running instead of waiting the grace period."""

    received: list[int] = field(default_factory=list)
    stopping: bool = False

    def handler(self, signum: int, _frame: Any) -> None:
        self.received.append(signum)
        if len(self.received) == 1 and not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt

    def hurry(self) -> bool:
        return len(self.received) >= 2


def _spawn(name: str, role: str, root: Path, run: Path, extra: list[str]) -> NodeProc:
    d = root / "nodes" / name
    _node_key(root, name)
    key = d / "node.key"
    log = d / "node.log"
    cmd = [
        sys.executable, "-m", "node.cli", "start", "--role", role, "--run", str(run),
        "--key", str(key), "--data-dir", str(d / "data"), "--listen", "/ip4/127.0.0.1/tcp/0",
        *extra,
    ]
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it; closed when we exit
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # Workers generate flat out; on one machine they would starve the trainer and validator
    # (on separate machines they do not), so they run at a lower CPU priority.
    nice = INFERENCE_NICE if role == "inference" else 0
    # Each node runs in its own session: a Ctrl-C in the terminal reaches only the devnet,
    # which stops the nodes in order and writes the report.
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=_child_setup(nice, os.getpid()))  # noqa: PLW1509
    fh.close()
    return NodeProc(name, role, d, proc, log)


def _wait_banner(node: NodeProc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node.peer_id, node.addr = node.banner()
        if node.addr:
            return
        if node.proc.poll() is not None:
            tail = node.log.read_text(errors="replace")[-800:]
            raise CommandError(f"{node.name} exited with {node.proc.returncode} at start-up: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}")
        time.sleep(0.2)
    raise CommandError(f"{node.name} did not start listening within {timeout:g} s (log: {node.log})")


def _stop_all(nodes: list[NodeProc], hurry: Any = lambda: False) -> None:
    """SIGTERM everyone, wait up to STOP_GRACE_S (or until `hurry()` says so), then
    SIGKILL the rest."""
    for n in nodes:
        if n.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                n.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and not hurry() and any(n.proc.poll() is None for n in nodes):
        time.sleep(0.1)
    for n in nodes:
        if n.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                n.proc.kill()
        n.exit_code = n.proc.wait(timeout=5)


def _totals(nodes: list[NodeProc]) -> dict[str, Any]:
    produced = sum(n.status.get("role_status", {}).get("produced", 0) for n in nodes if n.role == "inference")
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    tstat = trainer.status.get("role_status", {}) if trainer else {}
    validators = [n.status.get("role_status", {}) for n in nodes if n.role == "validator"]
    inference_rewards = [
        (n.status.get("role_status", {}).get("reward_mean"), n.status.get("role_status", {}).get("produced", 0))
        for n in nodes if n.role == "inference"
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
        "trainer_bodies": (trainer.status.get("counters", {}).get("stored_rollout_record", 0)
                           if trainer else 0),
        "trainer_verified": tstat.get("verified", 0),
        "trainer_rejected": tstat.get("rejected", 0),
        "trainer_usable": tstat.get("usable_at_version", 0),
        "audited": sum(v.get("passed", 0) + v.get("failed", 0) for v in validators),
        "audits_passed": sum(v.get("passed", 0) for v in validators),
        "audits_failed": sum(v.get("failed", 0) for v in validators),
        "reward_mean": round(sum(a for a, _ in weighted) / sum(k for _, k in weighted), 4) if weighted else None,
        "peers_min": min((n.status.get("peers", 0) for n in nodes), default=0),
    }


def _table(nodes: list[NodeProc], elapsed: float, duration: float) -> Any:
    from rich.table import Table

    t = Table(title=f"swarm-node devnet  {elapsed:4.0f}/{duration:.0f} s  (Ctrl-C stops)", expand=False)
    for col in ("node", "peer", "peers", "work", "headers", "bodies", "state"):
        t.add_column(col, no_wrap=True)
    for n in nodes:
        s = n.status
        rs = s.get("role_status", {})
        if n.role == "inference":
            work = f"{rs.get('produced', 0)} made r={rs.get('reward_mean', 0) or 0:.2f}"
        elif n.role == "validator":
            work = f"{rs.get('passed', 0)} ok {rs.get('failed', 0)} bad /{rs.get('sampled', 0)}"
        elif n.role == "trainer":
            work = f"{rs.get('verified', 0)} verified"
        else:
            work = f"{rs.get('served', 0)} served"
        counters = s.get("counters", {})
        alive = n.proc.poll() is None
        state = ("up" if s else "loading") if alive else f"exit {n.proc.returncode}"
        t.add_row(
            n.name, (n.peer_id or "")[-6:], str(s.get("peers", "-")), work,
            str(counters.get("stored_rollout_header", 0)),
            str(counters.get("stored_rollout_record", 0)), state,
        )
    totals = _totals(nodes)
    t.caption = (
        f"{totals['produced']} produced, {totals['trainer_bodies']} at trainer, "
        f"{totals['audits_passed']}/{totals['audited']} audits passed"
    )
    return t


def _drain(nodes: list[NodeProc], console: Any) -> float:
    """Tell the workers to stop producing (SIGUSR1: they keep serving bodies and syncing
    weights), then give the swarm up to DRAIN_S to account every rollout: the trainer
    fetches what was announced, and a worker that catches up with the trainer's newest
    version learns which of its rollouts the trainer refused as too stale. Stops early
    when every worker has nothing pending, or when nothing moves for 5 s; returns the
    seconds spent (everyone is stopped afterwards)."""
    from node.peer_services import DELIVERY_CHECK_S

    workers = [n for n in nodes if n.role == "inference"]
    for n in workers:
        if n.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                n.proc.send_signal(signal.SIGUSR1)
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    started = time.monotonic()
    if trainer is None:
        return 0.0
    console.print(f"devnet: workers paused; letting the trainer catch up (up to {DRAIN_S:g} s) ...")
    last: tuple[Any, ...] = ()
    still = time.monotonic()
    while time.monotonic() - started < DRAIN_S and trainer.proc.poll() is None:
        for n in (trainer, *workers):
            n.read_status()
        pending = [n.status.get("delivery", {}).get("pending") for n in workers if n.proc.poll() is None]
        # (a worker accounts its delivery every DELIVERY_CHECK_S: wait for one after the pause)
        settled = time.monotonic() - started > DELIVERY_CHECK_S + 1.0
        if settled and pending and all(p == 0 for p in pending):
            break
        progress = (
            trainer.status.get("counters", {}).get("stored_rollout_record", 0),
            *(n.status.get("policy_version") for n in workers),
            *pending,
        )
        if progress != last:
            last, still = progress, time.monotonic()
        elif time.monotonic() - still > 5.0:
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def _plots(out: Path, series: list[dict[str, Any]], nodes: list[NodeProc]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if series:
        fig, ax = plt.subplots(figsize=(7, 4))
        ts = [p["t"] for p in series]
        for key, label in (("produced", "produced (workers)"), ("trainer_bodies", "received by trainer"),
                           ("audited", "audited (validators)"), ("trainer_verified", "verified at trainer")):
            ax.plot(ts, [p[key] for p in series], label=label)
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

    names, (made,) = figures("inference", "produced")
    if names:
        panels.append(("workers", names, "node", [("produced", made, None)], "rollouts"))
    names, (passed, failed) = figures("validator", "passed", "failed")
    if names:
        panels.append(("validators", names, "node",
                       [("passed", passed, None), ("failed", failed, passed)], "audits"))
    trainer = [n for n in nodes if n.role == "trainer"]
    if trainer:
        t = trainer[0]
        got = t.status.get("counters", {}).get("stored_rollout_record", 0)
        verified = t.status.get("role_status", {}).get("verified", 0) or 0
        panels.append(("trainer", ["received", "verified"], t.name,
                       [("rollouts", [got, verified], None)], "rollouts"))
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
        out.append({
            "version": int(v),
            "published_at": t,
            "workers_reached": len(reached),
            "workers": len(workers),
            "per_worker_s": reached,
            "spread_s": max(reached.values()) if len(reached) == len(workers) and reached else None,
        })
    return out


def version_line(v: dict[str, Any], stopped_at: float) -> str:
    """One summary line for an entry of `version_spread`."""
    head = f"devnet: version {v['version']}: "
    if v["spread_s"] is not None:
        return f"{head}all {v['workers']} workers generating with it within {v['spread_s']:g} s of its publication"
    before = max(0.0, stopped_at - v["published_at"])
    return (f"{head}{v['workers_reached']}/{v['workers']} workers generating with it when the "
            f"swarm stopped, {before:.0f} s after its publication")


def solve_rate_ci95(rate: float, tasks: int) -> float:
    """Half-width of the normal-approximation 95% interval of a solve rate over `tasks`."""
    return 1.96 * math.sqrt(max(rate * (1 - rate), 0.25 / tasks) / tasks) if tasks > 0 else 0.0


def _learning(out: Path, nodes: list[NodeProc]) -> dict[str, Any]:
    """The trainer's held-out evaluations (one at the start, one per published version),
    summarised, and `learning.png`."""
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    series = (trainer.status.get("role_status", {}).get("learning") or []) if trainer else []
    summary: dict[str, Any] = {"series": series}
    if series:
        summary.update(
            warm_start_solve_rate=series[0]["solve_rate"], final_solve_rate=series[-1]["solve_rate"],
            final_version=series[-1]["version"], heldout_tasks=trainer_eval_tasks(),
        )  # fmt: skip
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return summary
    if not series:
        return summary
    from matplotlib.ticker import MaxNLocator

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    versions = [p["version"] for p in series]
    ts = [p["t"] for p in series]
    rates = [p["solve_rate"] for p in series]
    rewards = [p["reward_mean"] if p["reward_mean"] is not None else float("nan") for p in series]
    half = [solve_rate_ci95(r, summary["heldout_tasks"]) for r in rates]
    summary["solve_rate_ci95"] = [[round(r - h, 4), round(r + h, 4)] for r, h in zip(rates, half, strict=True)]
    shown = [v for v in (*(r - h for r, h in zip(rates, half, strict=True)),
                         *(r + h for r, h in zip(rates, half, strict=True)),
                         *(x for x in rewards if x == x)) if v == v]  # fmt: skip
    low, high = max(0.0, min(shown) - 0.05), min(1.0, max(shown) + 0.05)
    for ax, x, label in ((a1, versions, "policy version"), (a2, ts, "seconds since the trainer started")):
        ax.errorbar(x, rates, yerr=half, fmt="o-", capsize=3,
                    label=f"held-out solve rate (95% interval, {summary['heldout_tasks']} tasks)")
        ax.plot(x, rewards, "s--", label="mean reward (last training batch)")
        ax.axhline(series[0]["solve_rate"], color="grey", linestyle=":", label="warm-start solve rate")
        ax.set_xlabel(label)
        ax.set_ylabel("solve rate / reward")
        ax.set_ylim(low, high)
        ax.legend(fontsize=8)
    a1.xaxis.set_major_locator(MaxNLocator(integer=True))
    a1.set_title("devnet learning")
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=100)
    plt.close(fig)
    summary["plot"] = "learning.png"
    return summary


def trainer_eval_tasks() -> int:
    from node.roles.trainer import LEARN_EVAL_TASKS

    return LEARN_EVAL_TASKS


def main(
    *,
    inference: int = 3,
    validators: int = 1,
    trainers: int = 1,
    relays: int = 0,
    duration: float = DEFAULT_DURATION_S,
    out: Path | str | None = None,
    run: Path | str | None = None,
    audit_fraction: float = 1.0,
    batch_size: int = 16,
    live: bool = True,
    publish_every: float = 0.0,
) -> dict[str, Any]:
    """Run the devnet; returns (and writes) the report dict."""
    from rich.console import Console
    from rich.live import Live

    if not 1 <= inference <= 16 or not 0 <= validators <= 8 or not 1 <= trainers <= 1 or not 0 <= relays <= 8:
        raise CommandError("devnet: --inference 1..16, --validators 0..8, --trainers 1, --relays 0..8")
    if not 5 <= duration <= 24 * 3600:
        raise CommandError(f"--duration must be in [5, 86400] seconds, got {duration}")
    from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
    from trainer import tiny_policy

    console = Console(stderr=True)
    live = live and console.is_terminal  # a pipe or a file gets plain progress lines
    console.soft_wrap = not console.is_terminal  # ... unwrapped: one line each
    # Everything local first: the run file, then the report directory.
    if run is not None:
        manifest = load_run_manifest(Path(run))
        run_text = Path(run).read_text()
    root = Path(out) if out else Path.cwd() / "devnet-reports" / time.strftime("%Y%m%d-%H%M%S")
    if run is None:
        manifest = manifest_from_table(tiny_policy.run_manifest_table("devnet"))
    if validators and not manifest.validator_keys:
        # Only the manifest's validator keys may judge: make the validators' keys first
        # and name them in the devnet's copy of the run.
        try:
            keys = tuple(_node_key(root, f"validator{i + 1}").peer_id for i in range(validators))
        except OSError as exc:
            raise CommandError(f"--out {root}: cannot write the report directory ({exc.strerror or exc})") from None
        manifest = dataclasses.replace(manifest, validator_keys=keys)
        run_text = manifest_to_toml(manifest)
    elif run is None:
        run_text = manifest_to_toml(manifest)
    # The trainer publishes versions (trained, or perturbed in the --publish-every drill):
    # its key must be one of the run's trainer keys.
    tkey = _node_key(root, "trainer").peer_id
    if tkey not in manifest.trainer_keys:
        manifest = dataclasses.replace(manifest, trainer_keys=(*manifest.trainer_keys, tkey))
        run_text = manifest_to_toml(manifest)
    run_path = root / "run.toml"
    try:
        root.mkdir(parents=True, exist_ok=True)
        run_path.write_text(run_text)
    except OSError as exc:
        raise CommandError(f"--out {root}: cannot write the report directory ({exc.strerror or exc})") from None
    if manifest.model.startswith("builtin:"):
        console.print("devnet: preparing the built-in policy (first run builds and caches it) ...")
        path, _report, built = tiny_policy.ensure_policy(progress=lambda m: console.print(f"  {m}"))
        console.print(f"devnet: policy {'built' if built else 'cached'} at {path}")

    common = ["--duration", str(duration + 60)]  # the nodes' own bound, past ours
    nodes: list[NodeProc] = []
    series: list[dict[str, Any]] = []
    interrupted = False
    drained_s = 0.0
    started = time.monotonic()
    # SIGTERM (`timeout`, a service manager) stops the devnet as Ctrl-C does: the nodes are
    # stopped and the report of what ran is written; a second signal only hurries the stop.
    signals = _Signals()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, signals.handler)
    try:
        pub = ["--publish-every", str(publish_every)] if publish_every > 0 else []
        boot = _spawn("trainer", "trainer", root, run_path, [*common, *pub])
        nodes.append(boot)
        _wait_banner(boot, START_TIMEOUT_S)
        extra = [*common, "--bootstrap", f"{boot.addr}"]
        for i in range(validators):
            nodes.append(_spawn(f"validator{i + 1}", "validator", root, run_path,
                                [*extra, "--audit-fraction", str(audit_fraction), "--batch-size", str(batch_size)]))
        for i in range(relays):
            nodes.append(_spawn(f"relay{i + 1}", "relay", root, run_path, extra))
        for i in range(inference):
            nodes.append(_spawn(f"worker{i + 1}", "inference", root, run_path,
                                [*extra, "--batch-size", str(batch_size)]))
        for n in nodes[1:]:
            _wait_banner(n, START_TIMEOUT_S)
        started = time.monotonic()
        with (Live(_table(nodes, 0, duration), console=console, refresh_per_second=2,
                   transient=False) if live else contextlib.nullcontext()) as view:
            last_sample = -10.0
            last_line = 0.0
            while (elapsed := time.monotonic() - started) < duration:
                for n in nodes:
                    n.read_status()
                if elapsed - last_sample >= 2.0:
                    last_sample = elapsed
                    series.append({"t": round(elapsed, 1), **_totals(nodes)})
                if live:
                    view.update(_table(nodes, elapsed, duration))
                elif elapsed - last_line >= 10.0:
                    last_line = elapsed
                    t = _totals(nodes)
                    console.print(
                        f"devnet {elapsed:4.0f}/{duration:.0f} s: {t['produced']} produced, "
                        f"{t['trainer_bodies']} at trainer, {t['audits_passed']}/{t['audited']} audits "
                        f"passed, {t['trainer_verified']} verified, min peers {t['peers_min']}"
                    )
                if all(n.proc.poll() is not None for n in nodes):
                    break
                time.sleep(0.5)
        drain_at = round(time.monotonic() - started, 1)
        drained_s = _drain(nodes, console)
        for n in nodes:
            n.read_status()
        # the plot shows the drain and ends on the final totals
        series.append({"t": drain_at, **_totals(nodes), "phase": "drain"})
        series.append({"t": round(time.monotonic() - started, 1), **_totals(nodes), "phase": "drain"})
    except KeyboardInterrupt:
        interrupted = True
        name = signal.Signals(signals.received[0]).name if signals.received else "SIGINT"
        console.print(f"devnet: {name}: stopping every node, then writing the report ...")
    finally:
        signals.stopping = True
        _stop_all(nodes, signals.hurry)
    for n in nodes:
        n.read_status()
    stopped_at = time.time()
    totals = _totals(nodes)
    report = {
        "parameters": {
            "inference": inference, "validators": validators, "trainers": trainers, "relays": relays,
            "duration_s": duration, "audit_fraction": audit_fraction, "batch_size": batch_size,
            "run_id": manifest.run_id, "model": manifest.model, "policy_version": 0,
        },
        "interrupted": interrupted,
        "stopped_by": signal.Signals(signals.received[0]).name if signals.received else None,
        "elapsed_s": round(time.monotonic() - started, 1),
        "drain_s": drained_s,
        "totals": totals,
        # delivered / (produced - too stale): the definition of `bench churn`
        "delivery_to_trainer": (
            round(totals["trainer_bodies"] / (totals["produced"] - totals["too_stale"]), 4)
            if totals["produced"] > totals["too_stale"] else None
        ),
        "nodes": [
            {"name": n.name, "role": n.role, "peer_id": n.peer_id, "exit_code": n.exit_code,
             "log": str(n.log.relative_to(root)), "status": n.status}
            for n in nodes
        ],
        "series": series,
        "versions": version_spread(nodes),
    }
    report["plots"] = _plots(root, series, nodes)
    report["learning"] = _learning(root, nodes)
    if "plot" in report["learning"]:
        report["plots"].append(report["learning"]["plot"])
    (root / "report.json").write_text(json.dumps(report, indent=2))
    console.print(
        f"devnet: {totals['produced']} rollouts produced, {totals['trainer_bodies']} at the trainer, "
        f"{totals['audits_passed']} audits passed / {totals['audits_failed']} failed; report in {root}"
    )
    sampled = sum(n.status.get("role_status", {}).get("sampled", 0) for n in nodes if n.role == "validator")
    audited = totals["audits_passed"] + totals["audits_failed"]
    console.print(
        f"devnet: audits: {sampled} rollouts sampled, {audited} audited, "
        f"{max(0, sampled - audited)} still queued when the swarm stopped; the trainer counted "
        f"{totals['trainer_verified']} verified ({max(0, totals['audits_passed'] - totals['trainer_verified'])}"
        f" passing verdicts it had not counted when it stopped: in flight, or about rollouts "
        f"it did not hold); {totals['too_stale']} rollouts reached it too stale to use"
    )
    bad = [n.name for n in nodes if n.exit_code not in (0, None)]
    for v in report["versions"]:
        console.print(version_line(v, stopped_at))
    if bad:
        console.print(f"devnet: nodes that did not stop cleanly: {', '.join(bad)} (see their logs)")
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return report
