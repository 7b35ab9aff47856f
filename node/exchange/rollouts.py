"""The body-pull stream protocol `/swarm-rl/<run>/rollout/1`.

Gossip carries only the signed header (a few hundred bytes); whoever wants the body pulls
it from a peer that announced it (the producer, or the peer that forwarded the header).

Declared once as `SPEC` on `node.exchange.request_response` (every frame length-prefixed
by `node.host.host.FramedStream`, every read and write under the host's deadline):

    client -> server   request frame: msgpack array of 1..MAX_IDS_PER_REQUEST rollout ids
                       (32-byte bins); at most MAX_REQUESTS_PER_STREAM requests per stream
    server -> client   one frame per requested id, in order: the canonical
                       `RolloutRecord` bytes (header envelope + body), or an empty frame
                       when the server has no body for that id

Bounds on the server (a 1 KB request must not pull 32 x 4 MiB, nor one byte every few
seconds hold a stream open for ever): at most `MAX_RESPONSE_BYTES` of records per request
and `MAX_STREAM_BYTES` per stream (past them the server answers empty frames: the client
asks again later or elsewhere), each stream lives at most `STREAM_DEADLINE_S`, and one
peer holds at most `MAX_SERVE_STREAMS_PER_PEER` streams at once (another is reset).

The client does not trust the server: each frame goes through `protocol.admission` as a
`Kind.ROLLOUT_RECORD` (signature, body digest, run, staleness...), and a bad one costs the
server score like any other message. A request frame over `MAX_REQUEST_BYTES`, or one
that is not an array of 32-byte ids, ends the stream (the server answers nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from node.exchange.request_response import (
    BadRequest,
    BadRequestHook,
    ExchangeSpec,
    Inbound,
    MsgpackCodec,
    OptionalRaw,
    Server,
    StreamHost,
    open_call,
)
from protocol.schema import Bytes, ListOf
from protocol.wire import RolloutRecord

__all__ = [
    "SPEC",
    "BadRequest",
    "Lookup",
    "decode_request",
    "encode_request",
    "protocol_id",
    "pull",
    "server",
]

MAX_IDS_PER_REQUEST = 32
MAX_REQUESTS_PER_STREAM = 64
ID_SIZE = 32
MAX_REQUEST_BYTES = 8 + MAX_IDS_PER_REQUEST * (ID_SIZE + 2)
MAX_RECORD_BYTES = RolloutRecord.MAX_BYTES
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_STREAM_BYTES = 64 * 1024 * 1024
STREAM_DEADLINE_S = 60.0
MAX_SERVE_STREAMS_PER_PEER = 4

ROLLOUT_IDS = ListOf(Bytes(ID_SIZE, sizes=(ID_SIZE,)), max_len=MAX_IDS_PER_REQUEST, min_len=1)

SPEC: ExchangeSpec[Sequence[bytes], bytes | None] = ExchangeSpec(
    name="rollout",
    protocol="/swarm-rl/{run}/rollout/1",
    request=MsgpackCodec(
        "rollout request",
        ROLLOUT_IDS,
        MAX_REQUEST_BYTES,
        limits={
            "max_bin_len": ID_SIZE,
            "max_array_len": MAX_IDS_PER_REQUEST,
            "max_str_len": 0,
            "max_map_len": 0,
            "max_ext_len": 0,
        },
    ),
    response=OptionalRaw(MAX_RECORD_BYTES),
    requests_per_stream=MAX_REQUESTS_PER_STREAM,
    max_streams_per_peer=MAX_SERVE_STREAMS_PER_PEER,
    deadline_s=STREAM_DEADLINE_S,
    bad_request="bad rollout request",
)


def protocol_id(run_id: str) -> str:
    """The body-pull protocol id of run `run_id`."""
    return SPEC.for_run(run_id).protocol


def encode_request(ids: Sequence[bytes]) -> bytes:
    """The request frame for `ids` (1..MAX_IDS_PER_REQUEST ids of 32 bytes)."""
    if not 1 <= len(ids) <= MAX_IDS_PER_REQUEST:
        raise ValueError(f"a request holds 1..{MAX_IDS_PER_REQUEST} ids, got {len(ids)}")
    if any(len(i) != ID_SIZE for i in ids):
        raise ValueError("rollout ids are 32 bytes")
    (frame,) = SPEC.request.encode([bytes(i) for i in ids])
    return bytes(frame)


def decode_request(peer: str, data: bytes) -> list[bytes]:
    """Parse a request frame; `BadRequest` for anything but 1..32 ids of 32 bytes."""
    if len(data) > MAX_REQUEST_BYTES:
        raise BadRequest(peer, f"request of {len(data)} bytes (cap {MAX_REQUEST_BYTES})")
    try:
        return list(SPEC.request.decode((data,)))
    except ValueError as exc:
        raise BadRequest(peer, str(exc)) from None


Lookup = Callable[[list[bytes]], Awaitable[list[bytes | None]]]


def server(
    run_id: str,
    lookup: Lookup,
    on_sent: Callable[[int], None],
    on_bad_request: BadRequestHook | None = None,
    on_refused: Callable[[str], None] | None = None,
) -> Server[Sequence[bytes], bytes | None]:
    """The body server of run `run_id`: call it with each inbound stream.

    `lookup(ids)` returns, per id, the record bytes or None (it runs the store query off
    the event loop); `on_sent(n)` counts the records sent. A stream ends when the client
    closes it, after `MAX_REQUESTS_PER_STREAM` requests, or on the first bad request.
    """

    async def answer(call: Inbound[bytes | None], ids: Sequence[bytes]) -> None:
        records = await lookup(list(ids))
        request_bytes = 0
        for record in records:
            if record is not None and (
                request_bytes + len(record) > MAX_RESPONSE_BYTES
                or call.sent_bytes + len(record) > MAX_STREAM_BYTES
            ):
                record = None  # over budget: the client may ask again later
            await call.reply(record)
            if record is not None:
                on_sent(1)
                request_bytes += len(record)

    return Server(SPEC.for_run(run_id), answer, on_bad_request, on_refused)


async def pull(
    host: StreamHost, peer: str, run_id: str, ids: Sequence[bytes]
) -> list[bytes | None]:
    """Fetch records for `ids` from `peer`: per id the record bytes (unchecked) or None.

    Raises `PeerError` (timeout, unreachable, oversized frame) and leaves judging the
    bytes to admission.
    """
    if any(len(i) != ID_SIZE for i in ids):
        raise ValueError("rollout ids are 32 bytes")
    async with open_call(host, peer, SPEC.for_run(run_id)) as call:
        out: list[bytes | None] = []
        for start in range(0, len(ids), MAX_IDS_PER_REQUEST):
            chunk = [bytes(i) for i in ids[start : start + MAX_IDS_PER_REQUEST]]
            await call.send(chunk)
            for _ in chunk:
                out.append(await call.receive())
        return out
