"""The weight shard stream protocol `/swarm-rl/<run>/shard/1`: have-maps, manifests, shards.

One request per stream, declared once as `SPEC` on `node.exchange.request_response` (every
frame length-prefixed by `node.host.host.FramedStream`, every read and write under the host's
I/O deadline); the responses are raw frames whose shape depends on the request:

    client -> server   request frame, msgpack array:
                         ["watch"]                    tell me what you hold, and each change
                         ["manifest", id]             the signed manifest envelope `id`
                         ["newest"]                   the signed manifest envelope of the
                                                      newest version installed
                         ["shard", id, index]         the bytes of one shard
    server -> client   "watch":    have-map frames, each a msgpack array of
                                   [manifest id (32 bytes), bitfield] (bit i, LSB-first per
                                   byte, set = shard i held, verified): one at once, then one
                                   whenever it changes (at most every HAVE_DEBOUNCE_S) and
                                   the same one again after HAVE_KEEPALIVE_S without a
                                   change; the server ends the stream after WATCH_MAX_S,
                                   and serves one peer at most MAX_WATCHES_PER_PEER at
                                   once (the constants and the rule a client applies,
                                   `pushes_too_fast`, are `protocol.shard_schedule`'s)
                       "manifest", "newest": the envelope bytes, or an empty frame
                       "shard":    a header frame msgpack [size] (size -1: not held, or
                                   not now: first copies first; -2: busy, the uplink is
                                   full), then the bytes in frames of at most CHUNK bytes

Have-maps are pushed, BitTorrent's HAVE messages in spirit: one long-lived stream per
pair of peers costs nothing while nothing changes, where polling cost two stream setups
(multistream negotiation, Noise, Yamux window updates) per peer pair and poll period,
which kept 2 shared cores busy with 9 idle peers.

The server only sends what it verified (the store holds nothing else) and paces every
chunk through the node's `UploadLimiter`. The client trusts nothing: manifests go through
admission, a shard's size and digest are checked by the caller against the signed
manifest (`ShardFailed` here means a broken transfer: truncated, oversized, too slow).
"newest" backs a claim: a peer that handed us a message of a version we have not heard of
is asked for it (`protocol.version_claims`); its answer goes through admission.
A request that is not one of these forms costs the sender (`BadRequest`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import msgpack
import trio

from node.exchange.fields import Const, Fields, OneOf
from node.exchange.request_response import (
    BadRequest,
    BadRequestHook,
    Call,
    ExchangeSpec,
    Frame,
    Inbound,
    MsgpackCodec,
    Raw,
    Server,
    StreamHost,
    open_call,
)
from node.host.host import PeerError
from node.weights.upload_limit import UploadLimiter
from protocol.schema import Bytes, Int
from protocol.shard_schedule import (
    HAVE_DEBOUNCE_S,
    HAVE_KEEPALIVE_S,
    MAX_WATCHES_PER_PEER,
    WATCH_MAX_S,
    pushes_too_fast,
)
from protocol.wire import MAX_SHARD_BYTES, WeightManifest

__all__ = [
    "SPEC",
    "BadRequest",
    "Busy",
    "ShardBusy",
    "ShardFailed",
    "bitfield",
    "fetch_manifest",
    "fetch_newest",
    "fetch_shard",
    "from_bitfield",
    "protocol_id",
    "server",
    "watch_have",
]

CHUNK = 1024 * 1024
MAX_REQUEST_BYTES = 128
MAX_HAVE_ENTRIES = 256
MAX_HAVE_BYTES = MAX_HAVE_ENTRIES * (40 + 65_536 // 8)
MAX_ENVELOPE_BYTES = WeightManifest.MAX_BYTES + 1024
MAX_HEADER_BYTES = 64


class ShardFailed(PeerError):
    """A shard transfer broke: size mismatch, truncated, or refused."""


class ShardBusy(PeerError):
    """The server holds the shard but its uplink is full (`upload_busy`): no blame."""


class Busy(Exception):
    """Raised by a server's shard callback: answer "busy" (-2)."""


_ID = Bytes(32, sizes=(32,))

SPEC: ExchangeSpec[Any, Frame] = ExchangeSpec(
    name="shard",
    protocol="/swarm-rl/{run}/shard/1",
    request=MsgpackCodec(
        "shard request",
        OneOf(
            (
                Fields((Const("watch"),)),
                Fields((Const("newest"),)),
                Fields((Const("manifest"), _ID)),
                Fields((Const("shard"), _ID, Int(0, 65_535))),
            ),
            "a shard request",
        ),
        MAX_REQUEST_BYTES,
        limits={"max_bin_len": 32, "max_str_len": 16, "max_array_len": 3},
    ),
    response=Raw(max(CHUNK, MAX_HAVE_BYTES, MAX_ENVELOPE_BYTES)),
    bad_request="bad shard request",
)


def _pack(value: Any) -> bytes:
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def protocol_id(run_id: str) -> str:
    """The shard protocol id of run `run_id`."""
    return SPEC.for_run(run_id).protocol


def bitfield(indices: Iterable[int], n: int) -> bytes:
    """The have-map bitfield of `indices` among `n` shards (bit i LSB-first per byte)."""
    out = bytearray((n + 7) // 8)
    for i in indices:
        if 0 <= i < n:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def from_bitfield(bits: bytes, n: int) -> set[int]:
    """The shard indices set in a have-map bitfield of `n` shards."""
    return {i for i in range(min(n, len(bits) * 8)) if bits[i // 8] >> (i % 8) & 1}


# -- server ---------------------------------------------------------------------------------

HaveFn = Callable[[], Awaitable[list[tuple[bytes, bytes]]]]
ChangedFn = Callable[[float], Awaitable[None]]  # returns at a change, or after the timeout
ManifestFn = Callable[[bytes], Awaitable[bytes | None]]
NewestFn = Callable[[], Awaitable[bytes | None]]
ShardFn = Callable[[bytes, int], Awaitable[bytes | None]]


def server(
    limiter: UploadLimiter,
    have: HaveFn,
    changed: ChangedFn,
    manifest: ManifestFn,
    shard: ShardFn,
    watching: dict[str, int],
    newest: NewestFn,
    on_uploaded: Callable[[int], None],
    on_bad_request: BadRequestHook | None = None,
) -> Server[Any, Frame]:
    """The shard server: call it with each inbound stream; one request per stream.
    `watching`: the node's count of watches served per peer (the server keeps it);
    `on_uploaded(n)` runs after a shard of `n` > 0 bytes went out."""

    async def answer(call: Inbound[Frame], req: Any) -> None:
        peer = call.peer
        if req[0] == "watch":
            if watching.get(peer, 0) >= MAX_WATCHES_PER_PEER:
                return  # closed at once: the asker already has its watch
            watching[peer] = watching.get(peer, 0) + 1
            try:
                await _serve_watch(call, have, changed)
            finally:
                watching[peer] -= 1
                if not watching[peer]:
                    del watching[peer]
            return
        if req[0] == "manifest":
            await call.reply(await manifest(req[1]) or b"")
            return
        if req[0] == "newest":
            await call.reply(await newest() or b"")
            return
        try:
            data = await shard(req[1], req[2])
        except Busy:
            await call.reply(_pack([-2]))
            return
        if data is None:
            await call.reply(_pack([-1]))
            return
        await call.reply(_pack([len(data)]))
        view = memoryview(data)
        with limiter.sending(len(data)) as sending:
            for start in range(0, len(data), CHUNK):
                piece = view[start : start + CHUNK]
                await limiter.acquire(len(piece), len(data) - start)
                await call.reply(piece)
                sending.sent(len(piece))
        if data:
            on_uploaded(len(data))

    return Server(SPEC, answer, on_bad_request)


async def _serve_watch(call: Inbound[Frame], have: HaveFn, changed: ChangedFn) -> None:
    """Push have-maps until WATCH_MAX_S has passed (or the stream breaks: `PeerError`)."""
    end = trio.current_time() + WATCH_MAX_S
    last: list[tuple[bytes, bytes]] | None = None
    sent_at = -HAVE_KEEPALIVE_S
    while trio.current_time() < end:
        entries = (await have())[:MAX_HAVE_ENTRIES]
        now = trio.current_time()
        if entries != last or now - sent_at >= HAVE_KEEPALIVE_S:
            await call.reply(_pack([[m, b] for m, b in entries]))
            last, sent_at = entries, now
        await changed(max(0.0, sent_at + HAVE_KEEPALIVE_S - trio.current_time()))
        await trio.sleep(HAVE_DEBOUNCE_S)


# -- client ---------------------------------------------------------------------------------


async def watch_have(
    host: StreamHost,
    peer: str,
    run_id: str,
    on_have: Callable[[dict[bytes, bytes]], Awaitable[None]],
) -> None:
    """Call `on_have({manifest id: bitfield})` (unchecked beyond shape) with each have-map
    `peer` pushes, until it ends the watch (after WATCH_MAX_S: returns; we also stop
    listening a little later whatever it does) or the stream breaks, stays silent past the
    read deadline or pushes faster than `pushes_too_fast` allows (`PeerError`)."""
    opened = trio.current_time()
    async with open_call(host, peer, SPEC.for_run(run_id)) as call:
        await call.send(("watch",))
        frames = 0
        while (now := trio.current_time()) < opened + WATCH_MAX_S + 2 * HAVE_KEEPALIVE_S:
            if pushes_too_fast(frames, now - opened):
                raise ShardFailed(peer, "have-maps pushed faster than the protocol allows")
            try:
                raw = await call.receive(MAX_HAVE_BYTES)
            except PeerError:
                if trio.current_time() >= opened + WATCH_MAX_S:
                    return  # the server ended it, as it should
                raise
            frames += 1
            await on_have(_parse_have(peer, bytes(raw)))


def _parse_have(peer: str, raw: bytes) -> dict[bytes, bytes]:
    try:
        entries = msgpack.unpackb(raw, raw=False, max_array_len=MAX_HAVE_ENTRIES, max_str_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ShardFailed(peer, f"have-map is not msgpack: {exc}") from None
    out: dict[bytes, bytes] = {}
    for e in entries if isinstance(entries, list) else ():
        if (
            isinstance(e, list)
            and len(e) == 2
            and isinstance(e[0], bytes)
            and len(e[0]) == 32
            and isinstance(e[1], bytes)
        ):
            out[e[0]] = e[1]
    return out


async def _ask_envelope(host: StreamHost, peer: str, run_id: str, req: Any) -> bytes | None:
    async with open_call(host, peer, SPEC.for_run(run_id)) as call:
        await call.send(req)
        return bytes(await call.receive(MAX_ENVELOPE_BYTES)) or None


async def fetch_manifest(
    host: StreamHost, peer: str, run_id: str, manifest_id: bytes
) -> bytes | None:
    """The signed manifest envelope `manifest_id` as `peer` holds it (unchecked), or None."""
    return await _ask_envelope(host, peer, run_id, ("manifest", manifest_id))


async def fetch_newest(host: StreamHost, peer: str, run_id: str) -> bytes | None:
    """The envelope of the newest manifest `peer` says it installed (unchecked), or None."""
    return await _ask_envelope(host, peer, run_id, ("newest",))


async def fetch_shard(
    host: StreamHost, peer: str, run_id: str, manifest_id: bytes, index: int, size: int
) -> bytes | None:
    """The shard's bytes (exactly `size` of them, digest unchecked), or None if the peer
    does not hold it. Raises `PeerError` subclasses on a broken or wrong-sized transfer."""
    async with open_call(host, peer, SPEC.for_run(run_id)) as call:
        await call.send(("shard", manifest_id, index))
        return await _receive_shard(call, peer, size)


async def _receive_shard(call: Call[Any, Frame], peer: str, size: int) -> bytes | None:
    try:
        await call.expect(MAX_HEADER_BYTES + size)
        head = msgpack.unpackb(await call.receive(MAX_HEADER_BYTES))
        if head == [-1]:
            return None
        if head == [-2]:
            raise ShardBusy(peer, "busy: its uplink is full")
        if not (isinstance(head, list) and len(head) == 1 and isinstance(head[0], int)):
            raise ShardFailed(peer, "bad shard header")
        if head[0] != size or size > MAX_SHARD_BYTES:
            raise ShardFailed(peer, f"shard of {head[0]} bytes announced, the manifest says {size}")
        pieces: list[Frame] = []
        got = 0
        while got < size:
            piece = await call.receive(min(CHUNK, size - got))
            if not piece:
                raise ShardFailed(peer, "empty chunk in a shard transfer")
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ShardFailed(peer, f"bad shard header: {exc}") from None
