"""Length-prefixed frames over a libp2p stream, and the adapter's errors.

Part of the `node.host.host` adapter (re-exported there: import these names from `node.host.host`).
Every read and write runs under the host's `io_timeout_s`; a frame over the cap is
refused before it is read.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Awaitable
from typing import Any

import libp2p.stream_muxer.yamux.yamux as _libp2p_yamux
import trio

from node.host.settings import HostSettings

_FRAME_HEADER = struct.Struct(">I")

# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


class HostError(Exception):
    """Base of every error this adapter raises."""


class ListenFailed(HostError):
    """A listen address could not be bound; the message names the address and the reason."""


class HostClosed(HostError):
    """The host is shutting down; no new work is accepted."""


class MessageTooLarge(HostError):
    """A local caller tried to send more than the configured limit (our bug, not theirs)."""


class PeerError(HostError):
    """Something went wrong with a remote peer: unreachable, too slow, or misbehaving."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(f"{peer[:16]}...: {message}" if len(peer) > 16 else f"{peer}: {message}")
        self.peer = peer


class PeerTimeout(PeerError):
    """A dial, read or write did not finish before its deadline."""


class PeerUnreachable(PeerError):
    """A dial failed, or the stream was closed or reset by the remote."""


class FrameTooLarge(PeerError):
    """The remote announced a frame above the cap; the stream was reset."""


# ---------------------------------------------------------------------------------------
# Framed streams
# ---------------------------------------------------------------------------------------


class FramedStream:
    """A libp2p stream carrying length-prefixed frames (4-byte big-endian length).

    Every read and write runs under `io_timeout_s`; a frame over `max_frame_bytes` is
    refused before it is read. Errors become `PeerTimeout`, `PeerUnreachable` or
    `FrameTooLarge`, all carrying the peer id.
    """

    def __init__(self, stream: Any, peer: str, settings: HostSettings) -> None:
        self._stream = stream
        self.peer = peer
        self._settings = settings
        self._buffer = bytearray()

    async def send(self, data: bytes | memoryview) -> None:
        """Write one frame (a 4-byte big-endian length, then `data`); `MessageTooLarge`
        over the host's frame cap."""
        if len(data) > self._settings.max_frame_bytes:
            raise MessageTooLarge(
                f"frame of {len(data)} bytes exceeds the {self._settings.max_frame_bytes} byte cap"
            )
        await self._io(self._stream.write(_FRAME_HEADER.pack(len(data)) + data), "write")

    async def receive(self, max_bytes: int | None = None) -> bytes:
        """Read one frame of at most `max_bytes` (default: the host's frame cap)."""
        cap = self._settings.max_frame_bytes if max_bytes is None else max_bytes
        header = await self._read_exactly(_FRAME_HEADER.size)
        (size,) = _FRAME_HEADER.unpack(header)
        if size > cap:
            await self.reset()
            raise FrameTooLarge(self.peer, f"announced a {size} byte frame (cap {cap})")
        return await self._read_exactly(size)

    async def expect(self, n: int) -> None:
        """Let the remote send `n` more bytes (at most Yamux's largest
        window) without waiting for credit: a reply of known size does not start at
        the 256 KiB window and grows it one round trip at a time."""
        muxed = getattr(self._stream, "muxed_stream", None)
        if not isinstance(muxed, _libp2p_yamux.YamuxStream):
            return
        want = min(n, _libp2p_yamux.MAX_WINDOW_SIZE)
        async with muxed.window_lock:
            delta = want - muxed.recv_window
            if delta <= 0:
                return
            muxed.recv_window += delta
            muxed.target_recv_window = max(muxed.target_recv_window, want)
        await self._io(muxed.send_window_update(delta, skip_lock=True), "write")

    async def write_raw(self, data: bytes) -> None:
        """Write bytes as they are (for protocols that are not framed, e.g. ping)."""
        await self._io(self._stream.write(data), "write")

    async def read_exactly(self, n: int) -> bytes:
        """Read exactly `n` unframed bytes."""
        return await self._read_exactly(n)

    async def _read_exactly(self, n: int) -> bytes:
        buf = self._buffer
        if len(buf) >= n:
            data = bytes(buf[:n])
            del buf[:n]
            return data
        pieces, have = ([bytes(buf)] if buf else []), len(buf)
        buf.clear()
        while have < n:  # the pieces are joined once (a 1 MiB frame arrives in ~17)
            chunk = await self._io(self._stream.read(max(n - have, 65536)), "read")
            if not chunk:
                raise PeerUnreachable(self.peer, "stream closed by the remote mid-frame")
            pieces.append(chunk)
            have += len(chunk)
        data = b"".join(pieces)
        if have > n:
            buf += memoryview(data)[n:]
            data = data[:n]
        return data

    async def _io(self, op: Awaitable[Any], what: str) -> Any:
        try:
            with trio.fail_after(self._settings.io_timeout_s):
                return await op
        except trio.TooSlowError:
            raise PeerTimeout(
                self.peer, f"stream {what} took over {self._settings.io_timeout_s:g} s"
            ) from None
        except (trio.Cancelled, HostError):
            raise
        except Exception as exc:  # the library raises many unrelated types for a dead stream
            raise PeerUnreachable(self.peer, f"stream {what} failed: {exc!r}") from exc

    async def close(self) -> None:
        """Close our side of the stream (bounded; errors of a dead stream ignored)."""
        with trio.move_on_after(self._settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await self._stream.close()

    async def reset(self) -> None:
        """Reset the stream, both sides (bounded; errors of a dead stream ignored)."""
        with trio.move_on_after(self._settings.close_timeout_s):
            with contextlib.suppress(Exception):
                await self._stream.reset()
