"""Asking bootstrap peers which run they serve, and saying in plain words why one did not
answer: what `swarm-node start --join`, `swarm-node runs` and `swarm-node doctor` share.

`ask(host, addr)` dials one multiaddr and asks it over `node.exchange.runs`; the answer
(`Answer`) holds the runs served, the round trip, the peer's clock offset, or the cause of
the failure in the words of `node.dial_diagnosis` (its causes are re-exported here).
`ask_all(host, addrs)` asks every address at once, each under its own deadline, so a
hanging or dripping peer costs only its own answer.
`choose(answers, pin, current)` picks the release to join with `protocol.run_manifest.check`,
and says which run ids the answers serve under more than one authority (`Conflict`) and
which addresses confirmed the authority asked for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import trio

from node.dial_diagnosis import DIAL_FAILED as DIAL_FAILED
from node.dial_diagnosis import NO_ROUTE as NO_ROUTE
from node.dial_diagnosis import NOT_LIBP2P as NOT_LIBP2P
from node.dial_diagnosis import PROTOCOL_MISMATCH as PROTOCOL_MISMATCH
from node.dial_diagnosis import REFUSED as REFUSED
from node.dial_diagnosis import TIMED_OUT as TIMED_OUT
from node.dial_diagnosis import UNCONNECTED as UNCONNECTED
from node.dial_diagnosis import WRONG_PEER as WRONG_PEER
from node.dial_diagnosis import dial_cause as dial_cause
from node.dial_diagnosis import probe, stream_cause
from node.exchange import runs as run_exchange
from node.host.host import PeerError, SwarmHost
from protocol import run_manifest as rm
from protocol.identity import peer_id_to_b58
from protocol.wire import RunRelease

NOT_SERVED = "run not served"
ASK_PEER_S = 12.0  # one address's deadline: the dial, then its run directory answer


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


async def ask(host: SwarmHost, addr: str) -> Answer:
    """Dial `addr` and ask which runs it serves; never raises for a remote failure. A port
    that cannot be a libp2p peer (refused, no route, timed out, not libp2p) is named by
    `node.dial_diagnosis.probe` before the dial, as soon as the OS or the listener answers."""
    timeout_s = host.settings.dial_timeout_s
    known = await probe(addr, timeout_s)
    if known is not None:
        return Answer(addr, cause=known[0], detail=known[1])
    result = await host.connect(addr)
    if not result.ok:
        cause, detail = dial_cause(result.error or "", timeout_s)
        return Answer(addr, result.peer, cause=cause, detail=detail)
    assert result.peer is not None
    sent = time.time()
    try:
        runs = await run_exchange.fetch_runs(host, result.peer)
    except run_exchange.BadResponse as exc:
        return Answer(
            addr,
            result.peer,
            cause=PROTOCOL_MISMATCH,
            detail=f"its run directory answer is malformed ({exc})",
        )
    except PeerError as exc:
        cause, detail = stream_cause(exc, run_exchange.PROTOCOL_ID)
        return Answer(addr, result.peer, cause=cause, detail=detail)
    got = time.time()
    answer = Answer(addr, result.peer, runs, rtt_ms=(got - sent) * 1000)
    if runs:
        answer.clock_offset_ms = runs[0].summary["time_ms"] - (sent + got) / 2 * 1000
    else:
        answer.cause, answer.detail = NOT_SERVED, "it answers but serves no run"
    return answer


async def ask_all(
    host: SwarmHost, addrs: list[str], per_peer_s: float = ASK_PEER_S
) -> list[Answer]:
    """`ask` every address at once, each under its own `per_peer_s` deadline (an address
    still silent then is answered `TIMED_OUT`); the answers in the order of `addrs`."""
    answers: dict[int, Answer] = {}

    async def ask_one(index: int, addr: str) -> None:
        with trio.move_on_after(per_peer_s):
            answers[index] = await ask(host, addr)

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
