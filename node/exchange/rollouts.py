"""The body-pull stream protocol `/swarm-rl/<run>/rollout/1`.

Gossip carries only the signed header (a few hundred bytes); whoever wants the body pulls
it from a peer that announced it (the producer, or the peer that forwarded the header).

Wire (every frame is length-prefixed by `node.host.host.FramedStream`, every read and write
under the host's deadline):

    client -> server   request frame: msgpack array of 1..MAX_IDS_PER_REQUEST rollout ids
                       (32-byte bins); at most MAX_REQUESTS_PER_STREAM requests per stream
    server -> client   one frame per requested id, in order: the canonical
                       `RolloutRecord` bytes (header envelope + body), or an empty frame
                       when the server has no body for that id

Bounds on the server (a 1 KB request must not pull 32 x 4 MiB, nor one byte every few
seconds hold a stream open for ever): at most `MAX_RESPONSE_BYTES` of records per request
and `MAX_STREAM_BYTES` per stream (past them the server answers empty frames: the client
asks again later or elsewhere), and each stream lives at most `STREAM_DEADLINE_S`.

The client does not trust the server: each frame goes through `protocol.admission` as a
`Kind.ROLLOUT_RECORD` (signature, body digest, run, staleness...), and a bad one costs the
server score like any other message. A request frame over `MAX_REQUEST_BYTES`, or one
that is not an array of 32-byte ids, ends the stream (the server answers nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import msgpack
import trio

from node.host.host import FramedStream, PeerError, SwarmHost
from protocol.wire import RolloutRecord

MAX_IDS_PER_REQUEST = 32
MAX_REQUESTS_PER_STREAM = 64
ID_SIZE = 32
MAX_REQUEST_BYTES = 8 + MAX_IDS_PER_REQUEST * (ID_SIZE + 2)
MAX_RECORD_BYTES = RolloutRecord.MAX_BYTES
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_STREAM_BYTES = 64 * 1024 * 1024
STREAM_DEADLINE_S = 60.0


class BadRequest(PeerError):
    """The client sent something that is not a rollout request."""


def protocol_id(run_id: str) -> str:
    return f"/swarm-rl/{run_id}/rollout/1"


def encode_request(ids: Sequence[bytes]) -> bytes:
    if not 1 <= len(ids) <= MAX_IDS_PER_REQUEST:
        raise ValueError(f"a request holds 1..{MAX_IDS_PER_REQUEST} ids, got {len(ids)}")
    if any(len(i) != ID_SIZE for i in ids):
        raise ValueError("rollout ids are 32 bytes")
    return msgpack.packb([bytes(i) for i in ids], use_bin_type=True)


def decode_request(peer: str, data: bytes) -> list[bytes]:
    """Parse a request frame; raises `BadRequest` for anything but 1..32 ids of 32 bytes."""
    if len(data) > MAX_REQUEST_BYTES:
        raise BadRequest(peer, f"request of {len(data)} bytes (cap {MAX_REQUEST_BYTES})")
    try:
        ids = msgpack.unpackb(
            data,
            raw=False,
            max_bin_len=ID_SIZE,
            max_array_len=MAX_IDS_PER_REQUEST,
            max_str_len=0,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadRequest(peer, f"request is not msgpack: {exc}") from None
    if (
        not isinstance(ids, list)
        or not 1 <= len(ids) <= MAX_IDS_PER_REQUEST
        or not all(isinstance(i, bytes) and len(i) == ID_SIZE for i in ids)
    ):
        raise BadRequest(peer, "request is not an array of 1..32 rollout ids")
    return ids


Lookup = Callable[[list[bytes]], Awaitable[list[bytes | None]]]


async def serve(stream: FramedStream, lookup: Lookup) -> int:
    """Answer requests on one inbound stream; returns how many records were sent.

    `lookup(ids)` returns, per id, the record bytes or None (it runs the store query off
    the event loop). Ends when the client closes, after `MAX_REQUESTS_PER_STREAM`, or on
    the first bad request (`BadRequest` propagates to the host's handler, which logs it).
    """
    sent = 0
    stream_bytes = 0
    with trio.move_on_after(STREAM_DEADLINE_S):
        for _ in range(MAX_REQUESTS_PER_STREAM):
            try:
                frame = await stream.receive(MAX_REQUEST_BYTES)
            except PeerError:
                return sent  # client went away (or stalled): nothing more to do
            ids = decode_request(stream.peer, frame)
            records = await lookup(ids)
            request_bytes = 0
            for record in records:
                if record is not None and (
                    request_bytes + len(record) > MAX_RESPONSE_BYTES
                    or stream_bytes + len(record) > MAX_STREAM_BYTES
                ):
                    record = None  # over budget: the client may ask again later
                await stream.send(record or b"")
                if record is not None:
                    sent += 1
                    request_bytes += len(record)
                    stream_bytes += len(record)
    return sent


async def pull(host: SwarmHost, peer: str, run_id: str, ids: Sequence[bytes]) -> list[bytes | None]:
    """Fetch records for `ids` from `peer`: per id the record bytes (unchecked) or None.

    Raises `PeerError` (timeout, unreachable, oversized frame) and leaves judging the
    bytes to admission.
    """
    stream = await host.open_stream(peer, protocol_id(run_id))
    try:
        out: list[bytes | None] = []
        for start in range(0, len(ids), MAX_IDS_PER_REQUEST):
            chunk = list(ids[start : start + MAX_IDS_PER_REQUEST])
            await stream.send(encode_request(chunk))
            for _ in chunk:
                frame = await stream.receive(MAX_RECORD_BYTES)
                out.append(frame or None)
        return out
    finally:
        await stream.close()
