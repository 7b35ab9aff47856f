"""Asking bootstrap peers which run they serve, and saying in plain words why one did not
answer: what `swarm-node start --join`, `swarm-node runs` and `swarm-node doctor` share.

`ask(host, addr)` dials one multiaddr and asks it over `node.exchange.runs`; the answer
(`Answer`) holds the runs served, the round trip, the peer's clock offset, or the cause of
the failure (`dial_cause`, `stream_cause`; `probe_tcp` asks the OS why when a dial timed
out: no route, refused). `ask_all(host, addrs)` asks every address at once, each under its
own deadline, so a hanging or dripping peer costs only its own answer.
`choose(answers, pin, current)` picks the release to join with `protocol.run_manifest.check`,
and says which run ids the answers serve under more than one authority (`Conflict`) and
which addresses confirmed the authority asked for.
"""

from __future__ import annotations

import errno
import logging
import re
import time
from dataclasses import dataclass, field

import trio

from node.exchange import runs as run_exchange
from node.host.host import PeerError, SwarmHost
from protocol import run_manifest as rm
from protocol.identity import peer_id_to_b58
from protocol.wire import RunRelease

WRONG_PEER = "wrong peer id"
REFUSED = "refused"
TIMED_OUT = "timed out"
PROTOCOL_MISMATCH = "protocol mismatch"
NOT_SERVED = "run not served"
NO_ROUTE = "no route"
PROBE_TIMEOUT_S = 3.0
ASK_PEER_S = 12.0  # one address's deadline: the dial, then its run directory answer
UNCONNECTED = (WRONG_PEER, REFUSED, TIMED_OUT, NO_ROUTE)  # causes that leave no connection


def quiet_library_logs() -> None:
    """py-libp2p logs every failed dial at ERROR; a command that explains failures in its
    own words keeps those lines off the terminal."""
    for noisy in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
        logging.getLogger(noisy).propagate = False


@dataclass
class Answer:
    """What one bootstrap address said (or why it said nothing)."""

    addr: str
    peer: str | None = None
    runs: list[run_exchange.ServedRun] = field(default_factory=list)
    cause: str | None = None  # None: it answered
    detail: str = ""
    rtt_ms: float | None = None
    clock_offset_ms: float | None = None  # its clock minus ours, at the answer's midpoint

    @property
    def answered(self) -> bool:
        """Whether the peer answered."""
        return self.cause is None

    def why(self) -> str:
        """The cause, with its detail when there is one."""
        return f"{self.cause}: {self.detail}" if self.detail else str(self.cause)


def dial_cause(error: str, timeout_s: float) -> tuple[str, str]:
    """(cause, plain detail) of a failed dial, from the host's one-line error."""
    text = error.lower()
    if "does not correspond" in text or ("peer id" in text and "pubkey" in text):
        found = re.search(r"remote_peer_id_from_pubkey=(\w+)", error)
        who = f" (the host there is {found.group(1)})" if found else ""
        return WRONG_PEER, f"the address answers with another key than its /p2p/ id{who}"
    if "refused" in text:
        return (
            REFUSED,
            "connection refused: nothing listens on that port (closed port or a rejecting firewall)",
        )
    if "unreachable" in text or "no route" in text:
        return NO_ROUTE, f"this machine has no route to that address (a router said so: {error})"
    if "no answer within" in text or "timed out" in text or "timeout" in text:
        return TIMED_OUT, (
            f"no answer within {timeout_s:g} s (a firewall dropping packets, "
            "no route, or the host is down)"
        )
    return REFUSED, error


def stream_cause(exc: PeerError) -> tuple[str, str]:
    """(cause, detail) of a failed run directory question on a live connection."""
    chain, e = [], exc.__cause__
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(type(c).__name__ == "MultiselectClientError" for c in chain):
        return PROTOCOL_MISMATCH, (
            f"it does not speak {run_exchange.PROTOCOL_ID} (not a swarm-node "
            "peer, or one too old to serve runs)"
        )
    if isinstance(exc, run_exchange.BadResponse):
        return PROTOCOL_MISMATCH, f"its run directory answer is malformed ({exc})"
    if "took over" in str(exc) or "deadline" in str(exc).lower():
        return TIMED_OUT, str(exc)
    return REFUSED, str(exc)


async def probe_tcp(addr: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, str] | None:
    """(cause, detail) when one plain TCP connect to `addr`'s IP and port fails at once with
    a reason the OS knows (no route, refused); None when it connects or just times out."""
    parts = addr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp":
        return None
    try:
        family = trio.socket.AF_INET if parts[0] == "ip4" else trio.socket.AF_INET6
        with trio.socket.socket(family) as sock, trio.move_on_after(timeout_s):
            await sock.connect((parts[1], int(parts[3])))
    except (OSError, ValueError) as exc:
        if not isinstance(exc, OSError):
            return None
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return NO_ROUTE, f"this machine has no route to {parts[1]} ({exc.strerror})"
        if exc.errno == errno.ECONNREFUSED:
            return dial_cause("refused", timeout_s)
    return None


async def ask(host: SwarmHost, addr: str, *, probe: bool = False) -> Answer:
    """Dial `addr` and ask which runs it serves; never raises for a remote failure.

    With `probe`, one plain TCP connect first (`probe_tcp`) says why a dial that times out
    failed: the library retries a failed dial until the deadline and keeps the reason."""
    known = await probe_tcp(addr) if probe else None
    if known is not None and known[0] == NO_ROUTE:  # a libp2p dial would only wait out its deadline
        return Answer(addr, cause=known[0], detail=known[1])
    result = await host.connect(addr)
    if not result.ok:
        cause, detail = dial_cause(result.error or "", host.settings.dial_timeout_s)
        if cause == TIMED_OUT and known is not None:
            cause, detail = known
        return Answer(addr, result.peer, cause=cause, detail=detail)
    assert result.peer is not None
    sent = time.time()
    try:
        runs = await run_exchange.fetch_runs(host, result.peer)
    except PeerError as exc:
        cause, detail = stream_cause(exc)
        return Answer(addr, result.peer, cause=cause, detail=detail)
    got = time.time()
    answer = Answer(addr, result.peer, runs, rtt_ms=(got - sent) * 1000)
    if runs:
        answer.clock_offset_ms = runs[0].summary["time_ms"] - (sent + got) / 2 * 1000
    else:
        answer.cause, answer.detail = NOT_SERVED, "it answers but serves no run"
    return answer


async def ask_all(
    host: SwarmHost, addrs: list[str], per_peer_s: float = ASK_PEER_S, *, probe: bool = False
) -> list[Answer]:
    """`ask` every address at once, each under its own `per_peer_s` deadline (an address
    still silent then is answered `TIMED_OUT`); the answers in the order of `addrs`."""
    answers: dict[int, Answer] = {}

    async def ask_one(index: int, addr: str) -> None:
        with trio.move_on_after(per_peer_s):
            answers[index] = await ask(host, addr, probe=probe)

    async with trio.open_nursery() as nursery:
        for index, addr in enumerate(addrs):
            nursery.start_soon(ask_one, index, addr)
    return [
        answers.get(index)
        or Answer(addr, cause=TIMED_OUT, detail=f"no answer within {per_peer_s:g} s")
        for index, addr in enumerate(addrs)
    ]


@dataclass(frozen=True)
class Conflict:
    """One run id served, with good signatures, under more than one authority:
    `authorities` maps each authority (base58) to the addresses that served it."""

    run_id: str
    authorities: dict[str, list[str]]

    def __str__(self) -> str:
        named = "; ".join(
            f"{who} (from {', '.join(addrs)})" for who, addrs in sorted(self.authorities.items())
        )
        return f"run {self.run_id!r} is served under {len(self.authorities)} authorities: {named}"


@dataclass(frozen=True)
class Choice:
    """The release to join with, or why there is none (`refusals`: addr -> reason);
    `conflicts`: run ids served under several authorities; `confirmed`: the addresses that
    served a good release of the authority required (the pin, else the one held)."""

    data: bytes | None
    release: RunRelease | None
    first_use: bool
    source: str
    refusals: dict[str, str]
    conflicts: tuple[Conflict, ...] = ()
    confirmed: tuple[str, ...] = ()


def conflicts(answers: list[Answer]) -> tuple[Conflict, ...]:
    """The run ids that the answers serve with good signatures under more than one
    authority, by run id."""
    by_run: dict[str, dict[str, list[str]]] = {}
    for a in answers:
        for r in a.runs if a.answered else []:
            verdict = rm.check(r.release, None, None)
            if not isinstance(verdict, rm.Adopt):
                continue
            release = verdict.release
            who = peer_id_to_b58(release.authority)
            seen = by_run.setdefault(release.manifest.run_id, {}).setdefault(who, [])
            if a.addr not in seen:
                seen.append(a.addr)
    return tuple(
        Conflict(run_id, authorities)
        for run_id, authorities in sorted(by_run.items())
        if len(authorities) > 1
    )


def _confirmed(
    answers: list[Answer], required: bytes | None, held: RunRelease | None
) -> tuple[str, ...]:
    """The addresses serving a good release signed by `required` (of `held`'s run)."""
    if required is None:
        return ()
    found = []
    for a in answers:
        for r in a.runs if a.answered else []:
            verdict = rm.check(r.release, required, None)
            if isinstance(verdict, rm.Adopt) and (
                held is None or verdict.release.manifest.run_id == held.manifest.run_id
            ):
                found.append(a.addr)
                break
    return tuple(found)


def choose(
    answers: list[Answer],
    pin: bytes | None,
    run_id: str | None = None,
    held: RunRelease | None = None,
) -> Choice:
    """The newest release among the answers that `check` adopts under `pin` (TOFU: the
    first adopted one pins the rest) and newer than `held`; `run_id` keeps only that run.
    The conflicts and the confirming addresses are reported whatever is chosen."""
    best: tuple[bytes, RunRelease, bool, str] | None = None
    refusals: dict[str, str] = {}
    for a in answers:
        if not a.answered:
            refusals[a.addr] = a.why()
            continue
        served = [r for r in a.runs if run_id is None or r.summary["run"] == run_id]
        if not served:
            names = ", ".join(repr(r.summary["run"]) for r in a.runs)
            refusals[a.addr] = f"{NOT_SERVED}: it serves {names}, not {run_id!r}"
            continue
        for r in served:
            current = best[1] if best else held
            verdict = rm.check(r.release, pin or (current.authority if current else None), current)
            if isinstance(verdict, rm.Adopt):
                best = (r.release, verdict.release, best[2] if best else verdict.first_use, a.addr)
            elif not (verdict.reason == rm.NOT_NEWER and best is not None and r.release == best[0]):
                refusals[a.addr] = str(verdict)
    found = conflicts(answers)
    confirmed = _confirmed(answers, pin or (held.authority if held else None), held)
    if best is None:
        return Choice(None, None, False, "", refusals, found, confirmed)
    first_use = best[2] and pin is None
    return Choice(best[0], best[1], first_use, best[3], refusals, found, confirmed)
