"""One request/response layer under every stream protocol a peer speaks besides gossip.

A protocol is declared once, as an `ExchangeSpec`: its protocol id, the codecs of its
request and of its response (each codec carries the message's schema, built from
`protocol.schema` field types, and its byte caps), how many requests one stream may carry,
how many streams one peer may hold open at once, and how long a served stream may live.
Then:

- `serve(host, spec, handler)` answers it: each inbound stream is counted against the
  peer's concurrency limit (over it: reset at once), bounded by the deadline, and each
  request frame is read under its cap and decoded before `handler(call, request)` runs;
  the handler answers with `call.reply(response)` (once, or once per frame it streams);
- `request(host, peer, spec, req)` asks one question and returns the decoded answer;
- `open_call(host, peer, spec)` opens a stream for the exchanges of several messages
  (many batches of a pull, pushed have-maps, a shard in chunks).

Wire: a message is one or more frames of `node.host.host.FramedStream` (a 4-byte
big-endian length, then the bytes), written back to back; msgpack messages are packed with
`use_bin_type=True`. The layer adds no byte of its own, so each protocol's bytes are the
ones its codecs and its handler's reply pattern make.

Timeouts: every read and write runs under the host's I/O deadline, a served stream under
`spec.deadline_s`; a client's overall timeout is its caller's (`trio.move_on_after`),
the trio habit of reusable coroutines that take no `timeout=`.

Errors, each one line naming the peer:
- `BadRequest` / `BadResponse` (`PeerError`s): a frame that its codec refuses; a server
  reports a bad request through `on_bad_request` (the peer-score charge) and ends the stream;
- `FrameTooLarge` (from `FramedStream`): a frame announced over its cap; the stream is reset;
- `MessageTooLarge`: a message of ours over its own cap (our bug, not the peer's).
A server never lets a remote's bytes or silence end anything but that one stream.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar, cast

import msgpack
import trio

from node.host.host import FramedStream, MessageTooLarge, PeerError
from protocol.errors import RemoteProtocolError
from protocol.schema import Spec

__all__ = [
    "BadMessage",
    "BadRequest",
    "BadResponse",
    "Call",
    "Codec",
    "Frame",
    "CodecError",
    "ExchangeSpec",
    "Frames",
    "Inbound",
    "MsgpackCodec",
    "OptionalRaw",
    "Raw",
    "Server",
    "StreamHost",
    "open_call",
    "receive_message",
    "request",
    "send_message",
    "serve",
]

log = logging.getLogger("swarm.exchange")

T = TypeVar("T")
Frame = bytes | memoryview  # what a codec writes: bytes, or a view of a larger buffer
Req = TypeVar("Req")
Resp = TypeVar("Resp")

# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


class CodecError(ValueError):
    """A frame a codec cannot read; the message says what is wrong, in one line."""


class BadMessage(PeerError):
    """A peer sent a frame its codec refuses; `problem` is the reason without the peer."""

    def __init__(self, peer: str, problem: str) -> None:
        super().__init__(peer, problem)
        self.problem = problem


class BadRequest(BadMessage):
    """A client sent a request that is not one of the protocol's."""


class BadResponse(BadMessage):
    """A server answered something that is not one of the protocol's responses."""


# ---------------------------------------------------------------------------------------
# Codecs: how a message is framed, capped and validated
# ---------------------------------------------------------------------------------------


class Codec(Protocol[T]):
    """How one message travels: as `len(max_bytes)` frames, frame i at most `max_bytes[i]`.

    `decode` raises `CodecError` (or a `RemoteProtocolError`) with the reason, never
    anything else on any input.
    """

    @property
    def max_bytes(self) -> tuple[int, ...]:
        """The cap of each frame of the message, in order."""
        ...

    def encode(self, value: T) -> tuple[Frame, ...]:
        """The frames of `value`."""
        ...

    def decode(self, frames: tuple[bytes, ...]) -> T:
        """The value in `frames` (one per entry of `max_bytes`)."""
        ...


@dataclass(frozen=True, slots=True)
class Raw:
    """One frame of opaque bytes (a signed envelope, a record, a shard chunk)."""

    cap: int

    @property
    def max_bytes(self) -> tuple[int, ...]:
        """One frame of at most `cap` bytes."""
        return (self.cap,)

    def encode(self, value: Frame) -> tuple[Frame, ...]:
        """The bytes as they are."""
        return (value,)

    def decode(self, frames: tuple[bytes, ...]) -> bytes:
        """The bytes as they are."""
        return frames[0]


@dataclass(frozen=True, slots=True)
class OptionalRaw:
    """One frame of opaque bytes, or an empty frame for None ("not held")."""

    cap: int

    @property
    def max_bytes(self) -> tuple[int, ...]:
        """One frame of at most `cap` bytes."""
        return (self.cap,)

    def encode(self, value: bytes | None) -> tuple[Frame, ...]:
        """The bytes, or an empty frame for None."""
        return (value or b"",)

    def decode(self, frames: tuple[bytes, ...]) -> bytes | None:
        """The bytes, or None for an empty frame."""
        return frames[0] or None


@dataclass(frozen=True, slots=True)
class MsgpackCodec:
    """One msgpack frame whose value `schema` (a `protocol.schema.Spec`) validates.

    `limits` are `msgpack.unpackb`'s caps (`max_bin_len`, `max_array_len`...): no
    allocation past them. `check`, when given, adds a rule across fields (None = fine).
    """

    name: str
    schema: Spec
    cap: int
    limits: Mapping[str, int] = field(default_factory=dict)
    check: Callable[[Any], str | None] | None = None

    @property
    def max_bytes(self) -> tuple[int, ...]:
        """One frame of at most `cap` bytes."""
        return (self.cap,)

    def encode(self, value: Any) -> tuple[Frame, ...]:
        """`value` packed as msgpack (bin type for bytes)."""
        return (cast(bytes, msgpack.packb(self.schema.to_wire(value), use_bin_type=True)),)

    def decode(self, frames: tuple[bytes, ...]) -> Any:
        """The value, validated; `CodecError` naming the field that is wrong."""
        try:
            raw = msgpack.unpackb(frames[0], raw=False, **self.limits)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise CodecError(f"{self.name} is not msgpack: {exc}") from None
        try:
            value = self.schema.from_wire(raw, self.name, "value")
        except RemoteProtocolError as exc:
            raise CodecError(str(exc)) from None
        problem = self.check(value) if self.check is not None else None
        if problem is not None:
            raise CodecError(f"{self.name}: {problem}")
        return value


@dataclass(frozen=True, slots=True)
class Frames:
    """A message of several frames, one codec each (e.g. a hello and a peer list)."""

    parts: tuple[Codec[Any], ...]

    @property
    def max_bytes(self) -> tuple[int, ...]:
        """The caps of every part's frames, in order."""
        return tuple(cap for part in self.parts for cap in part.max_bytes)

    def encode(self, value: Sequence[Any]) -> tuple[Frame, ...]:
        """The frames of each part's value, in order."""
        return tuple(f for part, v in zip(self.parts, value, strict=True) for f in part.encode(v))

    def decode(self, frames: tuple[bytes, ...]) -> tuple[Any, ...]:
        """One value per part."""
        out, at = [], 0
        for part in self.parts:
            n = len(part.max_bytes)
            out.append(part.decode(frames[at : at + n]))
            at += n
        return tuple(out)


# ---------------------------------------------------------------------------------------
# The declaration of a protocol
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExchangeSpec(Generic[Req, Resp]):
    """One stream protocol, declared once (see the module docstring).

    `protocol` may hold `{run}`, filled by `for_run`. `max_streams_per_peer` and
    `deadline_s` bound the server (None: no bound beyond the host's I/O deadlines);
    `bad_request` is the reason a bad request is charged with.
    """

    name: str
    protocol: str
    request: Codec[Req]
    response: Codec[Resp]
    requests_per_stream: int = 1
    max_streams_per_peer: int | None = None
    deadline_s: float | None = None
    bad_request: str = "bad request"

    def for_run(self, run_id: str) -> ExchangeSpec[Req, Resp]:
        """This protocol in run `run_id` (its id with `{run}` filled)."""
        return replace(self, protocol=self.protocol.format(run=run_id))

    @property
    def max_request_bytes(self) -> int:
        """The largest request frame a server reads."""
        return max(self.request.max_bytes)

    @property
    def max_response_bytes(self) -> int:
        """The largest response frame a client reads."""
        return max(self.response.max_bytes)


# ---------------------------------------------------------------------------------------
# Messages over a framed stream
# ---------------------------------------------------------------------------------------


async def send_message(stream: FramedStream, codec: Codec[T], value: T) -> int:
    """Write `value` as its frames; returns the bytes written (without length prefixes).
    `MessageTooLarge` if a frame is over its own cap (our bug)."""
    frames = codec.encode(value)
    total = 0
    for frame, cap in zip(frames, codec.max_bytes, strict=True):
        if len(frame) > cap:
            raise MessageTooLarge(f"a frame of {len(frame)} bytes exceeds its {cap} byte cap")
        await stream.send(frame)
        total += len(frame)
    return total


async def receive_message(
    stream: FramedStream, codec: Codec[T], bad: type[BadMessage], max_bytes: int | None = None
) -> T:
    """Read and decode one message; a frame that does not decode raises `bad` (a
    `PeerError`). `max_bytes` tightens the cap of a one-frame message."""
    caps = codec.max_bytes
    if max_bytes is not None:
        caps = tuple(min(c, max_bytes) for c in caps)
    frames = tuple([await stream.receive(cap) for cap in caps])
    try:
        return codec.decode(frames)
    except (CodecError, RemoteProtocolError) as exc:
        raise bad(stream.peer, str(exc)) from None


# ---------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------


class StreamHost(Protocol):
    """What the layer needs of the host: registering a protocol and opening streams."""

    def set_stream_handler(
        self, protocol: str, handler: Callable[[FramedStream], Awaitable[None]]
    ) -> None:
        """Serve `protocol` with `handler(stream)` per inbound stream."""
        ...

    async def open_stream(self, peer: str, protocol: str) -> FramedStream:
        """Open a stream of `protocol` to `peer`."""
        ...


class Inbound(Generic[Resp]):
    """One inbound stream as a handler sees it: the peer, and replies to it."""

    def __init__(self, stream: FramedStream, codec: Codec[Resp]) -> None:
        self.stream = stream
        self.peer = stream.peer
        self._codec = codec
        self.sent_bytes = 0  # response bytes sent on this stream so far (all requests)

    async def reply(self, value: Resp) -> None:
        """Send one response message (a handler may send several: a streamed answer)."""
        self.sent_bytes += await send_message(self.stream, self._codec, value)


Handler = Callable[[Inbound[Resp], Req], Awaitable[None]]
BadRequestHook = Callable[[str, str], Awaitable[None] | None]


class Server(Generic[Req, Resp]):
    """The server side of one `ExchangeSpec`: call it with each inbound stream.

    Resource handling: at most `spec.max_streams_per_peer` streams per peer at once
    (another is reset and counted by `on_refused`), each for at most `spec.deadline_s`,
    reading at most `spec.requests_per_stream` requests. Error handling: a stream that
    ends, stalls or is reset ends quietly; a request its codec refuses goes to
    `on_bad_request(peer, spec.bad_request)` and ends the stream with `BadRequest`
    (the host logs it); a handler's `PeerError` ends the stream too.
    """

    def __init__(
        self,
        spec: ExchangeSpec[Req, Resp],
        handler: Handler[Resp, Req],
        on_bad_request: BadRequestHook | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.on_bad_request = on_bad_request
        self.on_refused = on_refused
        self.active: dict[str, int] = {}  # peer -> streams served now

    async def __call__(self, stream: FramedStream) -> None:
        """Serve one inbound stream (the host's stream handler)."""
        spec, peer = self.spec, stream.peer
        limit = spec.max_streams_per_peer
        if limit is not None and self.active.get(peer, 0) >= limit:
            if self.on_refused is not None:
                self.on_refused(peer)
            await stream.reset()  # a peer gets a few streams at a time, not the server
            return
        self.active[peer] = self.active.get(peer, 0) + 1
        try:
            with trio.move_on_after(
                spec.deadline_s if spec.deadline_s is not None else float("inf")
            ):
                await self._serve(stream)
        finally:
            left = self.active.get(peer, 1) - 1
            if left > 0:
                self.active[peer] = left
            else:
                self.active.pop(peer, None)

    async def _serve(self, stream: FramedStream) -> None:
        call = Inbound(stream, self.spec.response)
        for _ in range(self.spec.requests_per_stream):
            try:
                req = await receive_message(stream, self.spec.request, BadRequest)
            except BadRequest:
                if self.on_bad_request is not None:
                    charged = self.on_bad_request(stream.peer, self.spec.bad_request)
                    if inspect.isawaitable(charged):
                        await charged
                raise
            except PeerError as exc:  # closed, stalled or oversized: nothing more to do
                log.debug("%s stream from %s ended: %s", self.spec.name, stream.peer[:12], exc)
                return
            await self.handler(call, req)


def serve(
    host: StreamHost,
    spec: ExchangeSpec[Req, Resp],
    handler: Handler[Resp, Req],
    *,
    on_bad_request: BadRequestHook | None = None,
    on_refused: Callable[[str], None] | None = None,
) -> Server[Req, Resp]:
    """Answer `spec.protocol` on `host` with `handler` (see `Server`); returns the server."""
    server = Server(spec, handler, on_bad_request, on_refused)
    host.set_stream_handler(spec.protocol, server)
    return server


# ---------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------


class Call(Generic[Req, Resp]):
    """One outbound stream of a protocol: send requests, receive responses."""

    def __init__(self, stream: FramedStream, spec: ExchangeSpec[Req, Resp]) -> None:
        self.stream = stream
        self.peer = stream.peer
        self.spec = spec

    async def send(self, req: Req) -> None:
        """Send one request message."""
        await send_message(self.stream, self.spec.request, req)

    async def receive(self, max_bytes: int | None = None) -> Resp:
        """Read one response message (`max_bytes` may tighten its cap); `BadResponse`
        if it does not decode, `FrameTooLarge` if announced over the cap."""
        return await receive_message(self.stream, self.spec.response, BadResponse, max_bytes)

    async def expect(self, n: int) -> None:
        """Let the server send `n` more bytes without waiting for flow-control credit."""
        await self.stream.expect(n)


@contextlib.asynccontextmanager
async def open_call(
    host: StreamHost, peer: str, spec: ExchangeSpec[Req, Resp]
) -> AsyncIterator[Call[Req, Resp]]:
    """A stream of `spec.protocol` to `peer`, closed on exit. Raises `PeerError`."""
    stream = await host.open_stream(peer, spec.protocol)
    try:
        yield Call(stream, spec)
    finally:
        await stream.close()


async def request(host: StreamHost, peer: str, spec: ExchangeSpec[Req, Resp], req: Req) -> Resp:
    """Ask `peer` one question on a new stream; returns its decoded answer. Raises
    `PeerError` (unreachable, too slow, oversized, `BadResponse`)."""
    async with open_call(host, peer, spec) as call:
        await call.send(req)
        return await call.receive()
