"""Telling a peer we refuse it, and hearing that a peer refuses us (`/swarm-rl/goodbye/1`).

Before the host closes a peer it banned (when it bans it, and when the banned peer connects
again) or a newcomer it refuses at its connection cap, it sends that peer one short goodbye: why, and until when (unix time), signed with
the host's key over a domain-separated message that names the receiver. Bounded: one frame
of at most `MAX_GOODBYE_BYTES`, `GOODBYE_S` to open, send and close it (in up to
`SEND_ATTEMPTS` tries), at most one goodbye to a peer every `REPEAT_S` (a banned peer
redialling in a loop gets no more); the disconnects of a peer being banned wait for its
goodbye at most `2 * GOODBYE_S`.

A goodbye received is for display only: the refused node logs it and shows it in its
`status.json` (`dropped_by`) and metrics, as a `PeerEvent("told", peer, reason, until)`.
It never changes a score, a ban or a dial, so an unsolicited goodbye costs nobody anything;
one that is garbage or not signed by the peer on the stream is dropped (logged at debug),
never charged, and its "until" is clamped to `MAX_UNTIL_S` from now.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgpack
import trio

from node.host.framed_stream import FramedStream, PeerError
from protocol.identity import Identity, peer_id_from_b58, verify_signature

__all__ = ["GOODBYE_PROTOCOL", "Goodbye", "Goodbyes", "goodbye_message", "parse_goodbye"]

log = logging.getLogger("swarm.host")

GOODBYE_PROTOCOL = "/swarm-rl/goodbye/1"
GOODBYE_S = 4.0
SEND_ATTEMPTS = 3
RETRY_PAUSE_S = 0.3
REPEAT_S = 60.0
MAX_GOODBYE_BYTES = 512
MAX_REASON_CHARS = 160
MAX_UNTIL_S = 7 * 86400.0
KEEP_PEERS = 1024  # peers remembered for REPEAT_S
_DOMAIN = b"swarm-rl/goodbye/1\0"
_UNTIL = struct.Struct(">Q")


class Goodbye:
    """A refusal a peer told us about."""

    __slots__ = ("reason", "until")

    def __init__(self, reason: str, until: float) -> None:
        self.reason = reason
        self.until = until


def _signed_part(receiver: bytes, reason: str, until_ms: int) -> bytes:
    return _DOMAIN + receiver + b"\0" + reason.encode() + b"\0" + _UNTIL.pack(until_ms)


def goodbye_message(identity: Identity, receiver: str, reason: str, until: float) -> bytes:
    """The frame telling `receiver` (base58 peer id) it is refused for `reason` until `until`."""
    reason = reason[:MAX_REASON_CHARS]
    until_ms = max(0, int(until * 1000))
    sig = identity.sign(_signed_part(peer_id_from_b58(receiver), reason, until_ms))
    return bytes(msgpack.packb([1, reason, until_ms, sig], use_bin_type=True) or b"")


def parse_goodbye(data: bytes, sender: str, receiver: str, now: float) -> Goodbye | None:
    """The goodbye in `data` if it is well formed and signed by `sender` for `receiver`;
    None otherwise. Its reason is made printable and short, its "until" clamped."""
    try:
        value = msgpack.unpackb(
            data, raw=False, strict_map_key=True, max_bin_len=128, max_str_len=4 * MAX_REASON_CHARS
        )
        version, reason, until_ms, sig = value
        ok = (
            version == 1
            and isinstance(reason, str)
            and isinstance(until_ms, int)
            and isinstance(sig, bytes)
        )
        if not ok or not 0 <= until_ms < 2**63 or len(reason) > MAX_REASON_CHARS:
            return None
        signed = _signed_part(peer_id_from_b58(receiver), reason, until_ms)
        if not verify_signature(peer_id_from_b58(sender), signed, sig):
            return None
    except Exception:  # garbage of any shape: nothing to show
        return None
    shown = "".join(c if c.isprintable() else "?" for c in reason) or "-"
    return Goodbye(shown, min(until_ms / 1000, now + MAX_UNTIL_S))


async def _until_remote_closed(stream: Any) -> None:
    """Wait for the receiver to close its side, which it does once it has read the frame:
    the caller closes the connection next, and a frame still in flight would be lost with
    it (and a redial within `REPEAT_S` is not told again)."""
    with contextlib.suppress(PeerError):
        await stream.read_exactly(1)


class StreamOpener(Protocol):
    """What goodbyes need of the host: its peer id and outbound streams."""

    peer_id: str

    async def open_stream(self, peer: str, protocol: str) -> FramedStream: ...


class Goodbyes:
    """The host's side of the goodbye protocol: saying it (rate-limited) and hearing it."""

    def __init__(
        self, host: StreamOpener, private_bytes: bytes, emit: Callable[[str, Goodbye], None]
    ) -> None:
        self.host = host
        self.identity = Identity.from_private_bytes(private_bytes)
        self.emit = emit
        # peer -> (when we last told it, what we told it), the oldest first
        self._said: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._sending: set[str] = set()  # peers being told now
        self._pending: dict[str, tuple[float, trio.Event]] = {}  # peer -> (since, said)
        self.said = 0
        self.heard = 0

    def expect(self, peer: str) -> None:
        """A goodbye to `peer` is on its way (a ban being stored): its disconnects wait for
        it (`settled`), at most `2 * GOODBYE_S` from now."""
        if peer not in self._pending and len(self._pending) < KEEP_PEERS:
            self._pending[peer] = (time.monotonic(), trio.Event())

    async def settled(self, peer: str) -> None:
        """Return once no goodbye to `peer` is on its way (or its time is up)."""
        pending = self._pending.get(peer)
        if pending is not None:
            with trio.move_on_after(pending[0] + 2 * GOODBYE_S - time.monotonic()):
                await pending[1].wait()
            self._pending.pop(peer, None)

    async def refuse(
        self, peer: str, until: float, close: Callable[[str], Awaitable[None]], reason: str = ""
    ) -> None:
        """A peer we refuse connected: tell it why (`reason`, or what we told it at its ban),
        then close. A peer told within `REPEAT_S` is closed at once (a redial loop gets no
        more)."""
        reason = reason or (self._said[peer][1] if peer in self._said else "banned")
        await self.say(peer, reason, until)
        await close(peer)

    async def say(self, peer: str, reason: str, until: float) -> None:
        """Tell `peer` it is refused, unless told within `REPEAT_S` (or being told now);
        never raises, never takes longer than `GOODBYE_S`."""
        try:
            last = self._said.get(peer)
            if (
                last is not None and time.monotonic() - last[0] < REPEAT_S
            ) or peer in self._sending:
                return
            self._sending.add(peer)
            try:
                with trio.move_on_after(GOODBYE_S):
                    await self._send(peer, reason, until)
            finally:
                self._sending.discard(peer)
        finally:
            pending = self._pending.pop(peer, None)
            if pending is not None:
                pending[1].set()

    async def _send(self, peer: str, reason: str, until: float) -> None:
        for attempt in range(SEND_ATTEMPTS):  # a connection still being set up refuses streams
            try:
                stream = await self.host.open_stream(peer, GOODBYE_PROTOCOL)
                try:
                    await stream.send(goodbye_message(self.identity, peer, reason, until))
                except BaseException:
                    await stream.close()
                    raise
                break
            except Exception as exc:  # a peer gone already (PeerError...): nothing to tell
                log.debug("goodbye to %s not sent (attempt %d): %s", peer[:12], attempt + 1, exc)
                await trio.sleep(RETRY_PAUSE_S)
        else:
            return
        # Said once sent: a receiver that never closes its side gets no second goodbye
        # within REPEAT_S however often it redials.
        self.said += 1
        self._said.pop(peer, None)
        self._said[peer] = (time.monotonic(), reason)  # the latest last
        while len(self._said) > KEEP_PEERS:
            self._said.popitem(last=False)
        try:
            await stream.close()
            await _until_remote_closed(stream)
        finally:
            await stream.close()

    async def serve(self, stream: Any) -> None:
        """One goodbye frame from the peer on `stream`: shown, never acted on."""
        with trio.move_on_after(GOODBYE_S):
            data = await stream.receive(MAX_GOODBYE_BYTES)
            told = parse_goodbye(data, stream.peer, self.host.peer_id, time.time())
            if told is None:
                log.debug(
                    "goodbye from %s ignored: not well formed or not signed by it", stream.peer[:12]
                )
                return
            self.heard += 1
            self.emit(stream.peer, told)
