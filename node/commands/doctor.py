"""`swarm-node doctor [--join MULTIADDR... | --run RUN.toml [--bootstrap MULTIADDR...]]`:
can this machine join the run? One plain line per check, each starting with `ok`, `warn`,
`FAIL` or `info`:

    listen and observed addresses; each bootstrap peer answered or why not (refused or
    closed port, no route, timed out, wrong peer id, protocol mismatch, run not served);
    publicly reachable or not (the bootstrap peers asked to dial us back, AutoNAT) and the
    relay it would use (one a bootstrap peer announces by identify), `node.reachability`;
    not reachable with no relay on offer fails (`no relay`); clock skew against the
    peers; free disk, memory and CPUs for the role; the device its model computes on and,
    with the run's manifest, whether it computes at the run's `verification.precision` (a worker that
    cannot fails here instead of being banned for its rollouts later); the manifest's
    authority and version.

The last line says whether the node could join, and if not why. Exit 0 when it could, 1
when not, 2 on usage errors. The check runs a short-lived host of a throwaway identity on
the node's listen addresses; it changes nothing (it pins no authority).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import trio

from node.cli_errors import one_line_errors
from node.commands.addrs import check_addrs, check_listen, loopback_note
from node.commands.start_run import parse_authority
from node.config import load_config
from node.errors import CommandError
from node.model_fetch import model_availability
from node.paths import data_root
from node.reachability import NO_RELAY, Reachability, describe
from node.resources import available_memory, existing_parent, free_disk
from node.run_file import load_run_release
from protocol import run_manifest as rm
from protocol.identity import Identity, peer_id_to_b58

CHECK_TIMEOUT_S = 60.0
DIAL_BACK_TIMEOUT_S = (
    12.0  # each bootstrap peer's AutoNAT answer, all asked at once (dial-backs: 3 s each)
)
MAX_SKEW_MS = 120_000  # what admission tolerates on envelope timestamps (max_skew_s)
WARN_SKEW_MS = 10_000
GiB = 2**30
# role -> (free disk GiB, available memory GiB, CPUs) below which the role cannot work well
NEEDS = {
    "inference": (1.0, 1.0, 1),
    "validator": (1.0, 1.0, 1),
    "trainer": (2.0, 2.0, 2),
    "relay": (0.2, 0.25, 1),
}


@dataclass
class Report:
    """The check lines printed so far and the problems that stop the node from joining."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    manifest: Any = None  # the run's manifest, once read or fetched

    def ok(self, text: str) -> None:
        """A passed check."""
        self.lines.append(f"ok   {text}")

    def info(self, text: str) -> None:
        """A fact, neither good nor bad."""
        self.lines.append(f"info {text}")

    def warn(self, text: str) -> None:
        """A problem that does not stop the node from joining."""
        self.lines.append(f"warn {text}")

    def fail(self, text: str, why: str | None = None) -> None:
        """A failed check; `why` (default: the text) is the cause reported at the end."""
        self.lines.append(f"FAIL {text}")
        self.problems.append(why or text)

    def add(self, level: str, text: str, why: str | None = None) -> None:
        """A line of `level` (ok, info, warn, FAIL); `why` is a failure's cause."""
        if level == "FAIL":
            self.fail(text, why)
        else:
            {"ok": self.ok, "info": self.info, "warn": self.warn}[level](text)


def main(
    *,
    join: tuple[str, ...] = (),
    run: Path | None = None,
    bootstrap: tuple[str, ...] = (),
    role: str = "inference",
    authority: str | None = None,
    listen: tuple[str, ...] = (),
    data_dir: Path | None = None,
    config: Path | None = None,
    device: str | None = None,
) -> int:
    """Run the checks, print the lines; returns the exit status (see the module docstring)."""
    if bool(join) == bool(run):
        raise CommandError("give --join MULTIADDR or --run RUN.toml (one of them)")
    if join and bootstrap:
        raise CommandError(
            "--bootstrap goes with --run; with --join the join addresses are the bootstrap"
        )
    cfg = load_config(
        config,
        {
            "node.listen": list(listen) or None,
            "node.bootstrap": list(bootstrap) or None,
            "node.data_dir": str(data_dir) if data_dir else None,
            "node.device": device,
        },
    )
    addrs = check_addrs(
        join or cfg.node.bootstrap, "--join" if join else "--bootstrap", need_peer=True
    )
    listen_addrs = check_listen(cfg.node.listen)
    flag = parse_authority(authority)
    report = Report()
    local = _local_manifest(run, report) if run else None
    from node import settings  # deferred: heavy import
    from node.join import quiet_library_logs  # deferred: heavy import

    quiet_library_logs()
    trio.run(
        _network_checks,
        report,
        listen_addrs,
        addrs,
        settings.host_settings(cfg),
        local,
        flag,
        Path(cfg.node.data_dir).expanduser() if cfg.node.data_dir else None,
        bool(join),
    )
    _resources(
        report,
        role,
        Path(cfg.node.data_dir).expanduser() if cfg.node.data_dir else Path.cwd(),
    )
    manifest = local or report.manifest
    if manifest is not None and role != "relay":
        _model_line(report, manifest, Path(cfg.node.data_dir) if cfg.node.data_dir else None)
    _device(report, role, cfg.node.device, manifest)
    for line in report.lines:
        click.echo(line)
    if report.problems:
        click.echo(f"doctor: this node could NOT join: {'; '.join(report.problems)}")
        return 1
    click.echo("doctor: this node could join")
    return 0


def _local_manifest(run: Path, report: Report) -> Any:
    """The run file's manifest (and release), with its line."""
    manifest, release = load_run_release(run)
    if release is None:
        report.warn(
            f"manifest: {run} is unsigned: peers joining with --join refuse it "
            "(sign it with `swarm-node run sign`)"
        )
    else:
        version, authority, _, _ = rm.parts(release)
        report.ok(
            f"manifest: run {manifest.run_id!r} version {version}, authority "
            f"{peer_id_to_b58(authority)} (from {run})"
        )
    return manifest


def _model_line(report: Report, manifest: Any, data_dir: Path | None) -> None:
    """Where the node would take the run's model from (`node.model_fetch.model_availability`)."""
    level, line = model_availability(manifest, None, data_root(data_dir))
    report.add(level, line, "no model" if level == "FAIL" else None)


async def _network_checks(
    report: Report,
    listen: list[str],
    addrs: list[str],
    settings: Any,
    local: Any,
    flag: bytes | None,
    data_dir: Path | None,
    joining: bool,
) -> None:
    from node import join  # deferred: heavy import
    from node.host.host import ListenFailed, open_host  # deferred: heavy import
    from node.host.identify import identify  # deferred: heavy import
    from node.host.reachability import open_reachability  # deferred: heavy import
    from node.host.relay import RELAY_HOP_PROTOCOL  # deferred: heavy import

    answers: list[join.Answer] = []
    reach = Reachability(listen=[])
    try:
        with trio.move_on_after(CHECK_TIMEOUT_S):
            async with (
                open_host(Identity.generate().private_bytes(), listen, settings) as host,
                open_reachability(host) as autonat,
            ):
                reach.listen = host.listen_addrs()
                note = loopback_note(listen, addrs)
                if note is None:
                    report.ok(f"listen: {', '.join(reach.listen)}")
                else:
                    report.warn(f"listen: {', '.join(reach.listen)}: {note}")
                answers = await join.ask_all(host, addrs)

                async def identify_one(answer: join.Answer) -> None:
                    assert answer.peer is not None
                    said = await identify(host, answer.peer)  # under its own deadline
                    if said.observed:
                        reach.observed[answer.peer] = said.observed
                    if RELAY_HOP_PROTOCOL in said.protocols:
                        reach.relays[answer.peer] = answer.addr

                async with trio.open_nursery() as nursery:
                    for answer in answers:
                        if answer.peer and answer.cause not in join.UNCONNECTED:
                            nursery.start_soon(identify_one, answer)
                connected = set(host.connected_peers())
                reach.asked = autonat.pick([a.peer for a in answers if a.peer in connected])
                if reach.asked:
                    reach.dial_back = await autonat.check(reach.asked, DIAL_BACK_TIMEOUT_S)
                    if autonat.last is not None:
                        reach.agreed, reach.answered = autonat.last.agreed, autonat.last.answered
                        reach.proven = autonat.last.proven
    except (ListenFailed, OSError) as exc:
        report.fail(f"listen: cannot listen on {', '.join(listen)}: {exc}", "cannot listen")
        return
    _bootstrap_lines(report, addrs, answers, local)
    for level, text in describe(reach):
        report.add(level, text, NO_RELAY)
    _clock_lines(report, answers)
    if joining:
        _joined_manifest(report, answers, flag, data_dir)


def _bootstrap_lines(report: Report, addrs: list[str], answers: list[Any], local: Any) -> None:
    from node import join  # deferred: heavy import

    if not addrs:
        report.info("bootstrap: none given: this node would start the network alone")
        return
    for a in answers:
        if (
            a.answered
            and local is not None
            and all(r.summary["run"] != local.run_id for r in a.runs)
        ):
            names = ", ".join(repr(r.summary["run"]) for r in a.runs)
            a.cause, a.detail = join.NOT_SERVED, f"it serves {names}, not {local.run_id!r}"
        if a.answered:
            runs = ", ".join(f"{r.summary['run']!r}" for r in a.runs)
            report.ok(f"bootstrap {a.addr}: answered in {a.rtt_ms:.0f} ms, serves run {runs}")
        else:
            report.fail(f"bootstrap {a.addr}: {a.why()}", f"{a.cause} at {a.addr}")
    for addr in addrs[len(answers) :]:
        report.fail(
            f"bootstrap {addr}: {join.TIMED_OUT}: not checked within {CHECK_TIMEOUT_S:g} s",
            f"bootstrap {join.TIMED_OUT}",
        )
    if len(answers) > 1 and not any(a.answered for a in answers):
        report.problems.append("no bootstrap peer answered")


def _clock_lines(report: Report, answers: list[Any]) -> None:
    offsets = [(a.addr, a.clock_offset_ms) for a in answers if a.clock_offset_ms is not None]
    if not offsets:
        report.info("clock: no peer to compare with")
    for addr, off in offsets:
        text = f"clock: {off:+.0f} ms against {addr.rsplit('/', 1)[-1][:12]}..."
        if abs(off) > MAX_SKEW_MS:
            report.fail(
                f"{text}: peers refuse messages over ±{MAX_SKEW_MS // 1000} s off; set the clock (NTP)",
                "clock skew",
            )
        elif abs(off) > WARN_SKEW_MS:
            report.warn(f"{text}: large; set the clock (NTP)")
        else:
            report.ok(text)


def _joined_manifest(
    report: Report, answers: list[Any], flag: bytes | None, data_dir: Path | None
) -> None:
    from node import join  # deferred: heavy import
    from node.peer.run_service import read_pin  # deferred: heavy import

    if not any(a.answered for a in answers):
        report.lines.append("FAIL manifest: not fetched: no bootstrap peer answered")
        return
    remembered = read_pin(data_dir) if data_dir else None
    pin = rm.choose_pin(flag, remembered)
    if isinstance(pin, rm.Refuse):
        report.fail(f"manifest: {pin}", "authority differs from the pinned one")
        return
    choice = join.choose([a for a in answers if a.answered], pin.authority)
    if choice.release is None:
        reasons = "; ".join(f"{a}: {r}" for a, r in choice.refusals.items()) or "no peer served one"
        first = next(iter(choice.refusals.values()), "none served").split(":")[0]
        report.fail(f"manifest: none this node can trust ({reasons})", f"manifest {first}")
        return
    for addr, reason in choice.refusals.items():
        report.warn(f"manifest from {addr} refused: {reason}")
    report.manifest = choice.release.manifest
    how = (
        "pinned by --authority"
        if flag
        else "pinned before"
        if remembered
        else "would be trusted on first use: check it with the run's operator"
    )
    r = choice.release
    report.ok(
        f"manifest: run {r.manifest.run_id!r} version {r.manifest_version}, authority "
        f"{peer_id_to_b58(r.authority)} ({how})"
    )


def _resources(report: Report, role: str, where: Path) -> None:
    disk_need, mem_need, cpu_need = NEEDS[role]
    probe = existing_parent(where)
    free = free_disk(probe) / GiB
    mem = available_memory() / GiB
    cpus = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    text = f"resources for {role}: {free:.1f} GiB free disk at {probe}, {mem:.1f} GiB memory available, {cpus} CPUs"
    short = [
        what
        for what, have, need in (("disk", free, disk_need), ("memory", mem, mem_need))
        if have < need
    ]
    if short:
        report.fail(
            f"{text}; needs {disk_need:g} GiB disk, {mem_need:g} GiB memory",
            f"not enough {' and '.join(short)}",
        )
    elif cpus < cpu_need:
        report.warn(f"{text}; {cpu_need} CPUs advised")
    else:
        report.ok(text)


def _device(report: Report, role: str, device: str, manifest: Any) -> None:
    """Where the role's model would compute and whether it computes at the run's precision
    (workers and validators; the trainer keeps an fp32 master)."""
    from trainer.devices import (
        DeviceError,
        precision_problem,
        resolve_device,
    )  # deferred: heavy import

    if role == "relay":
        return
    try:
        where = resolve_device(device)
    except DeviceError as exc:
        report.fail(f"device: {exc}", "no such device")
        return
    precision = "fp32" if role == "trainer" else getattr(manifest, "worker_precision", None)
    if precision is None:
        report.info(f"device: {role} computes on {where} (the run manifest was not read)")
        return
    problem = precision_problem(where, precision)
    if problem is not None:
        report.fail(f"device: {where}: {problem}", "device cannot compute at the run's precision")
    else:
        report.ok(f"device: {role} computes on {where} at {precision}")


@click.command(name="doctor")
@click.option("--join", multiple=True, metavar="MULTIADDR", help="Bootstrap peer to join through.")
@click.option("--run", "run", type=click.Path(path_type=Path), help="Run manifest TOML.")
@click.option(
    "--bootstrap", multiple=True, metavar="MULTIADDR", help="With --run: a bootstrap peer."
)
@click.option(
    "--role",
    type=click.Choice(["inference", "trainer", "validator", "relay"]),
    default="inference",
    show_default=True,
    help="The role to check resources for.",
)
@click.option("--authority", metavar="PEER_ID", help="The run authority to trust.")
@click.option("--listen", multiple=True, help="Multiaddr to listen on (default the config's).")
@click.option("--data-dir", type=click.Path(path_type=Path), help="The node's data directory.")
@click.option("--config", type=click.Path(path_type=Path), help="Node configuration TOML.")
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    help="Where the role's model would compute (default the config's).",
)
@one_line_errors
def command(**kwargs: Any) -> None:
    """Check that this machine can join a run; one line per check (exit 0: it can)."""
    sys.exit(main(**kwargs))
