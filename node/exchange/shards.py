"""The weight shard stream protocol `/swarm-rl/<run>/shard/1`: have-maps, manifests, shards.

One request per stream, every frame length-prefixed by `node.host.host.FramedStream`, every
read and write under the host's I/O deadline:

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

import msgpack
import trio

from node.host.host import FramedStream, PeerError, SwarmHost
from node.weights.upload_limit import UploadLimiter
from protocol.shard_schedule import (
    HAVE_DEBOUNCE_S,
    HAVE_KEEPALIVE_S,
    MAX_WATCHES_PER_PEER,
    WATCH_MAX_S,
    pushes_too_fast,
)
from protocol.wire import MAX_SHARD_BYTES, WeightManifest

CHUNK = 1024 * 1024
MAX_REQUEST_BYTES = 128
MAX_HAVE_ENTRIES = 256
MAX_HAVE_BYTES = MAX_HAVE_ENTRIES * (40 + 65_536 // 8)
MAX_ENVELOPE_BYTES = WeightManifest.MAX_BYTES + 1024


class BadRequest(PeerError):
    """The client sent something that is not a shard-protocol request."""


class ShardFailed(PeerError):
    """A shard transfer broke: size mismatch, truncated, or refused."""


class ShardBusy(PeerError):
    """The server holds the shard but its uplink is full (`upload_busy`): no blame."""


class Busy(Exception):
    """Raised by a server's shard callback: answer "busy" (-2)."""


def protocol_id(run_id: str) -> str:
    return f"/swarm-rl/{run_id}/shard/1"


def bitfield(indices: Iterable[int], n: int) -> bytes:
    out = bytearray((n + 7) // 8)
    for i in indices:
        if 0 <= i < n:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def from_bitfield(bits: bytes, n: int) -> set[int]:
    return {i for i in range(min(n, len(bits) * 8)) if bits[i // 8] >> (i % 8) & 1}


def decode_request(peer: str, data: bytes) -> list:  # type: ignore[type-arg]
    try:
        req = msgpack.unpackb(data, raw=False, max_bin_len=32, max_str_len=16, max_array_len=3)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadRequest(peer, f"shard request is not msgpack: {exc}") from None
    ok = (
        isinstance(req, list)
        and req
        and (
            req == ["watch"]
            or req == ["newest"]
            or (
                len(req) == 2
                and req[0] == "manifest"
                and isinstance(req[1], bytes)
                and len(req[1]) == 32
            )
            or (
                len(req) == 3
                and req[0] == "shard"
                and isinstance(req[1], bytes)
                and len(req[1]) == 32
                and isinstance(req[2], int)
                and 0 <= req[2] < 65_536
            )
        )
    )
    if not ok:
        raise BadRequest(peer, "not a shard request")
    return req


# -- server ---------------------------------------------------------------------------------

HaveFn = Callable[[], Awaitable[list[tuple[bytes, bytes]]]]
ChangedFn = Callable[[float], Awaitable[None]]  # returns at a change, or after the timeout
ManifestFn = Callable[[bytes], Awaitable[bytes | None]]
NewestFn = Callable[[], Awaitable[bytes | None]]
ShardFn = Callable[[bytes, int], Awaitable[bytes | None]]


async def serve(
    stream: FramedStream,
    limiter: UploadLimiter,
    have: HaveFn,
    changed: ChangedFn,
    manifest: ManifestFn,
    shard: ShardFn,
    watching: dict[str, int],
    newest: NewestFn,
) -> int:
    """Answer one request; returns the shard bytes uploaded (0 for other requests).
    `watching`: the node's count of watches served per peer (this call keeps it)."""
    try:
        frame = await stream.receive(MAX_REQUEST_BYTES)
    except PeerError:
        return 0
    req = decode_request(stream.peer, frame)
    if req[0] == "watch":
        if watching.get(stream.peer, 0) >= MAX_WATCHES_PER_PEER:
            return 0  # closed at once: the asker already has its watch
        watching[stream.peer] = watching.get(stream.peer, 0) + 1
        try:
            await _serve_watch(stream, have, changed)
        finally:
            watching[stream.peer] -= 1
            if not watching[stream.peer]:
                del watching[stream.peer]
        return 0
    if req[0] == "manifest":
        await stream.send(await manifest(req[1]) or b"")
        return 0
    if req[0] == "newest":
        await stream.send(await newest() or b"")
        return 0
    try:
        data = await shard(req[1], req[2])
    except Busy:
        await stream.send(msgpack.packb([-2]))
        return 0
    if data is None:
        await stream.send(msgpack.packb([-1]))
        return 0
    await stream.send(msgpack.packb([len(data)]))
    view = memoryview(data)
    with limiter.sending(len(data)) as sending:
        for start in range(0, len(data), CHUNK):
            piece = view[start : start + CHUNK]
            await limiter.acquire(len(piece), len(data) - start)
            await stream.send(piece)
            sending.sent(len(piece))
    return len(data)


async def _serve_watch(stream: FramedStream, have: HaveFn, changed: ChangedFn) -> None:
    """Push have-maps until WATCH_MAX_S has passed (or the stream breaks: `PeerError`)."""
    end = trio.current_time() + WATCH_MAX_S
    last: list[tuple[bytes, bytes]] | None = None
    sent_at = -HAVE_KEEPALIVE_S
    while trio.current_time() < end:
        entries = (await have())[:MAX_HAVE_ENTRIES]
        now = trio.current_time()
        if entries != last or now - sent_at >= HAVE_KEEPALIVE_S:
            await stream.send(msgpack.packb([[m, b] for m, b in entries], use_bin_type=True))
            last, sent_at = entries, now
        await changed(max(0.0, sent_at + HAVE_KEEPALIVE_S - trio.current_time()))
        await trio.sleep(HAVE_DEBOUNCE_S)


# -- client ---------------------------------------------------------------------------------


async def _request(host: SwarmHost, peer: str, run_id: str, req: list) -> FramedStream:  # type: ignore[type-arg]
    stream = await host.open_stream(peer, protocol_id(run_id))
    try:
        await stream.send(msgpack.packb(req, use_bin_type=True))
    except BaseException:
        await stream.reset()
        raise
    return stream


async def watch_have(
    host: SwarmHost,
    peer: str,
    run_id: str,
    on_have: Callable[[dict[bytes, bytes]], Awaitable[None]],
) -> None:
    """Call `on_have({manifest id: bitfield})` (unchecked beyond shape) with each have-map
    `peer` pushes, until it ends the watch (after WATCH_MAX_S: returns; we also stop
    listening a little later whatever it does) or the stream breaks, stays silent past the
    read deadline or pushes faster than `pushes_too_fast` allows (`PeerError`)."""
    opened = trio.current_time()
    stream = await _request(host, peer, run_id, ["watch"])
    frames = 0
    try:
        while (now := trio.current_time()) < opened + WATCH_MAX_S + 2 * HAVE_KEEPALIVE_S:
            if pushes_too_fast(frames, now - opened):
                raise ShardFailed(peer, "have-maps pushed faster than the protocol allows")
            try:
                raw = await stream.receive(MAX_HAVE_BYTES)
            except PeerError:
                if trio.current_time() >= opened + WATCH_MAX_S:
                    return  # the server ended it, as it should
                raise
            frames += 1
            await on_have(_parse_have(peer, raw))
    finally:
        await stream.close()


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


async def fetch_manifest(
    host: SwarmHost, peer: str, run_id: str, manifest_id: bytes
) -> bytes | None:
    stream = await _request(host, peer, run_id, ["manifest", manifest_id])
    try:
        return await stream.receive(MAX_ENVELOPE_BYTES) or None
    finally:
        await stream.close()


async def fetch_newest(host: SwarmHost, peer: str, run_id: str) -> bytes | None:
    """The envelope of the newest manifest `peer` says it installed (unchecked), or None."""
    stream = await _request(host, peer, run_id, ["newest"])
    try:
        return await stream.receive(MAX_ENVELOPE_BYTES) or None
    finally:
        await stream.close()


async def fetch_shard(
    host: SwarmHost, peer: str, run_id: str, manifest_id: bytes, index: int, size: int
) -> bytes | None:
    """The shard's bytes (exactly `size` of them, digest unchecked), or None if the peer
    does not hold it. Raises `PeerError` subclasses on a broken or wrong-sized transfer."""
    stream = await _request(host, peer, run_id, ["shard", manifest_id, index])
    try:
        await stream.expect(64 + size)
        head = msgpack.unpackb(await stream.receive(64))
        if head == [-1]:
            return None
        if head == [-2]:
            raise ShardBusy(peer, "busy: its uplink is full")
        if not (isinstance(head, list) and len(head) == 1 and isinstance(head[0], int)):
            raise ShardFailed(peer, "bad shard header")
        if head[0] != size or size > MAX_SHARD_BYTES:
            raise ShardFailed(peer, f"shard of {head[0]} bytes announced, the manifest says {size}")
        pieces, got = [], 0
        while got < size:
            piece = await stream.receive(min(CHUNK, size - got))
            if not piece:
                raise ShardFailed(peer, "empty chunk in a shard transfer")
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ShardFailed(peer, f"bad shard header: {exc}") from None
    finally:
        await stream.close()
