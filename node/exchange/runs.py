"""The run directory stream protocol `/swarm-rl/runs/1`: which runs a peer serves.

One question per stream, declared once as `SPEC` on `node.exchange.request_response` (frames
by `node.host.host.FramedStream`, under the host's deadlines; a peer holds at most
`MAX_SERVE_STREAMS_PER_PEER` streams at once, another is reset).
The protocol id names no run: a newcomer asks before it knows one.

    client -> server   request: msgpack ["runs"]
    server -> client   answer:  msgpack [[release, summary], ...] (at most MAX_RUNS)
                       release: the signed run release envelope the peer holds
                                (`protocol.run_manifest`), or the bare encoded manifest of
                                a peer started from an unsigned run file
                       summary: map of run (str), model (str), policy_version (int),
                                manifest_version (int, 0 = unsigned), authority (str, the
                                authority's peer id, "" = unsigned), peers ({role: count},
                                the server and the peers it knows connected), time_ms (int,
                                the server's clock, for skew checks)

The summary is the server's word, unchecked and for display only; the release is checked
by whoever adopts it. A malformed answer is `BadResponse`, a malformed request `BadRequest`
(both `PeerError`s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.exchange.fields import Const, Fields
from node.exchange.request_response import (
    BadRequest,
    BadRequestHook,
    BadResponse,
    ExchangeSpec,
    Inbound,
    MsgpackCodec,
    StreamHost,
    request,
    serve,
)
from protocol.errors import DecodeError
from protocol.schema import Spec
from protocol.wire import RunRelease

__all__ = [
    "PROTOCOL_ID",
    "SPEC",
    "BadRequest",
    "BadResponse",
    "ServedRun",
    "decode_answer",
    "encode_answer",
    "fetch_runs",
    "serve_runs",
]

PROTOCOL_ID = "/swarm-rl/runs/1"
MAX_RUNS = 4
MAX_REQUEST_BYTES = 32
MAX_ANSWER_BYTES = MAX_RUNS * (RunRelease.MAX_BYTES + 4096)
MAX_SERVE_STREAMS_PER_PEER = 2
SUMMARY_KEYS = {
    "run": str,
    "model": str,
    "policy_version": int,
    "manifest_version": int,
    "authority": str,
    "peers": dict,
    "time_ms": int,
}


@dataclass(frozen=True)
class ServedRun:
    """One run as a peer serves it: the release bytes (unchecked) and its summary."""

    release: bytes
    summary: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunDirectory(Spec):
    """The answer: an array of at most MAX_RUNS [release, summary] pairs (`ServedRun`s)."""

    def check(self, value: Any) -> str | None:
        """Local answers are built from `ServedRun`s: nothing to check."""
        return None

    def to_wire(self, value: list[ServedRun]) -> list[Any]:
        """The first MAX_RUNS runs as [release, summary] pairs."""
        return [[r.release, r.summary] for r in value[:MAX_RUNS]]

    def from_wire(self, raw: Any, obj: str, field: str) -> list[ServedRun]:
        """The runs, each summary checked against SUMMARY_KEYS."""
        if not isinstance(raw, list):
            raise DecodeError(obj, None, "run directory is not an array")
        out = []
        for entry in raw:
            if not (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], bytes)
                and isinstance(entry[1], dict)
            ):
                raise DecodeError(obj, None, "run directory entry is not [release, summary]")
            summary = entry[1]
            for key, kind in SUMMARY_KEYS.items():
                if not isinstance(summary.get(key), kind) or isinstance(summary.get(key), bool):
                    raise DecodeError(obj, None, f"run summary lacks {key} ({kind.__name__})")
            peers = summary["peers"]
            if not all(isinstance(k, str) and type(v) is int for k, v in peers.items()):
                raise DecodeError(obj, None, "run summary's peers is not {role: count}")
            out.append(ServedRun(entry[0], {k: summary[k] for k in SUMMARY_KEYS}))
        return out


SPEC: ExchangeSpec[tuple[str], list[ServedRun]] = ExchangeSpec(
    name="run directory",
    protocol=PROTOCOL_ID,
    request=MsgpackCodec(
        "run directory request",
        Fields((Const("runs"),)),
        MAX_REQUEST_BYTES,
        limits={"max_array_len": 1, "max_str_len": 8},
    ),
    response=MsgpackCodec(
        "run directory",
        RunDirectory(),
        MAX_ANSWER_BYTES,
        limits={
            "max_array_len": MAX_RUNS,
            "max_map_len": 16,
            "max_str_len": 256,
            "max_bin_len": RunRelease.MAX_BYTES + 1024,
        },
    ),
    max_streams_per_peer=MAX_SERVE_STREAMS_PER_PEER,
    bad_request="bad run directory request",
)


def encode_answer(runs: list[ServedRun]) -> bytes:
    """The answer frame listing `runs` (the first MAX_RUNS)."""
    (frame,) = SPEC.response.encode(runs)
    return bytes(frame)


def decode_answer(peer: str, data: bytes) -> list[ServedRun]:
    """The runs in an answer; `BadResponse` for anything but the documented shape."""
    try:
        return SPEC.response.decode((data,))
    except ValueError as exc:
        raise BadResponse(peer, str(exc)) from None


async def fetch_runs(host: StreamHost, peer: str) -> list[ServedRun]:
    """Ask a connected peer which runs it serves. Raises `PeerError` (unreachable, too
    slow, protocol not spoken, `BadResponse`)."""
    return await request(host, peer, SPEC, ("runs",))


def serve_runs(
    host: StreamHost,
    runs: Callable[[], list[ServedRun]],
    on_bad_request: BadRequestHook | None = None,
    on_refused: Callable[[str], None] | None = None,
) -> None:
    """Answer the run directory on `host` with `runs()` at the time of each question."""

    async def answer(call: Inbound[list[ServedRun]], _request: tuple[str]) -> None:
        await call.reply(runs())

    serve(host, SPEC, answer, on_bad_request=on_bad_request, on_refused=on_refused)
