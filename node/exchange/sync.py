"""The catch-up stream protocol `/swarm-rl/<run>/sync/1` (rules in `protocol.catch_up`).

Wire (frames by `node.host.host.FramedStream`, every read and write under the host's deadline):

    client -> server   request: msgpack [since: float, min_version: int, producer: bin|nil,
                       limit: int]  (limit 1..MAX_PAGE)
    server -> client   answer:  msgpack [ids: [bin32...], ats: [float...], more: bool]

One question per stream. The answer lists rollouts the server holds *with a body*,
received at or after `since` in the server's clock, oldest first. The client trusts
nothing in it: the ids it lacks are pulled over the body stream
(`node.exchange.rollouts`) and admitted like any pulled record; a malformed answer ends the
exchange (`BadAnswer`, a `PeerError`), a malformed request ends the stream (`BadRequest`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import msgpack

from node.host.host import FramedStream, PeerError, SwarmHost

MAX_PAGE = 4096
ID_SIZE = 32
MAX_REQUEST_BYTES = 128
MAX_ANSWER_BYTES = 16 + MAX_PAGE * (ID_SIZE + 2 + 9)


class BadRequest(PeerError):
    """The client sent something that is not a catch-up question."""


class BadAnswer(PeerError):
    """The server answered something that is not a catch-up page."""


def protocol_id(run_id: str) -> str:
    return f"/swarm-rl/{run_id}/sync/1"


def encode_request(since: float, min_version: int, producer: bytes | None, limit: int) -> bytes:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_PAGE}")
    return msgpack.packb([float(since), int(min_version), producer, int(limit)], use_bin_type=True)


def decode_request(peer: str, data: bytes) -> tuple[float, int, bytes | None, int]:
    if len(data) > MAX_REQUEST_BYTES:
        raise BadRequest(peer, f"catch-up request of {len(data)} bytes (cap {MAX_REQUEST_BYTES})")
    try:
        since, min_version, producer, limit = msgpack.unpackb(data, raw=False, max_bin_len=64)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadRequest(
            peer, f"catch-up request is not [since, min_version, producer, limit]: {exc}"
        ) from None
    if (
        not isinstance(since, float | int)
        or not math.isfinite(since)
        or not isinstance(min_version, int)
        or min_version < 0
        or not (producer is None or isinstance(producer, bytes))
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_PAGE
    ):
        raise BadRequest(peer, "catch-up request fields out of range")
    return float(since), min_version, producer, limit


def decode_answer(peer: str, data: bytes) -> tuple[tuple[bytes, ...], tuple[float, ...], bool]:
    try:
        ids, ats, more = msgpack.unpackb(
            data, raw=False, max_bin_len=ID_SIZE, max_array_len=MAX_PAGE
        )
    except Exception as exc:
        raise BadAnswer(peer, f"catch-up answer is not [ids, ats, more]: {exc}") from None
    if (
        not isinstance(ids, list)
        or not isinstance(ats, list)
        or len(ids) != len(ats)
        or not isinstance(more, bool)
        or not all(isinstance(i, bytes) and len(i) == ID_SIZE for i in ids)
        or not all(isinstance(t, float | int) and math.isfinite(t) for t in ats)
    ):
        raise BadAnswer(peer, "catch-up answer fields out of range")
    return tuple(ids), tuple(float(t) for t in ats), more


Lookup = Callable[[float, int, bytes | None, int], Awaitable[tuple[list[bytes], list[float], bool]]]


async def serve(stream: FramedStream, lookup: Lookup) -> int:
    """Answer one question; returns how many ids were offered."""
    since, min_version, producer, limit = decode_request(
        stream.peer, await stream.receive(MAX_REQUEST_BYTES)
    )
    ids, ats, more = await lookup(since, min_version, producer, limit)
    await stream.send(msgpack.packb([ids, ats, more], use_bin_type=True))
    return len(ids)


async def ask(
    host: SwarmHost,
    peer: str,
    run_id: str,
    since: float,
    min_version: int,
    producer: bytes | None,
    limit: int,
) -> tuple[tuple[bytes, ...], tuple[float, ...], bool]:
    """One question to `peer`: (ids, ats, more). Raises `PeerError`."""
    stream = await host.open_stream(peer, protocol_id(run_id))
    try:
        await stream.send(encode_request(since, min_version, producer, limit))
        return decode_answer(peer, await stream.receive(MAX_ANSWER_BYTES))
    finally:
        await stream.close()
