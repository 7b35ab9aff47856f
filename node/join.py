"""Asking bootstrap peers which run they serve, and saying in plain words why one did not
answer: what `swarm-node start --join`, `swarm-node runs` and `swarm-node doctor` share.

`ask(host, addr)` dials one multiaddr and asks it over `node.exchange.runs`; the answer
(`Answer`) holds the runs served, the round trip, the peer's clock offset, or the cause of
the failure in the words of `node.dial_diagnosis` (its causes are re-exported here).
`choose(answers, pin, current)` picks the release to join with `protocol.run_manifest.check`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

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
from protocol.wire import RunRelease

NOT_SERVED = "run not served"


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


@dataclass(frozen=True)
class Choice:
    """The release to join with, or why there is none (`refusals`: addr -> reason)."""

    data: bytes | None
    release: RunRelease | None
    first_use: bool
    source: str
    refusals: dict[str, str]


def choose(
    answers: list[Answer],
    pin: bytes | None,
    run_id: str | None = None,
    held: RunRelease | None = None,
) -> Choice:
    """The newest release among the answers that `check` adopts under `pin` (TOFU: the
    first adopted one pins the rest) and newer than `held`; `run_id` keeps only that run."""
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
    if best is None:
        return Choice(None, None, False, "", refusals)
    return Choice(best[0], best[1], best[2] and pin is None, best[3], refusals)
