"""`swarm-node devnet`: a local swarm of real node processes on loopback.

By default: one trainer (also the bootstrap peer), three inference workers and one
validator, on the built-in tiny policy and task mix (built on first use, cached); the
trainer trains and publishes policy versions. Each node is a separate `swarm-node start` process with its own key
and data directory under the report directory; they find each other through the trainer
and peer exchange. Workers generate 16 rollouts a batch (4 groups; at 4 a batch
they made a third as many on 2 cores) and the validator audits the node's default share
of them (`--audit-fraction`, 0.25; every record of a worker on probation) from a bounded
queue, newest policy version first; the trainer trains verified rollouts and, from workers in
good standing, unaudited ones after a hold (`protocol.standing`); the report shows the audit
backlog and every penalty charged. The terminal shows live progress (rich); after `--duration` seconds, or
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
    run.toml         the run manifest every node joined, signed by the devnet's run authority
    authority.key    that authority's key (`swarm-node run sign` it again after editing run.toml)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.cli_errors import one_line_errors
from node.commands.calibrate import ensure_calibration
from node.commands.devnet_evaluation import FINAL_EVAL_TASKS, final_evaluation
from node.commands.devnet_nodes import NodeProc
from node.commands.devnet_report import node_totals, say_summary, write_report
from node.commands.run_sign import without_release
from node.errors import CommandError
from node.keyfile import read_key, write_key
from node.model_fetch import read_bundle_files
from node.paths import resolve_model
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml, release_to_toml
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.model_bundle import encode_bundle
from protocol.run_manifest import seal_release
from protocol.standing import HOLD_S
from trainer import tiny_policy
from trainer.checkpoint import from_model_dir

DEFAULT_DURATION_S = 300.0
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
# A node that said it is stopping but is still inside model work it cannot interrupt
# (loading a model, its first evaluation: seconds to minutes on a busy machine) stops by
# itself once that returns: it is given this long before it is killed.
STOPPING_GRACE_S = 180.0
INFERENCE_NICE = 5
DRAIN_S = 30.0
# Workers together make this many times what the trainer trains per version (`--pace`):
# a little over 1 covers groups that never complete and records an audit rejects.
DEFAULT_PACE = 1.1


def _node_key(root: Path, name: str) -> Identity:
    """The node's key file under `root/nodes/<name>/node.key`, made on first use."""
    d = root / "nodes" / name
    d.mkdir(parents=True, exist_ok=True)
    key = d / "node.key"
    if not key.exists():
        write_key(key, Identity.generate())
    return read_key(key)


_PR_SET_PDEATHSIG = 1


def _child_setup(nice: int, parent: int) -> Any:
    """The function a node process runs between fork and exec: a lower CPU priority for
    workers, (Linux) SIGTERM to the node when the devnet process dies, however it dies, so
    that no node outlives its devnet, and SIGTERM blocked until `start` can take it (it
    unblocks it once its handler is in place): a stop that comes while the interpreter
    is still importing waits for that, and the node stops cleanly instead of dying."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
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
        """The signal handler: count the signal; the first one interrupts the devnet."""
        self.received.append(signum)
        if len(self.received) == 1 and not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt

    def hurry(self) -> bool:
        """A second signal came: kill what still runs instead of waiting."""
        return len(self.received) >= 2

    def first(self) -> str | None:
        """The name of the first signal received, if any."""
        return signal.Signals(self.received[0]).name if self.received else None

    def install(self) -> dict[int, Any]:
        """`handler` for SIGINT and SIGTERM (in the main thread only); returns the handlers
        it replaced."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self.handler)
        return previous


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the node binds it itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(name: str, role: str, root: Path, run: Path, extra: list[str]) -> NodeProc:
    d = root / "nodes" / name
    page = f"127.0.0.1:{_free_port()}"
    _node_key(root, name)
    key = d / "node.key"
    log = d / "node.log"
    cmd = [
        sys.executable,
        "-m",
        "node.cli",
        "start",
        "--role",
        role,
        "--run",
        str(run),
        "--key",
        str(key),
        "--data-dir",
        str(d / "data"),
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--threads",
        "1",  # several nodes share this machine (the default is all its cores)
        "--metrics",
        page,
        *extra,
    ]
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it; closed when we exit
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # Workers generate flat out; on one machine they would starve the trainer and validator
    # (on separate machines they do not), so they run at a lower CPU priority.
    nice = INFERENCE_NICE if role == "inference" else 0
    # Each node runs in its own session: a Ctrl-C in the terminal reaches only the devnet,
    # which stops the nodes in order and writes the report.
    proc = subprocess.Popen(
        cmd,
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_child_setup(nice, os.getpid()),
    )  # noqa: PLW1509
    fh.close()
    return NodeProc(name, role, d, proc, log, page=f"http://{page}/")


def _wait_banner(node: NodeProc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node.peer_id, node.addr = node.banner()
        if node.addr:
            return
        if node.proc.poll() is not None:
            tail = node.log.read_text(errors="replace")[-800:]
            raise CommandError(
                f"{node.name} exited with {node.proc.returncode} at start-up: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
            )
        time.sleep(0.2)
    raise CommandError(
        f"{node.name} did not start listening within {timeout:g} s (log: {node.log})"
    )


def _stopping(node: NodeProc) -> bool:
    """Whether the node's log says it took the stop signal (and is finishing model work)."""
    try:
        with open(node.log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return False
    return ": stopping" in tail or "stopped before it was running" in tail


def _stop_all(
    nodes: list[NodeProc], hurry: Any = lambda: False, say: Any = lambda _m: None
) -> None:
    """SIGTERM everyone, wait up to STOP_GRACE_S (or until `hurry()` says so), and up to
    STOPPING_GRACE_S for nodes that said they are stopping, then SIGKILL the rest."""
    for n in nodes:
        if n.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                n.proc.send_signal(signal.SIGTERM)
    started, told = time.monotonic(), False
    while not hurry():
        alive = [n for n in nodes if n.proc.poll() is None]
        waited = time.monotonic() - started
        if not alive or waited >= STOPPING_GRACE_S:
            break
        if waited >= STOP_GRACE_S:
            finishing = [n for n in alive if _stopping(n)]
            for n in alive:
                if n not in finishing:  # silent: frozen, or never got that far
                    with contextlib.suppress(ProcessLookupError):
                        n.proc.kill()
            if finishing and not told:
                told = True
                say(
                    f"devnet: {', '.join(n.name for n in finishing)} finishing model work "
                    "before stopping (Ctrl-C again stops them at once)"
                )
        time.sleep(0.1)
    for n in nodes:
        if n.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                n.proc.kill()
        n.exit_code = n.proc.wait(timeout=5)


TABLE_LEGEND = (
    "made: rollouts generated, r: their mean reward; ok/bad: audits passed/failed, "
    "q: waiting for audit; verified/trained: at the trainer; held-out: the trainer's "
    "solve rate on 128 held-out tasks; loading: a node still loading (the first ~40 s)"
)


def _table(nodes: list[NodeProc], elapsed: float, duration: float) -> Any:
    """The live table: one row a node, at most 80 columns, a legend under it."""
    trainer = next((n for n in nodes if n.role == "trainer"), None)
    tstat = trainer.status.get("role_status", {}) if trainer else {}
    learning = tstat.get("learning") or []
    version = trainer.status.get("policy_version", "-") if trainer else "-"
    heldout = f"  held-out {learning[-1]['solve_rate']:.3f}" if learning else ""
    t = Table(
        title=f"devnet {elapsed:4.0f}/{duration:.0f} s  version {version}{heldout}  (Ctrl-C stops)",
        expand=False,
    )
    for col in ("node", "ver", "peers", "work", "state"):
        t.add_column(col, no_wrap=True, overflow="ellipsis", max_width=40)
    for n in nodes:
        s = n.status
        rs = s.get("role_status", {})
        if n.role == "inference":
            work = f"{rs.get('produced', 0)} made  r={rs.get('reward_mean', 0) or 0:.2f}"
        elif n.role == "validator":
            work = f"{rs.get('passed', 0)} ok  {rs.get('failed', 0)} bad  q{rs.get('queued', 0)}"
        elif n.role == "trainer":
            fates = rs.get("fates") or {}
            work = f"{rs.get('verified', 0)} verified  {fates.get('trained', 0)} trained"
        else:
            work = f"{rs.get('served', 0)} served"
        alive = n.proc.poll() is None
        state = ("up" if s else "loading") if alive else f"exit {n.proc.returncode}"
        t.add_row(n.name, str(s.get("policy_version", "-")), str(s.get("peers", "-")), work, state)
    totals = node_totals(nodes)
    t.caption = (
        f"{totals['produced']} made, {totals['trainer_bodies']} at trainer, "
        f"{totals['trained']} trained, {totals['stale']} stale, {totals['refused']} refused\n"
        + TABLE_LEGEND
    )
    return t


def _drain(nodes: list[NodeProc], console: Any) -> float:
    """Tell the workers to stop producing (SIGUSR1: they keep serving bodies and syncing
    weights), then give the swarm up to DRAIN_S to account every rollout: the trainer
    fetches what was announced, and a worker that catches up with the trainer's newest
    version learns which of its rollouts the trainer refused as too stale, and rollouts
    waiting out their hold (`protocol.standing.HOLD_S`) at the trainer train. Stops early
    when every worker has nothing pending and nothing waits at the trainer, or when nothing
    moves for 5 s (for the hold and 5 s while rollouts wait at the trainer); returns the
    seconds spent (everyone is stopped afterwards)."""
    from node.peer.services import DELIVERY_CHECK_S  # deferred: heavy import

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
        pending = [
            n.status.get("delivery", {}).get("pending") for n in workers if n.proc.poll() is None
        ]
        # (a worker accounts its delivery every DELIVERY_CHECK_S: wait for one after the pause)
        settled = time.monotonic() - started > DELIVERY_CHECK_S + 1.0
        waiting = trainer.status.get("role_status", {}).get("waiting", 0)
        if settled and pending and all(p == 0 for p in pending) and not waiting:
            break
        progress = (
            trainer.status.get("counters", {}).get("stored_rollout_record", 0),
            waiting,
            *(n.status.get("policy_version") for n in workers),
            *pending,
        )
        if progress != last:
            last, still = progress, time.monotonic()
        elif time.monotonic() - still > 5.0 + (HOLD_S if waiting else 0.0):
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


@dataclass(frozen=True)
class _Plan:
    """How many nodes of each role, for how long, with which batch and audit settings."""

    inference: int
    validators: int
    trainers: int
    relays: int
    duration: float
    audit_fraction: float
    batch_size: int
    publish_every: float
    pace: float = DEFAULT_PACE
    eval_tasks: int = FINAL_EVAL_TASKS

    def rollouts_per_version(self, manifest: Any) -> int:
        """Each worker's share of what the trainer trains per version, times `pace`
        (0: workers make rollouts flat out)."""
        per_version = manifest.rl_publish_every * manifest.group_size
        return math.ceil(self.pace * per_version / self.inference) if self.pace > 0 else 0

    def check(self) -> None:
        """Refuse a swarm outside the sizes a devnet runs (`CommandError`)."""
        if (
            not 1 <= self.inference <= 16
            or not 0 <= self.validators <= 8
            or not 1 <= self.trainers <= 1
            or not 0 <= self.relays <= 8
        ):
            raise CommandError(
                "devnet: --inference 1..16, --validators 0..8, --trainers 1, --relays 0..8"
            )
        if not 5 <= self.duration <= 24 * 3600:
            raise CommandError(f"--duration must be in [5, 86400] seconds, got {self.duration}")
        if not 0 <= self.pace <= 100:
            raise CommandError(f"--pace must be in [0, 100] (0: no pacing), got {self.pace}")
        if not 0 <= self.eval_tasks <= 100_000:
            raise CommandError(
                f"--eval-tasks must be in [0, 100000] (0: skip), got {self.eval_tasks}"
            )

    def parameters(self, manifest: Any) -> dict[str, Any]:
        """The `parameters` entry of report.json."""
        return {
            "inference": self.inference,
            "validators": self.validators,
            "trainers": self.trainers,
            "relays": self.relays,
            "duration_s": self.duration,
            "audit_fraction": self.audit_fraction,
            "batch_size": self.batch_size,
            "pace": self.pace,
            "eval_tasks": self.eval_tasks,
            "rollouts_per_version": self.rollouts_per_version(manifest),
            "run_id": manifest.run_id,
            "model": manifest.model,
            "policy_version": 0,
        }


@dataclass
class _Swarm:
    """The devnet's node processes and the totals sampled from them; `started` is when
    every node was listening (until then, when the devnet began starting them)."""

    nodes: list[NodeProc] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    drained_s: float = 0.0


def main(
    *,
    inference: int = 3,
    validators: int = 1,
    trainers: int = 1,
    relays: int = 0,
    duration: float = DEFAULT_DURATION_S,
    out: Path | str | None = None,
    run: Path | str | None = None,
    audit_fraction: float = 0.25,
    batch_size: int = 16,
    live: bool = True,
    publish_every: float = 0.0,
    pace: float = DEFAULT_PACE,
    eval_tasks: int = FINAL_EVAL_TASKS,
) -> dict[str, Any]:
    """Run the devnet; returns (and writes) the report dict."""
    plan = _Plan(
        inference,
        validators,
        trainers,
        relays,
        duration,
        audit_fraction,
        batch_size,
        publish_every,
        pace,
        eval_tasks,
    )
    plan.check()
    console = Console(stderr=True)
    live = live and console.is_terminal  # a pipe or a file gets plain progress lines
    console.soft_wrap = not console.is_terminal  # ... unwrapped: one line each
    # Everything local first: the run file, then the report directory.
    root = Path(out) if out else Path.cwd() / "devnet-reports" / time.strftime("%Y%m%d-%H%M%S")
    manifest, run_path = _write_run(run, root, validators)
    _prepare_policy(manifest, console)
    manifest = _pin_model(manifest, run_path, root)
    swarm = _Swarm()
    interrupted = False
    # SIGTERM (`timeout`, a service manager) stops the devnet as Ctrl-C does: the nodes are
    # stopped and the report of what ran is written; a second signal only hurries the stop.
    signals = _Signals()
    previous = signals.install()
    try:
        _start_nodes(swarm, root, run_path, plan, plan.rollouts_per_version(manifest))
        console.print(
            "devnet: status pages (live charts): "
            + ", ".join(f"{n.name} {n.page}" for n in swarm.nodes)
        )
        _watch(swarm, plan.duration, live, console)
        _drain_and_sample(swarm, console)
    except KeyboardInterrupt:
        interrupted = True
        console.print(
            f"devnet: {signals.first() or 'SIGINT'}: stopping every node, then writing the report ..."
        )
    finally:
        signals.stopping = True
        _stop_all(swarm.nodes, signals.hurry, console.print)
    try:
        for n in swarm.nodes:
            n.read_status()
        stopped_at = time.time()
        head = {
            "parameters": plan.parameters(manifest),
            "interrupted": interrupted,
            "stopped_by": signals.first(),
            "stopped_at": stopped_at,
            "elapsed_s": round(time.monotonic() - swarm.started, 1),
            "drain_s": swarm.drained_s,
        }
        trainer = next((n.dir for n in swarm.nodes if n.role == "trainer"), None)
        final = (
            {"skipped": "stopped by a signal"}
            if signals.received
            else final_evaluation(trainer, manifest, plan.eval_tasks, console.print)
        )
        report = write_report(root, head, swarm.nodes, swarm.series, final)
        say_summary(console, report, swarm.nodes, root)
    finally:
        _restore_signals(previous)  # also when the run or its report failed
    return report


def _write_run(run: Path | str | None, root: Path, validators: int) -> tuple[Any, Path]:
    """The run manifest (the file given, or the built-in tiny run) with the devnet's
    validator and trainer keys added where missing, written to `root/run.toml`; returns
    the manifest and that path."""
    if run is not None:
        manifest = load_run_manifest(Path(run))
        run_text = Path(run).read_text()
    else:
        manifest = manifest_from_table(tiny_policy.run_manifest_table("devnet"))
        run_text = manifest_to_toml(manifest)
    # Only the manifest's validator keys may judge: make the validators' keys first and
    # add those the run does not name to the devnet's copy of it.
    try:
        keys = [_node_key(root, f"validator{i + 1}").peer_id for i in range(validators)]
    except OSError as exc:
        raise CommandError(
            f"--out {root}: cannot write the report directory ({exc.strerror or exc})"
        ) from None
    missing = tuple(k for k in keys if k not in manifest.validator_keys)
    if missing:
        manifest = dataclasses.replace(
            manifest, validator_keys=(*manifest.validator_keys, *missing)
        )
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
        run_path.write_text(_signed(run_text, manifest, root))
    except OSError as exc:
        raise CommandError(
            f"--out {root}: cannot write the report directory ({exc.strerror or exc})"
        ) from None
    return manifest, run_path


def _signed(run_text: str, manifest: Any, root: Path) -> str:
    """The devnet's run file released by the devnet's own run authority (`root/authority.key`),
    so its peers serve a signed manifest that `swarm-node runs` and `start --join` accept."""
    key = root / "authority.key"
    if not key.exists():
        write_key(key, Identity.generate())
    release = seal_release(read_key(key), manifest, 1, int(time.time() * 1000))
    return f"{without_release(run_text)}\n{release_to_toml(release)}"


def _prepare_policy(manifest: Any, console: Any) -> None:
    """Build (first time) or find the built-in policy when the run names it, and its audit
    limits (`calibration.json` beside it, measured once as `init-model` does), so the
    validator audits with calibrated limits from the first run on."""
    if manifest.model.startswith("builtin:"):
        console.print("devnet: preparing the built-in policy (first run builds and caches it) ...")
        path, _report, built = tiny_policy.ensure_policy(progress=lambda m: console.print(f"  {m}"))
        console.print(f"devnet: policy {'built' if built else 'cached'} at {path}")
        digest = ensure_calibration(path, force=built, say=lambda m: console.print(f"  {m}"))
        console.print(f"devnet: audit limits calibrated ({digest[:16]})")


def _pin_model(manifest: Any, run_path: Path, root: Path) -> Any:
    """The run with its model pinned (`model_digest`, `model_files_digest`) where it was
    not, so a node can join the devnet with `start --join` and fetch the model from it;
    the run file is rewritten and signed again when anything was added."""
    if manifest.model_digest and manifest.model_files_digest:
        return manifest
    model_dir = resolve_model(None, manifest.model, None)
    pinned = dataclasses.replace(
        manifest,
        model_digest=manifest.model_digest or content_id(from_model_dir(model_dir)),
        model_files_digest=manifest.model_files_digest
        or content_id(encode_bundle(read_bundle_files(model_dir))),
    )
    run_path.write_text(_signed(manifest_to_toml(pinned), pinned, root))
    return pinned


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _start_nodes(swarm: _Swarm, root: Path, run_path: Path, plan: _Plan, per_version: int) -> None:
    """The trainer first (the bootstrap peer), then validators, relays and workers, each
    added to `swarm.nodes` as it is spawned; returns once every one is listening."""
    common = ["--duration", str(plan.duration + 60)]  # the nodes' own bound, past ours
    pub = ["--publish-every", str(plan.publish_every)] if plan.publish_every > 0 else []
    boot = _spawn("trainer", "trainer", root, run_path, [*common, *pub])
    swarm.nodes.append(boot)
    _wait_banner(boot, START_TIMEOUT_S)
    extra = [*common, "--bootstrap", f"{boot.addr}"]
    for i in range(plan.validators):
        swarm.nodes.append(
            _spawn(
                f"validator{i + 1}",
                "validator",
                root,
                run_path,
                [
                    *extra,
                    "--audit-fraction",
                    str(plan.audit_fraction),
                    "--batch-size",
                    str(plan.batch_size),
                ],
            )
        )
    for i in range(plan.relays):
        swarm.nodes.append(_spawn(f"relay{i + 1}", "relay", root, run_path, extra))
    for i in range(plan.inference):
        swarm.nodes.append(
            _spawn(
                f"worker{i + 1}",
                "inference",
                root,
                run_path,
                [
                    *extra,
                    "--batch-size",
                    str(plan.batch_size),
                    "--rollouts-per-version",
                    str(per_version),
                ],
            )
        )
    for n in swarm.nodes[1:]:
        _wait_banner(n, START_TIMEOUT_S)


def _watch(swarm: _Swarm, duration: float, live: bool, console: Any) -> None:
    """Read every node's status until `duration` seconds have passed (or every node has
    exited), sampling the totals every 2 s, showing the live table or a progress line
    every 10 s."""
    nodes = swarm.nodes
    swarm.started = time.monotonic()
    with (
        Live(_table(nodes, 0, duration), console=console, refresh_per_second=2, transient=False)
        if live
        else contextlib.nullcontext()
    ) as view:
        last_sample = -10.0
        last_line = 0.0
        while (elapsed := time.monotonic() - swarm.started) < duration:
            for n in nodes:
                n.read_status()
            if elapsed - last_sample >= 2.0:
                last_sample = elapsed
                swarm.series.append({"t": round(elapsed, 1), **node_totals(nodes)})
            if view is not None:
                view.update(_table(nodes, elapsed, duration))
            elif elapsed - last_line >= 10.0:
                last_line = elapsed
                console.print(_progress_line(nodes, elapsed, duration))
            if all(n.proc.poll() is not None for n in nodes):
                break
            time.sleep(0.5)


def _progress_line(nodes: list[NodeProc], elapsed: float, duration: float) -> str:
    t = node_totals(nodes)
    return (
        f"devnet {elapsed:4.0f}/{duration:.0f} s: {t['produced']} produced, "
        f"{t['trainer_bodies']} at trainer, {t['audits_passed']}/{t['audited']} audits "
        f"passed, {t['trainer_verified']} verified, min peers {t['peers_min']}"
    )


def _drain_and_sample(swarm: _Swarm, console: Any) -> None:
    """`_drain`, with the totals sampled as it begins and as it ends."""
    drain_at = round(time.monotonic() - swarm.started, 1)
    swarm.drained_s = _drain(swarm.nodes, console)
    for n in swarm.nodes:
        n.read_status()
    # the plot shows the drain and ends on the final totals
    swarm.series.append({"t": drain_at, **node_totals(swarm.nodes), "phase": "drain"})
    swarm.series.append(
        {
            "t": round(time.monotonic() - swarm.started, 1),
            **node_totals(swarm.nodes),
            "phase": "drain",
        }
    )


@click.command(name="devnet")
@click.option("--inference", default=3, show_default=True, help="Inference workers.")
@click.option("--validators", default=1, show_default=True, help="Validators.")
@click.option("--relays", default=0, show_default=True, help="Relays.")
@click.option("--duration", default=300.0, show_default=True, help="Seconds to run, then stop.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Report directory (default ./devnet-reports/<time>).",
)
@click.option(
    "--run",
    "run",
    type=click.Path(path_type=Path),
    help="Run manifest (default: the built-in tiny run).",
)
@click.option("--audit-fraction", default=0.25, show_default=True, help="Validator audit share.")
@click.option("--batch-size", default=16, show_default=True, help="Inference and audit batch size.")
@click.option("--no-live", is_flag=True, help="Plain progress lines instead of a live table.")
@click.option(
    "--publish-every",
    default=0.0,
    show_default=True,
    help="Trainer publishes perturbed weights every S seconds (0: never).",
)
@click.option(
    "--pace",
    default=1.1,
    show_default=True,
    help="Workers together make this many times what the trainer trains per version (0: flat out).",
)
@click.option(
    "--eval-tasks",
    default=FINAL_EVAL_TASKS,
    show_default=True,
    help="Held-out tasks (2 samples each) on which the warm start and the last version are compared "
    "after the stop (0: skip).",
)
@one_line_errors
def command(no_live: bool, **kwargs: Any) -> None:
    """Run a local swarm of real processes on loopback with the built-in tiny policy."""
    report = main(live=not no_live, **kwargs)
    if report.get("stopped_by"):
        # stopped by a signal: the report is written, the exit status says which signal
        sys.exit(128 + int(signal.Signals[report["stopped_by"]]))
