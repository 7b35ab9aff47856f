"""The run directory stream protocol `/swarm-rl/runs/1`: which runs a peer serves.

One question per stream, frames by `node.host.host.FramedStream`, under the host's deadlines.
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
by whoever adopts it. A malformed answer is `BadAnswer`, a malformed request `BadRequest`
(both `PeerError`s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from node.host.host import FramedStream, PeerError, SwarmHost
from protocol.wire import RunRelease

PROTOCOL_ID = "/swarm-rl/runs/1"
MAX_RUNS = 4
MAX_REQUEST_BYTES = 32
MAX_ANSWER_BYTES = MAX_RUNS * (RunRelease.MAX_BYTES + 4096)
SUMMARY_KEYS = {
    "run": str,
    "model": str,
    "policy_version": int,
    "manifest_version": int,
    "authority": str,
    "peers": dict,
    "time_ms": int,
}


class BadRequest(PeerError):
    """The client sent something that is not a run directory question."""


class BadAnswer(PeerError):
    """The server answered something that is not a run directory."""


@dataclass(frozen=True)
class ServedRun:
    """One run as a peer serves it: the release bytes (unchecked) and its summary."""

    release: bytes
    summary: dict[str, Any]


def encode_answer(runs: list[ServedRun]) -> bytes:
    return msgpack.packb([[r.release, r.summary] for r in runs[:MAX_RUNS]], use_bin_type=True)


def decode_answer(peer: str, data: bytes) -> list[ServedRun]:
    """The runs in an answer; `BadAnswer` for anything but the documented shape."""
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            max_array_len=MAX_RUNS,
            max_map_len=16,
            max_str_len=256,
            max_bin_len=RunRelease.MAX_BYTES + 1024,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadAnswer(peer, f"run directory is not msgpack: {exc}") from None
    if not isinstance(value, list):
        raise BadAnswer(peer, "run directory is not an array")
    out = []
    for entry in value:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], bytes)
            and isinstance(entry[1], dict)
        ):
            raise BadAnswer(peer, "run directory entry is not [release, summary]")
        summary = entry[1]
        for key, kind in SUMMARY_KEYS.items():
            if not isinstance(summary.get(key), kind) or isinstance(summary.get(key), bool):
                raise BadAnswer(peer, f"run summary lacks {key} ({kind.__name__})")
        peers = summary["peers"]
        if not all(isinstance(k, str) and type(v) is int for k, v in peers.items()):
            raise BadAnswer(peer, "run summary's peers is not {role: count}")
        out.append(ServedRun(entry[0], {k: summary[k] for k in SUMMARY_KEYS}))
    return out


async def fetch_runs(host: SwarmHost, peer: str) -> list[ServedRun]:
    """Ask a connected peer which runs it serves. Raises `PeerError` (unreachable, too
    slow, protocol not spoken, `BadAnswer`)."""
    stream = await host.open_stream(peer, PROTOCOL_ID)
    try:
        await stream.send(msgpack.packb(["runs"]))
        return decode_answer(peer, await stream.receive(MAX_ANSWER_BYTES))
    finally:
        await stream.close()


async def serve(stream: FramedStream, runs: list[ServedRun]) -> None:
    """Answer one question with `runs`."""
    data = await stream.receive(MAX_REQUEST_BYTES)
    try:
        request = msgpack.unpackb(data, raw=False, max_array_len=1, max_str_len=8)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadRequest(stream.peer, f"run directory request is not msgpack: {exc}") from None
    if request != ["runs"]:
        raise BadRequest(stream.peer, 'run directory request is not ["runs"]')
    await stream.send(encode_answer(runs))
