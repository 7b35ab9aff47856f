"""Every process-wide patch of py-libp2p 0.8.1 internals, in one place.

`apply()` installs them all (idempotent); `node.host.host.SwarmHost` calls it before it builds
a host, so any process that runs a `SwarmHost` runs with all of them. A process that
never imports this module speaks the library's defaults: the patches change only what
this side does, never the bytes another implementation must understand (the interop
tests in `tests/test_node_interop.py` run us against an unpatched py-libp2p and
js-libp2p). Numbers follow the workaround list in `node/host/host.py`.

Each patch, the library default it fixes, and the test that fails if it comes back:

6.  Subscription queue of 32 messages, overflow dropped with a warning ->
    `pubsub.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_QUEUE`.
    tests/test_node_host.py::test_gossipsub_settings_are_ours,
    ::test_burst_of_50_publishes_in_one_second_all_arrive
16. Listen sockets get SO_REUSEPORT (DCUtR's TCP hole punch dials from the listen port,
    which needs it on both sockets), so two nodes "share" a port -> the listener first
    claims the port with a plain socket (`_exclusive_listen`: a port someone listens on
    is refused as in use), then listens with SO_REUSEPORT as the library does.
    tests/test_node_host.py::test_two_hosts_cannot_share_a_port_so_reuseport_is_off,
    tests/test_node_nat.py::test_hole_punch_dials_can_leave_from_our_listen_port
17. Identify says `py-libp2p/<version>` -> `identify.AGENT_VERSION = AGENT`.
    tests/test_node_standard_peer.py::test_a_standard_libp2p_peer_stays_connected_and_sees_our_agent
18a. A GossipSub RPC that is not protobuf raises `DecodeError` out of the stream reader
    and crashes the host -> `Pubsub.continuously_read_stream` resets that stream.
    tests/test_node_standard_peer.py::test_garbage_gossipsub_rpc_does_not_crash_the_host
18b. Banning (blacklist teardown) a peer that already left raises `KeyError` ->
    `Pubsub._teardown_if_connected` tolerates it.
    tests/test_node_host.py::test_banning_connected_peers_does_not_crash (exercises the
    path; the race did not reproduce without the patch on a quiet machine)
19. A full Yamux frame is 17 bytes over one Noise plaintext (two Noise messages per
    frame); a window update after every read; two socket reads per Noise message ->
    `yamux.MAX_MESSAGE_SIZE` = Noise's largest plaintext, `_yamux_release_on_read` off
    (`_batched_window_updates`), `TrioTCPStream.read` through a read-ahead buffer
    (`_buffered_tcp_read`).
    tests/test_node_host.py::test_bulk_frames_cost_one_noise_message_per_yamux_frame_and_few_socket_calls
20. Each 64 KiB frame paid the whole write path, each received frame was copied ~10
    times -> `YamuxStream.write` replaced (`_yamux_write_batched`: the frames the window
    allows, one write), `BaseNoiseMsgReadWriter.write_msg` (`_noise_write_batched`: one
    socket write for several Noise messages), `read_exactly` in msgio and yamux
    (`_read_exactly_whole`), `SecureSession._fill/_drain` (views, no BytesIO).
    tests/test_node_host.py::test_bulk_frames_cost_one_noise_message_per_yamux_frame_and_few_socket_calls,
    ::test_received_bytes_are_handed_on_without_copies
21. A writer out of send window polled every 10 ms -> `YamuxStream.__init__` installs
    `_WindowLock`, which wakes it at the window update.
    tests/test_node_host.py::test_a_writer_out_of_window_wakes_at_the_window_update_not_a_poll
23. Two round trips of multistream-select per stream -> `MultiselectClient.select_one_of`
    pipelines the header and the one protocol (`_select_pipelined`).
    tests/test_node_host.py::test_opening_a_stream_proposes_the_protocol_before_reading_the_header_answer
24. A window update after every small read (credited twice) ->
    `YamuxStream._auto_tune_and_send_window_update` credits at half the window only.
    tests/test_node_host.py::test_small_messages_cost_no_window_updates
25. An inbound connection's slot (`Swarm._inbound_limiter`) was held until the swarm
    stopped, so after `max_connections` connections had come and gone every new peer
    was refused -> `Swarm._do_handle_inbound_connection` returns when its connection
    closes (`_slot_held_while_open`, with `Swarm.upgrade_inbound_raw_conn` telling it
    which connection it made) and admits by remote IP through the host's gate.
    tests/test_node_connection_limits.py::test_closed_connections_give_their_inbound_slot_back,
    ::test_inbound_connections_per_ip_are_capped_and_released
26. (Per host, not process-wide.) The swarm's auto-connector dials peerstore peers
    (learned from identify, PX or a past connection) up to half its high watermark,
    even with min_connections 0: an evicted or dropped peer came back after its 60 s
    backoff, and dials went out that nothing of ours asked for -> `no_auto_dials(swarm)`
    makes its `maybe_connect` do nothing (discovery is `node/peer/discovery.py`'s).
    tests/test_node_connection_limits.py::test_the_library_never_dials_peers_on_its_own
27. An inbound pubsub RPC over the size limit (a gossip message over ~1,048,000 bytes) is
    dropped with its stream and only logged -> the pubsub module's
    `read_varint_prefixed_bytes_limited` tells the reading task's `OVERSIZE_REPORT`
    callback (set by `node.host.gossip_guard.GuardedPubsub`) before the library drops it.
    tests/test_node_gossip_guard.py::test_an_oversize_rpc_is_reported
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import libp2p.identity.identify.identify as _libp2p_identify
import libp2p.io.msgio as _libp2p_msgio
import libp2p.io.trio as _libp2p_io_trio
import libp2p.network.swarm as _libp2p_swarm
import libp2p.protocol_muxer.multiselect_client as _libp2p_multiselect_client
import libp2p.pubsub.pubsub as _libp2p_pubsub
import libp2p.security.noise.io as _libp2p_noise_io
import libp2p.security.secure_session as _libp2p_secure_session
import libp2p.stream_muxer.yamux.yamux as _libp2p_yamux
import libp2p.transport.tcp.tcp as _libp2p_tcp
import trio
from google.protobuf.message import DecodeError as _ProtobufDecodeError
from libp2p.io.exceptions import IOException
from libp2p.io.exceptions import MessageTooLarge as _LibMessageTooLarge
from libp2p.protocol_muxer.exceptions import MultiselectClientError, MultiselectCommunicatorError
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator
from libp2p.utils import encode_delim

log = logging.getLogger("swarm.host")

# The subscription queue we install in place of the library's 32.
SUBSCRIPTION_QUEUE = 4096
# Workaround 19: bytes asked of the socket at once (a Noise message is at most 64 KiB).
TCP_READ_AHEAD = 256 * 1024
# Workaround 20: the most payload one Yamux write call hands down at once.
WRITE_BATCH = 1024 * 1024
# Workaround 21: a writer out of send window re-checks at least this often (a close that
# does not go through the window lock); a window update wakes it at once.
ZERO_WINDOW_POLL_S = 0.01


def _agent() -> str:
    try:
        from importlib.metadata import version

        return f"swarm-node/{version('swarm-node')}"
    except Exception:  # not installed (a source checkout): the pyproject version
        return "swarm-node/0.1.0"


AGENT = _agent()


def _claim_port(host: str | None, port: int) -> int:
    """Workaround 16: the port a listener on `host` may take -- `port`, or a free one for
    0 -- checked with a socket without SO_REUSEPORT, which cannot bind a port another
    socket listens on. Raises the library's listen error when the port is taken."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        probe.bind((host or "0.0.0.0", port))
        return int(probe.getsockname()[1])
    except OSError as exc:
        raise _libp2p_tcp.OpenConnectionError(f"Failed to listen on {host}:{port}: {exc}") from exc
    finally:
        probe.close()


def _exclusive_listen(open_listeners: Any) -> Any:
    """Workaround 16: the library's SO_REUSEPORT listeners, on a port claimed first."""
    if getattr(open_listeners, "_swarm_exclusive", False):
        return open_listeners

    async def opened(host: str | None, port: int) -> Any:
        return await open_listeners(host, _claim_port(host, port))

    opened._swarm_exclusive = True  # type: ignore[attr-defined]
    return opened


def _batched_window_updates() -> bool:
    """Workaround 19: the library's `release on read` switch, off: credit for what was
    read goes back with the library's (half-window) batches, not after every read. (Only
    sending at half the window, as go-yamux does, is slower here: the library's sender
    polls every 10 ms once its window is spent.)"""
    return False


async def _window_update_at_half(self: Any, *, bytes_read: int = 0) -> None:
    """Workaround 24: a stream's receive credit goes back once half the window (the
    library's threshold) has been read, as go-yamux does. The library also sent one
    after every read below that (crediting it twice over): a window-update frame, one
    more Noise message each way, for every small message a stream received."""
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        delta = self.target_recv_window - (self.recv_window + buffered)
        if delta <= 0 or delta < self._grow_threshold():
            return
        total = self._grow_to_delta(buffered) + self._apply_autotune_epoch(buffered)
    await self.send_window_update(total, skip_lock=True)


def _buffered_tcp_read(
    original: Callable[..., Awaitable[bytes]],
) -> Callable[..., Awaitable[bytes]]:
    """Workaround 19: `TrioTCPStream.read(n)` served from a read-ahead buffer, so a Noise
    message's 2-byte length and its body come from one socket read. Returns at most `n`
    bytes, as before; one reader per connection (the muxer's), as the library has."""

    async def read(self: Any, n: int | None = None) -> bytes:
        if n == 0:
            return b""
        pending: memoryview | None = getattr(self, "_swarm_ahead", None)
        if pending is None or not len(pending):
            data = await original(self, None if n is None else max(n, TCP_READ_AHEAD))
            if n is None or len(data) <= n:
                return data
            pending = memoryview(data)
        take = len(pending) if n is None else min(n, len(pending))
        out = bytes(pending[:take])
        self._swarm_ahead = pending[take:]
        return out

    read._swarm_buffered = True  # type: ignore[attr-defined]
    return read


async def _yamux_write_batched(self: Any, data: bytes) -> None:
    """Workaround 20: `YamuxStream.write` with the frames the send window allows built at
    once and written with one call (the library's own checks, locks and zero-window wait
    are kept as they are; each frame is still at most one Noise plaintext)."""
    y = _libp2p_yamux
    if self.send_closed:
        raise y.MuxedStreamError("Stream is closed for sending")
    view = memoryview(data)
    total, sent = len(data), 0
    payload_max = y.MAX_MESSAGE_SIZE - y.HEADER_SIZE
    while sent < total:
        budget = 0
        async with self.rw_lock.write_lock():
            if self.send_closed:
                raise y.MuxedStreamError("Stream is closed for sending")
            async with self.window_lock:
                if self.closed:
                    raise y.MuxedStreamError("Stream is closed")
                budget = min(self.send_window, total - sent, WRITE_BATCH)
                self.send_window -= max(budget, 0)
        if budget <= 0:
            self._zero_window_waits += 1
            with trio.move_on_after(5.0) as waited:
                while True:
                    async with self.window_lock:
                        if self.send_window > 0 or self.closed:
                            break
                    await _window_changed(self, ZERO_WINDOW_POLL_S)
            if waited.cancelled_caught:
                raise y.MuxedStreamError("Timed out waiting for window update after 5 seconds.")
            continue
        parts: list[bytes | memoryview] = []
        end = sent + budget
        while sent < end:
            n = min(payload_max, end - sent)
            parts.append(struct.pack(y.YAMUX_HEADER_FORMAT, 0, y.TYPE_DATA, 0, self.stream_id, n))
            parts.append(view[sent : sent + n])
            sent += n
        await self.conn._write_frame(b"".join(parts))


class _WindowLock:
    """Workaround 21: a Yamux stream's `window_lock` that wakes a writer waiting for send
    window when it is next released (the library only takes it with `async with`, and an
    inbound WINDOW_UPDATE adds to `send_window` under it)."""

    def __init__(self) -> None:
        self._lock = trio.Lock()
        self._released: trio.Event | None = None

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        if self._released is not None:
            self._released.set()
            self._released = None

    async def released(self, timeout_s: float) -> None:
        """Return at the next release, or after `timeout_s`."""
        if self._released is None:
            self._released = trio.Event()
        with trio.move_on_after(timeout_s):
            await self._released.wait()


async def _window_changed(stream: Any, timeout_s: float) -> None:
    lock = stream.window_lock
    if isinstance(lock, _WindowLock):
        await lock.released(timeout_s)
    else:
        await trio.sleep(timeout_s)


def _select_pipelined(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Workaround 23: multistream-select's header and the one protocol proposed go out in
    one write, then both answers are read (as go-libp2p's client does): one round trip
    per stream opened instead of two. More than one protocol goes the library's way."""

    async def select_one_of(
        self: Any,
        protocols: Sequence[Any],
        communicator: Any,
        negotiate_timeout: float = _libp2p_multiselect_client.DEFAULT_NEGOTIATE_TIMEOUT,
    ) -> Any:
        if len(protocols) != 1 or not isinstance(communicator, MultiselectCommunicator):
            return await original(self, protocols, communicator, negotiate_timeout)
        header = _libp2p_multiselect_client.MULTISELECT_PROTOCOL_ID
        protocol = str(protocols[0])
        with trio.move_on_after(negotiate_timeout):
            try:
                await communicator.read_writer.write(
                    encode_delim(header.encode()) + encode_delim(protocol.encode())
                )
                answers = [await communicator.read(), await communicator.read()]
            except (MultiselectCommunicatorError, IOException, AssertionError, ValueError) as exc:
                raise MultiselectClientError(f"multistream-select failed: {exc}") from exc
            if answers[0] != header:
                raise MultiselectClientError(f"multistream header mismatch: {answers[0]!r}")
            if answers[1] != protocol:
                raise MultiselectClientError(f"protocol {protocol} refused: {answers[1]!r}")
            return protocols[0]
        raise MultiselectClientError(f"response timed out after {negotiate_timeout}s")

    select_one_of._swarm_pipelined = True  # type: ignore[attr-defined]
    return select_one_of


def _yamux_stream_init(original: Callable[..., None]) -> Callable[..., None]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.window_lock = _WindowLock()

    init._swarm_window_lock = True  # type: ignore[attr-defined]
    return init


async def _noise_write_batched(self: Any, msg: bytes, prefix_encoded: bool = False) -> None:
    """Workaround 20: a write above one Noise plaintext goes out as the same Noise
    messages as before (one per MAX_PLAINTEXT_LENGTH bytes, each with its 2-byte length)
    but through one socket write."""
    limit = _libp2p_noise_io.MAX_PLAINTEXT_LENGTH
    if len(msg) <= limit:
        encrypted = self.encrypt(msg)
        if prefix_encoded:
            encrypted = self.prefix + encrypted
        await self.read_writer.write_msg(encrypted)
        return
    view = memoryview(msg)
    out: list[bytes] = []
    # The transport cipher takes any buffer; the connection's `encrypt` wants `bytes` (one
    # more copy of each message). Past the handshake, as here, both do the same.
    cipher = getattr(
        getattr(self.noise_state, "noise_protocol", None), "cipher_state_encrypt", None
    )
    for start in range(0, len(msg), limit):
        piece = view[start : start + limit]
        encrypted = (
            cipher.encrypt_with_ad(None, piece)
            if cipher is not None and type(self) is _libp2p_noise_io.NoiseTransportReadWriter
            else self.encrypt(bytes(piece))
        )
        if prefix_encoded and start == 0:
            encrypted = self.prefix + encrypted
        out.append(len(encrypted).to_bytes(2, "big"))
        out.append(encrypted)
    await self.read_writer.read_write_closer.write(b"".join(out))


def _read_exactly_whole(
    original: Callable[..., Awaitable[bytes]],
) -> Callable[..., Awaitable[bytes]]:
    """Workaround 20: the library's `read_exactly`, with a first read that returned all
    `n` bytes handed back as it is (the library copied it twice); anything shorter goes
    on through the library's own loop and its errors."""

    async def read_exactly(reader: Any, n: int, *args: Any, **kwargs: Any) -> bytes:
        data = await reader.read(n)
        if len(data) == n:
            return data  # bytes, or a view of a Noise message (`_session_drain`)
        if not data:
            return await original(reader, n, *args, **kwargs)
        return bytes(data) + await original(reader, n - len(data), *args, **kwargs)

    read_exactly._swarm_whole = True  # type: ignore[attr-defined]
    return read_exactly


def _session_fill(self: Any, msg: bytes) -> None:
    """Workaround 20: the rest of a Noise message kept as bytes (was copied into a BytesIO)."""
    self._swarm_rest = msg
    self.low_watermark = 0
    self.high_watermark = len(msg)


def _session_drain(self: Any, n: int | None) -> bytes | memoryview:
    """Workaround 20: up to `n` bytes of what `_session_fill` kept, as a view (its readers,
    Yamux's header and body reads, unpack it or copy it into the stream's buffer)."""
    lo, hi = self.low_watermark, self.high_watermark
    if lo == hi:
        return b""
    rest: bytes = self._swarm_rest
    end = hi if n is None else min(hi, lo + n)
    out = rest if lo == 0 and end == len(rest) else memoryview(rest)[lo:end]
    self.low_watermark = end
    if end == hi:
        self._swarm_rest = b""
        self.low_watermark = self.high_watermark = 0
    return out


OVERSIZE_REPORT: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "swarm_oversize_report", default=None
)


def _size_limit_reported(
    original: Callable[..., Awaitable[bytes]],
) -> Callable[..., Awaitable[bytes]]:
    """Patch 27: the pubsub reader's size-limited read, reporting an RPC over the limit
    to the reading task's `OVERSIZE_REPORT` callback (then raising as before)."""

    async def read_varint_prefixed_bytes_limited(reader: Any, max_length: int) -> bytes:
        try:
            return await original(reader, max_length)
        except _LibMessageTooLarge as exc:
            report = OVERSIZE_REPORT.get()
            if report is not None:
                with contextlib.suppress(Exception):
                    report(str(exc)[:200])
            raise

    read_varint_prefixed_bytes_limited._swarm_reported = True  # type: ignore[attr-defined]
    return read_varint_prefixed_bytes_limited


def apply() -> None:
    """Install every patch (idempotent; `SwarmHost` calls it before building a host)."""
    # Workaround 19: one Noise message per Yamux frame (both read at call time), window
    # updates batched, buffered socket reads.
    _libp2p_yamux.MAX_MESSAGE_SIZE = _libp2p_noise_io.MAX_PLAINTEXT_LENGTH
    _libp2p_yamux._yamux_release_on_read = _batched_window_updates
    # Workaround 20: bulk writes batched (same frames and messages, fewer syscalls).
    _libp2p_yamux.YamuxStream.write = _yamux_write_batched
    # Workaround 24: receive credit goes back at half the window only.
    _libp2p_yamux.YamuxStream._auto_tune_and_send_window_update = _window_update_at_half
    # Workaround 23: one round trip to agree on a stream's protocol.
    client_cls = _libp2p_multiselect_client.MultiselectClient
    if not getattr(client_cls.select_one_of, "_swarm_pipelined", False):
        client_cls.select_one_of = _select_pipelined(client_cls.select_one_of)
    # Workaround 21: a writer out of send window wakes at the window update, not a poll.
    stream_cls = _libp2p_yamux.YamuxStream
    if not getattr(stream_cls.__init__, "_swarm_window_lock", False):
        stream_cls.__init__ = _yamux_stream_init(stream_cls.__init__)
    _libp2p_noise_io.BaseNoiseMsgReadWriter.write_msg = _noise_write_batched
    for module in (_libp2p_msgio, _libp2p_yamux):
        if not getattr(module.read_exactly, "_swarm_whole", False):
            module.read_exactly = _read_exactly_whole(module.read_exactly)
    _libp2p_secure_session.SecureSession._fill = _session_fill
    _libp2p_secure_session.SecureSession._drain = _session_drain
    tcp_stream = _libp2p_io_trio.TrioTCPStream
    if not getattr(tcp_stream.read, "_swarm_buffered", False):
        tcp_stream.read = _buffered_tcp_read(tcp_stream.read)
    # Workaround 6: the library reads this module constant at subscribe() time.
    _libp2p_pubsub.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_QUEUE
    # Workaround 16: looked up at call time by the TCP listener.
    _libp2p_tcp._open_reuseport_listeners = _exclusive_listen(_libp2p_tcp._open_reuseport_listeners)
    # Workaround 17: identify reads this module constant when it answers.
    _libp2p_identify.AGENT_VERSION = AGENT
    # Patch 27: an oversize pubsub RPC reported.
    if not getattr(_libp2p_pubsub.read_varint_prefixed_bytes_limited, "_swarm_reported", False):
        _libp2p_pubsub.read_varint_prefixed_bytes_limited = _size_limit_reported(
            _libp2p_pubsub.read_varint_prefixed_bytes_limited
        )
    # Patch 25: inbound slots released when their connection closes; per-IP admission.
    _apply_inbound_slot_patch()
    # Workaround 18: remote garbage and ban races must not crash the host.
    pubsub_cls = _libp2p_pubsub.Pubsub
    if not getattr(pubsub_cls, "_swarm_guarded", False):
        original_read = pubsub_cls.continuously_read_stream

        async def _guarded_read(self: Any, stream: Any) -> None:
            try:
                await original_read(self, stream)
            except _ProtobufDecodeError:
                log.info("GossipSub RPC that is not protobuf; stream reset")
                with contextlib.suppress(Exception):
                    await stream.reset()

        async def _safe_teardown(self: Any, peer_id: Any) -> None:
            stream = self.peers.get(peer_id)
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.reset()
                self.peers.pop(peer_id, None)
            self._forget_all_subscriptions(peer_id)

        pubsub_cls.continuously_read_stream = _guarded_read
        pubsub_cls._teardown_if_connected = _safe_teardown
        pubsub_cls._swarm_guarded = True


class InboundGate(Protocol):
    """Per-host admission of inbound connections by remote IP, set on a swarm as
    `swarm._swarm_inbound_gate`: `admit(ip)` before the handshake (False: the socket is
    closed at once), `release(ip)` when that connection's handler ends."""

    def admit(self, ip: str | None) -> bool: ...

    def release(self, ip: str | None) -> None: ...


class _InboundConn:
    """What the patched upgrade saw of one inbound connection."""

    def __init__(self) -> None:
        self.muxed: Any = None
        self.upgraded = trio.Event()


_INBOUND: contextvars.ContextVar[_InboundConn | None] = contextvars.ContextVar(
    "swarm_inbound_conn", default=None
)


def _noting_upgrade(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`Swarm.upgrade_inbound_raw_conn`, telling the inbound handler running it which
    muxed connection it produced."""

    async def upgrade_inbound_raw_conn(self: Any, raw_conn: Any, maddr: Any) -> Any:
        muxed = await original(self, raw_conn, maddr)
        seen = _INBOUND.get()
        if seen is not None:
            seen.muxed = muxed
            seen.upgraded.set()
        return muxed

    upgrade_inbound_raw_conn._swarm_noting = True  # type: ignore[attr-defined]
    return upgrade_inbound_raw_conn


async def _closed(muxed: Any) -> None:
    """Return once `muxed` is closed (its close event; a poll where it has none)."""
    event = getattr(muxed, "event_closed", None)
    if isinstance(event, trio.Event):
        await event.wait()
        return
    while not getattr(muxed, "is_closed", True):
        await trio.sleep(1.0)


def _remote_ip(read_write_closer: Any) -> str | None:
    with contextlib.suppress(Exception):
        remote = read_write_closer.get_remote_address()
        if remote:
            return str(remote[0])
    return None


def _slot_held_while_open(
    original: Callable[..., Awaitable[None]],
) -> Callable[..., Awaitable[None]]:
    """`Swarm._do_handle_inbound_connection` that returns when its connection closes.

    The library's handler holds an inbound slot (`Swarm._inbound_limiter`, capacity
    max_connections - min_connections) and, after a successful upgrade, waits for the
    whole swarm to stop: every connection that ever came in kept its slot, and once
    `max_connections` had come and gone every new peer was refused. Here the library's
    handler runs as it is in a child task; once its upgrade produced a muxed connection
    and that connection closed (the library's own close and cleanup having run: the
    close event is set at the end of them), the child is cancelled where it waits for
    the swarm, the handler returns and the slot is released. A handler that ends by
    itself (failed upgrade, gate refusal) ends this one too.
    """

    async def _do_handle_inbound_connection(
        self: Any, read_write_closer: Any, maddr: Any, failure_event: Any
    ) -> None:
        gate: InboundGate | None = getattr(self, "_swarm_inbound_gate", None)
        ip = _remote_ip(read_write_closer)
        if gate is not None and not gate.admit(ip):
            with contextlib.suppress(Exception):
                await read_write_closer.close()
            return
        seen = _InboundConn()
        token = _INBOUND.set(seen)
        try:
            async with trio.open_nursery() as nursery:

                async def library_handler() -> None:
                    await original(self, read_write_closer, maddr, failure_event)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(library_handler)
                await seen.upgraded.wait()
                await _closed(seen.muxed)
                nursery.cancel_scope.cancel()
        finally:
            _INBOUND.reset(token)
            if gate is not None:
                gate.release(ip)

    _do_handle_inbound_connection._swarm_slot = True  # type: ignore[attr-defined]
    return _do_handle_inbound_connection


def _apply_inbound_slot_patch() -> None:
    swarm_cls = _libp2p_swarm.Swarm
    if not getattr(swarm_cls._do_handle_inbound_connection, "_swarm_slot", False):
        swarm_cls._do_handle_inbound_connection = _slot_held_while_open(
            swarm_cls._do_handle_inbound_connection
        )
    if not getattr(swarm_cls.upgrade_inbound_raw_conn, "_swarm_noting", False):
        swarm_cls.upgrade_inbound_raw_conn = _noting_upgrade(swarm_cls.upgrade_inbound_raw_conn)


async def _no_dials() -> None:
    return None


def no_auto_dials(swarm: Any) -> None:
    """Patch 26: this swarm's auto-connector never dials (its periodic check and the
    check after each disconnect both go through `maybe_connect`)."""
    connector = getattr(swarm, "auto_connector", None)
    if connector is not None:
        connector.maybe_connect = _no_dials
