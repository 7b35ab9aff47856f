"""The catch-up stream protocol `/swarm-rl/<run>/sync/1` (rules in `protocol.catch_up`).

Declared once as `SPEC` on `node.exchange.request_response` (frames by
`node.host.host.FramedStream`, every read and write under the host's deadline):

    client -> server   request: msgpack [since: float, min_version: int, producer: bin|nil,
                       limit: int]  (limit 1..MAX_PAGE)
    server -> client   answer:  msgpack [ids: [bin32...], ats: [float...], more: bool]

One question per stream. The answer lists rollouts the server holds *with a body*,
received at or after `since` in the server's clock, oldest first. The client trusts
nothing in it: the ids it lacks are pulled over the body stream
(`node.exchange.rollouts`) and admitted like any pulled record; a malformed answer ends the
exchange (`BadResponse`, a `PeerError`), a malformed request ends the stream (`BadRequest`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from node.exchange.fields import Fields, Nullable, Number
from node.exchange.request_response import (
    BadRequest,
    BadRequestHook,
    BadResponse,
    ExchangeSpec,
    Inbound,
    MsgpackCodec,
    Server,
    StreamHost,
    request,
)
from protocol.schema import U64, Bool, Bytes, Int, ListOf

__all__ = ["SPEC", "BadRequest", "BadResponse", "Lookup", "ask", "protocol_id", "server"]

MAX_PAGE = 4096
ID_SIZE = 32
MAX_REQUEST_BYTES = 128
MAX_ANSWER_BYTES = 16 + MAX_PAGE * (ID_SIZE + 2 + 9)

Question = tuple[float, int, bytes | None, int]
Page = tuple[tuple[bytes, ...], tuple[float, ...], bool]


def _same_lengths(page: Page) -> str | None:
    return None if len(page[0]) == len(page[1]) else "ids and ats differ in length"


SPEC: ExchangeSpec[Question, Page] = ExchangeSpec(
    name="catch-up",
    protocol="/swarm-rl/{run}/sync/1",
    request=MsgpackCodec(
        "catch-up request",
        Fields((Number(), Int(*U64), Nullable(Bytes(64)), Int(1, MAX_PAGE))),
        MAX_REQUEST_BYTES,
        limits={"max_bin_len": 64},
    ),
    response=MsgpackCodec(
        "catch-up answer",
        Fields(
            (
                ListOf(Bytes(ID_SIZE, sizes=(ID_SIZE,)), MAX_PAGE),
                ListOf(Number(), MAX_PAGE),
                Bool(),
            )
        ),
        MAX_ANSWER_BYTES,
        limits={"max_bin_len": ID_SIZE, "max_array_len": MAX_PAGE},
        check=_same_lengths,
    ),
    bad_request="bad catch-up request",
)


def protocol_id(run_id: str) -> str:
    """The catch-up protocol id of run `run_id`."""
    return SPEC.for_run(run_id).protocol


Lookup = Callable[[float, int, bytes | None, int], Awaitable[tuple[list[bytes], list[float], bool]]]


def server(
    run_id: str,
    lookup: Lookup,
    on_offered: Callable[[int], None],
    on_bad_request: BadRequestHook | None = None,
) -> Server[Question, Page]:
    """The catch-up server of run `run_id`: one question per stream, answered with
    `lookup(since, min_version, producer, limit)`; `on_offered(n)` counts the ids offered."""

    async def answer(call: Inbound[Page], question: Question) -> None:
        ids, ats, more = await lookup(*question)
        await call.reply((ids, ats, more))  # type: ignore[arg-type]  # lists pack as arrays
        on_offered(len(ids))

    return Server(SPEC.for_run(run_id), answer, on_bad_request)


async def ask(
    host: StreamHost,
    peer: str,
    run_id: str,
    since: float,
    min_version: int,
    producer: bytes | None,
    limit: int,
) -> Page:
    """One question to `peer`: (ids, ats, more). Raises `PeerError`."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_PAGE}")
    return await request(
        host, peer, SPEC.for_run(run_id), (float(since), int(min_version), producer, int(limit))
    )
