"""The process-wide patches of py-libp2p 0.8.1 internals, one named function each.

`apply()` checks that the installed py-libp2p is the pinned version (`PINNED_LIBP2P`)
and that every attribute a patch replaces exists, then installs them all, once;
`node.host.host.SwarmHost` calls it before it builds a host, so any process that runs a
`SwarmHost` runs with all of them. Each patch is idempotent on its own (a wrapper
carries a marker naming its patch and is never wrapped twice). A process that never
imports this module speaks the library's defaults: the patches change only what this
side does, never the bytes another implementation must understand (the interop tests in
`tests/test_node_interop.py` run us against an unpatched py-libp2p and js-libp2p).

The patches, and the test that fails if the library's behaviour comes back:

- `enlarge_subscription_queue`: tests/test_node_host.py::test_gossipsub_settings_are_ours,
  ::test_burst_of_50_publishes_in_one_second_all_arrive
- `exclusive_listen_port`:
  tests/test_node_host.py::test_two_hosts_cannot_share_a_port_so_reuseport_is_off,
  tests/test_node_nat.py::test_hole_punch_dials_can_leave_from_our_listen_port
- `advertise_swarm_agent`:
  tests/test_node_standard_peer.py::test_a_standard_libp2p_peer_stays_connected_and_sees_our_agent
- `one_noise_message_per_yamux_frame`, `batch_yamux_window_updates`, `buffer_tcp_reads`,
  `batch_yamux_writes`, `batch_noise_writes`:
  tests/test_node_host.py::test_bulk_frames_cost_one_noise_message_per_yamux_frame_and_few_socket_calls
- `return_whole_reads_uncopied`, `keep_noise_plaintext_uncopied`:
  tests/test_node_host.py::test_received_bytes_are_handed_on_without_copies
- `wake_writer_on_window_update`:
  tests/test_node_host.py::test_a_writer_out_of_window_wakes_at_the_window_update_not_a_poll
- `pipeline_multistream_select`:
  tests/test_node_host.py::test_opening_a_stream_proposes_the_protocol_before_reading_the_header_answer
- `window_update_at_half`: tests/test_node_host.py::test_small_messages_cost_no_window_updates
- `release_inbound_slots_on_close`:
  tests/test_node_connection_limits.py::test_closed_connections_give_their_inbound_slot_back,
  ::test_inbound_connections_per_ip_are_capped_and_released
- `report_oversize_rpcs`: tests/test_node_gossip_guard.py::test_an_oversize_rpc_is_reported
- `bound_hole_punch_dials`:
  tests/test_node_libp2p_patches.py::test_a_connect_listing_a_third_partys_addresses_costs_at_most_8_dials,
  ::test_an_honest_hole_punch_still_dials_the_peers_addresses

Per host, not process-wide: `no_auto_dials(swarm)`, `set_punch_reporter(dcutr, report)`
(who pays for a refused hole-punch dial),
(tests/test_node_connection_limits.py::test_the_library_never_dials_peers_on_its_own) and
`set_inbound_gate(swarm, gate)` (the per-IP admission `release_inbound_slots_on_close`
consults). What could be a subclass is one: garbage GossipSub RPCs and ban races are
handled by `node.host.gossip_guard.GuardedPubsub`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import itertools
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
import libp2p.relay.circuit_v2.dcutr as _libp2p_dcutr
import libp2p.security.noise.io as _libp2p_noise_io
import libp2p.security.secure_session as _libp2p_secure_session
import libp2p.stream_muxer.yamux.yamux as _libp2p_yamux
import libp2p.transport.tcp.tcp as _libp2p_tcp
import trio
from libp2p.io.exceptions import IOException
from libp2p.io.exceptions import MessageTooLarge as _LibMessageTooLarge
from libp2p.protocol_muxer.exceptions import MultiselectClientError, MultiselectCommunicatorError
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.transport.exceptions import OpenConnectionError
from libp2p.utils import encode_delim
from multiaddr import Multiaddr

from protocol import hole_punch

log = logging.getLogger("swarm.host")

# The py-libp2p release these patches are written against (its distribution is `libp2p`).
PINNED_LIBP2P = "0.8.1"
# The subscription queue we install in place of the library's 32.
SUBSCRIPTION_QUEUE = 4096
# Bytes asked of the socket at once (a Noise message is at most 64 KiB).
TCP_READ_AHEAD = 256 * 1024
# The most payload one Yamux write call hands down at once.
WRITE_BATCH = 1024 * 1024
# A writer out of send window re-checks at least this often (a close that does not go
# through the window lock); a window update wakes it at once.
ZERO_WINDOW_POLL_S = 0.01
# The attribute a patched function carries: the name of the patch that installed it.
MARKER = "_swarm_patch"


class PatchError(RuntimeError):
    """The installed py-libp2p is not the one these patches are written for: the wrong
    version, or an attribute a patch replaces is missing."""


def _agent() -> str:
    try:
        return f"swarm-node/{importlib.metadata.version('swarm-node')}"
    except importlib.metadata.PackageNotFoundError:  # a source checkout: the pyproject version
        return "swarm-node/0.1.0"


AGENT = _agent()


def libp2p_version() -> str:
    """The installed py-libp2p version ("" when it is not installed as a distribution)."""
    try:
        return importlib.metadata.version("libp2p")
    except importlib.metadata.PackageNotFoundError:
        return ""


def check_version() -> None:
    """Raise `PatchError` unless the installed py-libp2p is `PINNED_LIBP2P`."""
    found = libp2p_version()
    if found != PINNED_LIBP2P:
        raise PatchError(
            f"node.host.libp2p_patches is written for py-libp2p {PINNED_LIBP2P}, found "
            f"{found or 'none'}: install libp2p=={PINNED_LIBP2P} (pinned in pyproject.toml), "
            "or review every patch against the new version"
        )


def _require(patch: str, owner: Any, attr: str) -> Any:
    """`owner.attr`, or a `PatchError` naming `patch` when the library has no such attribute."""
    if not hasattr(owner, attr):
        where = getattr(owner, "__name__", type(owner).__name__)
        raise PatchError(
            f"libp2p patch {patch}: py-libp2p {libp2p_version() or '?'} has no {where}.{attr} "
            "(its target moved or was removed upstream); review the patch"
        )
    return getattr(owner, attr)


def _replace(patch: str, owner: Any, attr: str, value: Any) -> None:
    """Set `owner.attr = value` once checked that the library has that attribute."""
    _require(patch, owner, attr)
    setattr(owner, attr, value)


def _wrap(patch: str, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Replace `owner.attr` with `make(original)`, marked with `patch`, unless already done."""
    current = _require(patch, owner, attr)
    if getattr(current, MARKER, None) == patch:
        return
    wrapper = make(current)
    setattr(wrapper, MARKER, patch)
    setattr(owner, attr, wrapper)


# ---------------------------------------------------------------------------------------
# The patches
# ---------------------------------------------------------------------------------------


def enlarge_subscription_queue() -> None:
    """Upstream: a subscription's queue holds `SUBSCRIPTION_CHANNEL_SIZE` = 32 messages and
    drops the overflow with a warning, so a burst of gossip is lost before the
    application's reader runs. Change: the module constant (read at `subscribe()` time)
    becomes `SUBSCRIPTION_QUEUE`. Safe: memory is bounded all the same, and the host's
    reader task drains the queue at once. No upstream issue found."""
    _replace(
        "enlarge_subscription_queue",
        _libp2p_pubsub,
        "SUBSCRIPTION_CHANNEL_SIZE",
        SUBSCRIPTION_QUEUE,
    )


def exclusive_listen_port() -> None:
    """Upstream: listen sockets get SO_REUSEPORT (DCUtR's TCP hole punch dials from the
    listen port, which needs it on both sockets), so two nodes silently "share" a port and
    the kernel splits inbound connections between them. Change: the TCP listener
    (`_open_reuseport_listeners`, looked up at call time) first claims the port with a
    plain socket, which cannot bind a port someone listens on, then listens with
    SO_REUSEPORT as the library does. Safe: the listening socket is the library's own; a
    port in use fails with the library's listen error. go-libp2p's answer to the same
    trap is an option to turn reuseport off."""
    _wrap("exclusive_listen_port", _libp2p_tcp, "_open_reuseport_listeners", _exclusive_listen)


def advertise_swarm_agent() -> None:
    """Upstream: identify says `py-libp2p/<version>`, the library's name, not ours.
    Change: identify's `AGENT_VERSION` (read when it answers) becomes `AGENT`
    (`swarm-node/<version>`). Safe: a free-text field no peer acts on."""
    _replace("advertise_swarm_agent", _libp2p_identify, "AGENT_VERSION", AGENT)


def one_noise_message_per_yamux_frame() -> None:
    """Upstream: a full Yamux frame (`MAX_MESSAGE_SIZE`, 64 KiB of payload plus a 12-byte
    header) is 17 bytes over one Noise plaintext, so it costs two Noise messages. Change:
    Yamux's `MAX_MESSAGE_SIZE` (read at call time) becomes Noise's largest plaintext.
    Safe: only the frames we send get smaller; the receiver takes any frame size."""
    _replace(
        "one_noise_message_per_yamux_frame",
        _libp2p_yamux,
        "MAX_MESSAGE_SIZE",
        _require("one_noise_message_per_yamux_frame", _libp2p_noise_io, "MAX_PLAINTEXT_LENGTH"),
    )


def batch_yamux_window_updates() -> None:
    """Upstream: with `_yamux_release_on_read()` true, a stream sends a window update after
    every read. Change: the switch answers False, so credit for what was read goes back
    with the library's (half-window) batches. Safe: the sender's window is credited all
    the same, only in fewer frames. Related: py-libp2p#1270 (receive window auto-tuning)."""
    _replace(
        "batch_yamux_window_updates", _libp2p_yamux, "_yamux_release_on_read", _release_on_read_off
    )


def buffer_tcp_reads() -> None:
    """Upstream: a Noise message's 2-byte length and its body are two socket reads.
    Change: `TrioTCPStream.read(n)` is served from a read-ahead buffer of `TCP_READ_AHEAD`
    bytes. Safe: it returns at most `n` bytes, as before, and a connection has one reader
    (the muxer's), as the library assumes."""
    _wrap("buffer_tcp_reads", _libp2p_io_trio.TrioTCPStream, "read", _buffered_tcp_read)


def batch_yamux_writes() -> None:
    """Upstream: `YamuxStream.write` pays the whole write path per 64 KiB frame. Change: the
    frames the send window allows are built at once and written with one call. Safe: the
    library's checks, locks and zero-window wait are kept, and each frame is still at
    most one Noise plaintext: the bytes on the wire are the same frames."""
    _replace("batch_yamux_writes", _libp2p_yamux.YamuxStream, "write", _yamux_write_batched)


def batch_noise_writes() -> None:
    """Upstream: `BaseNoiseMsgReadWriter.write_msg` writes each Noise message with its own
    socket write. Change: a write above one Noise plaintext goes out as the same Noise
    messages (one per `MAX_PLAINTEXT_LENGTH` bytes, each with its 2-byte length) through
    one socket write. Safe: the same ciphertext in the same order."""
    _replace(
        "batch_noise_writes",
        _libp2p_noise_io.BaseNoiseMsgReadWriter,
        "write_msg",
        _noise_write_batched,
    )


def return_whole_reads_uncopied() -> None:
    """Upstream: `read_exactly` (msgio and Yamux) copies a received frame twice even when
    one read returned all of it. Change: a first read of exactly `n` bytes is handed back
    as it is; anything shorter goes on through the library's own loop and its errors.
    Safe: callers get the same bytes (or a read-only view of them)."""
    for module in (_libp2p_msgio, _libp2p_yamux):
        _wrap("return_whole_reads_uncopied", module, "read_exactly", _read_exactly_whole)


def keep_noise_plaintext_uncopied() -> None:
    """Upstream: `SecureSession._fill/_drain` copy each decrypted Noise message into a
    BytesIO and out again. Change: the message is kept as bytes and handed out as views.
    Safe: its readers (Yamux's header and body reads) unpack it or copy it into the
    stream's buffer; the watermarks keep their meaning."""
    session = _libp2p_secure_session.SecureSession
    _replace("keep_noise_plaintext_uncopied", session, "_fill", _session_fill)
    _replace("keep_noise_plaintext_uncopied", session, "_drain", _session_drain)


def wake_writer_on_window_update() -> None:
    """Upstream: a Yamux writer out of send window polls every 10 ms. Change: each
    `YamuxStream` gets a `window_lock` (`WindowLock`) that wakes a waiting writer when it
    is next released, which an inbound window update does. Safe: the lock is taken only
    with `async with`, as the library does, and a writer still re-checks every
    `ZERO_WINDOW_POLL_S`."""
    _wrap("wake_writer_on_window_update", _libp2p_yamux.YamuxStream, "__init__", _yamux_stream_init)


def pipeline_multistream_select() -> None:
    """Upstream: multistream-select costs two round trips per stream opened (the header,
    then the protocol). Change: `MultiselectClient.select_one_of` with one protocol sends
    the header and the protocol in one write and reads both answers, as go-libp2p's
    client does; more than one protocol goes the library's way. Safe: the same messages
    in the same order, which the protocol allows."""
    _wrap(
        "pipeline_multistream_select",
        _libp2p_multiselect_client.MultiselectClient,
        "select_one_of",
        _select_pipelined,
    )


def window_update_at_half() -> None:
    """Upstream: `YamuxStream._auto_tune_and_send_window_update` sends a window update
    after every small read as well (crediting it twice over): one more Noise message each
    way for every small message a stream receives. Change: receive credit goes back once
    half the window (the library's threshold) has been read, as go-yamux does. Safe: the
    library's auto-tuning is kept; the sender is credited at half the window at the
    latest. Related: py-libp2p#1270, #1269."""
    _replace(
        "window_update_at_half",
        _libp2p_yamux.YamuxStream,
        "_auto_tune_and_send_window_update",
        _window_update_at_half,
    )


def release_inbound_slots_on_close() -> None:
    """Upstream: an inbound connection's slot (`Swarm._inbound_limiter`) is held until the
    swarm stops, so once `max_connections` connections have come and gone every new peer
    is refused. Change: `Swarm._do_handle_inbound_connection` returns when its connection
    closes (`Swarm.upgrade_inbound_raw_conn` telling it which connection it made), and
    first admits the remote IP through the swarm's gate (`set_inbound_gate`). Safe: the
    library's handler runs unchanged in a child task; it is cancelled only where it waits
    for the swarm to stop, after the connection's own close and cleanup ran."""
    swarm = _libp2p_swarm.Swarm
    _wrap(
        "release_inbound_slots_on_close",
        swarm,
        "_do_handle_inbound_connection",
        _slot_held_while_open,
    )
    _wrap("release_inbound_slots_on_close", swarm, "upgrade_inbound_raw_conn", _noting_upgrade)


def report_oversize_rpcs() -> None:
    """Upstream: an inbound pubsub RPC over the size limit (a gossip message over
    ~1,048,000 bytes) is dropped with its stream and only logged. Change: the pubsub
    module's `read_varint_prefixed_bytes_limited` tells the reading task's
    `OVERSIZE_REPORT` callback (set by `node.host.gossip_guard.GuardedPubsub`) before the
    library drops it. Safe: it raises as before; the callback's own errors are
    suppressed."""
    _wrap(
        "report_oversize_rpcs",
        _libp2p_pubsub,
        "read_varint_prefixed_bytes_limited",
        _size_limit_reported,
    )


def bound_hole_punch_dials() -> None:
    """Upstream: a DCUtR CONNECT's addresses are dialled as the remote lists them: all of
    them (up to what fits in 4 KiB, about 400), in three rounds, plus every address the
    peerstore holds for the peer (which identify fills from the peer's own claims), and the
    library stores them all in the peerstore for 10 minutes. Nothing checks they are the
    peer's, so a peer can make us send thousands of connection attempts to a third party
    for a few KB of its own. Change: every DCUtR dial (`DCUtRProtocol._dial_peer`) goes
    through `protocol.hole_punch.HolePunchBudget` (one per DCUtR instance): only to a peer
    reached through a relay, only IP+TCP addresses a peer can have, at most 8 per punch
    (one CONNECT exchange: `_handle_dcutr_stream`, `initiate_hole_punch`), an address for
    one peer per minute, and budgets per IP and per peer; a CONNECT's addresses are cut
    to the 20 the library itself sends at most (`_decode_observed_addrs`). A refusal the
    remote caused goes to the instance's reporter (`set_punch_reporter`), once per punch.
    Safe: an honest punch lists a few addresses of its one NAT and still dials them with
    the library's retry rounds; a refused dial is one the library would have let fail.
    Related: the DCUtR spec leaves the address check to implementations
    (https://github.com/libp2p/specs/blob/master/relay/DCUtR.md); go-libp2p's holepunch
    service filters the remote's addresses to public ones, upstream py-libp2p has none."""
    owner = _libp2p_dcutr.DCUtRProtocol
    _wrap("bound_hole_punch_dials", owner, "_handle_dcutr_stream", _punch_inbound)
    _wrap("bound_hole_punch_dials", owner, "initiate_hole_punch", _punch_outbound)
    _wrap("bound_hole_punch_dials", owner, "_decode_observed_addrs", _offered_capped)
    _wrap("bound_hole_punch_dials", owner, "_dial_peer", _dial_budgeted)


# Every process-wide patch, in the order `apply()` installs them.
PATCHES: tuple[Callable[[], None], ...] = (
    enlarge_subscription_queue,
    exclusive_listen_port,
    advertise_swarm_agent,
    one_noise_message_per_yamux_frame,
    batch_yamux_window_updates,
    buffer_tcp_reads,
    batch_yamux_writes,
    batch_noise_writes,
    return_whole_reads_uncopied,
    keep_noise_plaintext_uncopied,
    wake_writer_on_window_update,
    pipeline_multistream_select,
    window_update_at_half,
    release_inbound_slots_on_close,
    report_oversize_rpcs,
    bound_hole_punch_dials,
)

# Every attribute the patches replace (or read), checked before any of them is installed.
TARGETS: tuple[tuple[str, Any, str], ...] = (
    ("enlarge_subscription_queue", _libp2p_pubsub, "SUBSCRIPTION_CHANNEL_SIZE"),
    ("exclusive_listen_port", _libp2p_tcp, "_open_reuseport_listeners"),
    ("advertise_swarm_agent", _libp2p_identify, "AGENT_VERSION"),
    ("one_noise_message_per_yamux_frame", _libp2p_yamux, "MAX_MESSAGE_SIZE"),
    ("one_noise_message_per_yamux_frame", _libp2p_noise_io, "MAX_PLAINTEXT_LENGTH"),
    ("batch_yamux_window_updates", _libp2p_yamux, "_yamux_release_on_read"),
    ("buffer_tcp_reads", _libp2p_io_trio.TrioTCPStream, "read"),
    ("batch_yamux_writes", _libp2p_yamux.YamuxStream, "write"),
    ("batch_yamux_writes", _libp2p_yamux, "YAMUX_HEADER_FORMAT"),
    ("batch_yamux_writes", _libp2p_yamux, "HEADER_SIZE"),
    ("batch_yamux_writes", _libp2p_yamux, "TYPE_DATA"),
    ("batch_noise_writes", _libp2p_noise_io.BaseNoiseMsgReadWriter, "write_msg"),
    ("return_whole_reads_uncopied", _libp2p_msgio, "read_exactly"),
    ("return_whole_reads_uncopied", _libp2p_yamux, "read_exactly"),
    ("keep_noise_plaintext_uncopied", _libp2p_secure_session.SecureSession, "_fill"),
    ("keep_noise_plaintext_uncopied", _libp2p_secure_session.SecureSession, "_drain"),
    ("wake_writer_on_window_update", _libp2p_yamux.YamuxStream, "__init__"),
    ("pipeline_multistream_select", _libp2p_multiselect_client.MultiselectClient, "select_one_of"),
    ("pipeline_multistream_select", _libp2p_multiselect_client, "MULTISELECT_PROTOCOL_ID"),
    ("window_update_at_half", _libp2p_yamux.YamuxStream, "_auto_tune_and_send_window_update"),
    ("window_update_at_half", _libp2p_yamux.YamuxStream, "_grow_threshold"),
    ("window_update_at_half", _libp2p_yamux.YamuxStream, "_grow_to_delta"),
    ("window_update_at_half", _libp2p_yamux.YamuxStream, "_apply_autotune_epoch"),
    ("release_inbound_slots_on_close", _libp2p_swarm.Swarm, "_do_handle_inbound_connection"),
    ("release_inbound_slots_on_close", _libp2p_swarm.Swarm, "upgrade_inbound_raw_conn"),
    ("report_oversize_rpcs", _libp2p_pubsub, "read_varint_prefixed_bytes_limited"),
    ("bound_hole_punch_dials", _libp2p_dcutr.DCUtRProtocol, "_handle_dcutr_stream"),
    ("bound_hole_punch_dials", _libp2p_dcutr.DCUtRProtocol, "initiate_hole_punch"),
    ("bound_hole_punch_dials", _libp2p_dcutr.DCUtRProtocol, "_decode_observed_addrs"),
    ("bound_hole_punch_dials", _libp2p_dcutr.DCUtRProtocol, "_dial_peer"),
)

_applied = False


def check_targets() -> None:
    """Raise `PatchError` naming the patch whose target attribute the library lacks."""
    for patch, owner, attr in TARGETS:
        _require(patch, owner, attr)


def apply() -> None:
    """Check the py-libp2p version and every target, then install every patch in
    `PATCHES`, once (later calls return at once; each patch is idempotent as well)."""
    global _applied
    if _applied:
        return
    check_version()
    check_targets()
    for patch in PATCHES:
        patch()
    _applied = True


# ---------------------------------------------------------------------------------------
# Per host
# ---------------------------------------------------------------------------------------


class InboundGate(Protocol):
    """Per-host admission of inbound connections by remote IP (`set_inbound_gate`):
    `admit(ip)` before the handshake (False: the socket is closed at once),
    `release(ip)` when that connection's handler ends."""

    def admit(self, ip: str | None) -> bool: ...

    def release(self, ip: str | None) -> None: ...


GATE_ATTR = "_swarm_inbound_gate"  # where a swarm keeps its gate


def set_inbound_gate(swarm: Any, gate: InboundGate) -> None:
    """Admit this swarm's inbound connections through `gate` (the per-IP cap), consulted
    by `release_inbound_slots_on_close`'s handler."""
    setattr(swarm, GATE_ATTR, gate)


PunchReport = Callable[[str, str], None]  # (peer base58, reason)
PUNCH_BUDGET_ATTR = "_swarm_punch_budget"  # where a DCUtR instance keeps its budget
PUNCH_REPORT_ATTR = "_swarm_punch_report"  # and its reporter


def set_punch_reporter(dcutr: Any, report: PunchReport) -> None:
    """Tell `report(peer, reason)` of each hole punch a peer made us refuse dials for
    (`bound_hole_punch_dials`), at most once per punch; it must not block."""
    setattr(dcutr, PUNCH_REPORT_ATTR, report)


def punch_budget(dcutr: Any) -> hole_punch.HolePunchBudget:
    """The hole-punch dial budget of one DCUtR instance (made on first use)."""
    budget = getattr(dcutr, PUNCH_BUDGET_ATTR, None)
    if budget is None:
        budget = hole_punch.HolePunchBudget()
        setattr(dcutr, PUNCH_BUDGET_ATTR, budget)
    return budget


async def _no_dials() -> None:
    return None


def no_auto_dials(swarm: Any) -> None:
    """Upstream: the swarm's auto-connector dials peerstore peers (learned from identify,
    PX or a past connection) up to half its high watermark, even with min_connections 0:
    an evicted or dropped peer comes back after its 60 s backoff, and dials go out that
    nothing of ours asked for. Change (this swarm only): its `maybe_connect`, which both
    the periodic check and the check after each disconnect go through, does nothing.
    Safe: discovery is `node/peer/discovery.py`'s, which dials what it decides to."""
    connector = _require("no_auto_dials", swarm, "auto_connector")
    _replace("no_auto_dials", connector, "maybe_connect", _no_dials)


# ---------------------------------------------------------------------------------------
# What the patches install
# ---------------------------------------------------------------------------------------


def _claim_port(host: str | None, port: int) -> int:
    """the port a listener on `host` may take -- `port`, or a free one for
    0 -- checked with a socket without SO_REUSEPORT, which cannot bind a port another
    socket listens on. Raises the library's listen error when the port is taken."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        probe.bind((host or "0.0.0.0", port))
        return int(probe.getsockname()[1])
    except OSError as exc:
        raise OpenConnectionError(f"Failed to listen on {host}:{port}: {exc}") from exc
    finally:
        probe.close()


def _exclusive_listen(open_listeners: Any) -> Any:
    """The library's SO_REUSEPORT listeners, on a port claimed first."""

    async def opened(host: str | None, port: int) -> Any:
        return await open_listeners(host, _claim_port(host, port))

    return opened


def _release_on_read_off() -> bool:
    """The library's `release on read` switch, off: credit for what was read goes back
    with the library's (half-window) batches, not after every read."""
    return False


async def _window_update_at_half(self: Any, *, bytes_read: int = 0) -> None:
    """a stream's receive credit goes back once half the window (the
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
    """`TrioTCPStream.read(n)` served from a read-ahead buffer, so a Noise
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

    return read


async def _yamux_write_batched(self: Any, data: bytes) -> None:
    """`YamuxStream.write` with the frames the send window allows built at
    once and written with one call (the library's own checks, locks and zero-window wait
    are kept as they are; each frame is still at most one Noise plaintext)."""
    y = _libp2p_yamux
    if self.send_closed:
        raise MuxedStreamError("Stream is closed for sending")
    view = memoryview(data)
    total, sent = len(data), 0
    payload_max = y.MAX_MESSAGE_SIZE - y.HEADER_SIZE
    while sent < total:
        budget = 0
        async with self.rw_lock.write_lock():
            if self.send_closed:
                raise MuxedStreamError("Stream is closed for sending")
            async with self.window_lock:
                if self.closed:
                    raise MuxedStreamError("Stream is closed")
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
                raise MuxedStreamError("Timed out waiting for window update after 5 seconds.")
            continue
        parts: list[bytes | memoryview] = []
        end = sent + budget
        while sent < end:
            n = min(payload_max, end - sent)
            parts.append(struct.pack(y.YAMUX_HEADER_FORMAT, 0, y.TYPE_DATA, 0, self.stream_id, n))
            parts.append(view[sent : sent + n])
            sent += n
        await self.conn._write_frame(b"".join(parts))


class WindowLock:
    """A Yamux stream's `window_lock` that wakes a writer waiting for send
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
    if isinstance(lock, WindowLock):
        await lock.released(timeout_s)
    else:
        await trio.sleep(timeout_s)


def _select_pipelined(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """multistream-select's header and the one protocol proposed go out in
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

    return select_one_of


def _yamux_stream_init(original: Callable[..., None]) -> Callable[..., None]:
    """`YamuxStream.__init__`, then a `WindowLock` as the stream's `window_lock`."""

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.window_lock = WindowLock()

    return init


async def _noise_write_batched(self: Any, msg: bytes, prefix_encoded: bool = False) -> None:
    """a write above one Noise plaintext goes out as the same Noise
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
    """the library's `read_exactly`, with a first read that returned all
    `n` bytes handed back as it is (the library copied it twice); anything shorter goes
    on through the library's own loop and its errors."""

    async def read_exactly(reader: Any, n: int, *args: Any, **kwargs: Any) -> bytes:
        data = await reader.read(n)
        if len(data) == n:
            return data  # bytes, or a view of a Noise message (`_session_drain`)
        if not data:
            return await original(reader, n, *args, **kwargs)
        return bytes(data) + await original(reader, n - len(data), *args, **kwargs)

    return read_exactly


def _session_fill(self: Any, msg: bytes) -> None:
    """The rest of a Noise message kept as bytes (the library copies it into a BytesIO)."""
    self._swarm_rest = msg
    self.low_watermark = 0
    self.high_watermark = len(msg)


def _session_drain(self: Any, n: int | None) -> bytes | memoryview:
    """up to `n` bytes of what `_session_fill` kept, as a view (its readers,
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
    """the pubsub reader's size-limited read, reporting an RPC over the limit
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

    return read_varint_prefixed_bytes_limited


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
    whole swarm to stop: every connection that ever came in keeps its slot, and once
    `max_connections` have come and gone every new peer is refused. Here the library's
    handler runs as it is in a child task; once its upgrade produced a muxed connection
    and that connection closed (the library's own close and cleanup having run: the
    close event is set at the end of them), the child is cancelled where it waits for
    the swarm, the handler returns and the slot is released. A handler that ends by
    itself (failed upgrade, gate refusal) ends this one too.
    """

    async def _do_handle_inbound_connection(
        self: Any, read_write_closer: Any, maddr: Any, failure_event: Any
    ) -> None:
        gate: InboundGate | None = getattr(self, GATE_ATTR, None)
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

    return _do_handle_inbound_connection


class _Punch:
    """One DCUtR exchange with one peer: the unit of the dial budget."""

    _numbers = itertools.count(1)

    def __init__(self, peer: str) -> None:
        self.number = next(self._numbers)
        self.peer = peer
        self.charged = False


_PUNCH: contextvars.ContextVar[_Punch | None] = contextvars.ContextVar(
    "swarm_hole_punch", default=None
)


def _charge(dcutr: Any, punch: _Punch, reason: str) -> None:
    """Report `punch`'s peer for `reason`, once per punch."""
    if punch.charged:
        return
    punch.charged = True
    log.info("peer %s: hole punch refused: %s", punch.peer[:12], reason)
    report: PunchReport | None = getattr(dcutr, PUNCH_REPORT_ATTR, None)
    if report is not None:
        try:
            report(punch.peer, reason)
        except Exception:  # a listener's bug must not end the DCUtR handler
            log.exception("hole punch reporter failed")


def _peer_b58(peer_id: Any) -> str:
    with contextlib.suppress(Exception):
        return str(peer_id.to_base58())
    return str(peer_id)


def _punch_inbound(original: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """`DCUtRProtocol._handle_dcutr_stream`, as one punch for the budget."""

    async def _handle_dcutr_stream(self: Any, stream: Any) -> None:
        peer = _peer_b58(getattr(getattr(stream, "muxed_conn", None), "peer_id", "?"))
        token = _PUNCH.set(_Punch(peer))
        try:
            await original(self, stream)
        finally:
            _PUNCH.reset(token)

    return _handle_dcutr_stream


def _punch_outbound(original: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
    """`DCUtRProtocol.initiate_hole_punch`, as one punch for the budget."""

    async def initiate_hole_punch(self: Any, peer_id: Any) -> bool:
        token = _PUNCH.set(_Punch(_peer_b58(peer_id)))
        try:
            return await original(self, peer_id)
        finally:
            _PUNCH.reset(token)

    return initiate_hole_punch


def _offered_capped(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """`DCUtRProtocol._decode_observed_addrs` of at most the first `offered_max` addresses
    of a CONNECT; a longer list is charged to the punch's peer."""

    def _decode_observed_addrs(self: Any, addr_bytes: list[bytes]) -> list[Any]:
        budget = punch_budget(self)
        refusal = budget.offered(len(addr_bytes))
        punch = _PUNCH.get()
        if refusal is not None and punch is not None:
            _charge(self, punch, refusal.reason)
        return original(self, list(addr_bytes[: budget.limits.offered_max]))

    return _decode_observed_addrs


def _tcp_endpoint(addr: Any) -> tuple[str | None, int]:
    """(IP, TCP port) of a multiaddr such as /ip4/A/tcp/P[/p2p/...], (None, 0) otherwise."""
    parts = str(addr).strip("/").split("/")
    if len(parts) >= 4 and parts[0] in ("ip4", "ip6") and parts[2] == "tcp":
        if len(parts) == 4 or parts[4] == "p2p":
            with contextlib.suppress(ValueError):
                return parts[1], int(parts[3])
    return None, 0


def _relayed_only(host: Any, peer_id: Any) -> bool:
    """Whether every connection to `peer_id` is relayed (and there is one)."""
    with contextlib.suppress(Exception):
        conns = host.get_network().connections.get(peer_id) or []
        conns = conns if isinstance(conns, list) else [conns]
        kinds = [any("/p2p-circuit" in str(a) for a in c.get_transport_addresses()) for c in conns]
        return bool(kinds) and all(kinds)
    return False


def _own_ips(host: Any) -> frozenset[str]:
    ips: set[str] = set()
    with contextlib.suppress(Exception):
        for a in host.get_addrs():
            ip, _ = _tcp_endpoint(a)
            if ip is not None:
                ips.add(ip)
    return frozenset(ips)


def _dial_budgeted(original: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """`DCUtRProtocol._dial_peer`, admitted first by the instance's `HolePunchBudget`."""

    async def _dial_peer(
        self: Any,
        peer_id: Any,
        addr: Multiaddr,
        source: tuple[str, int] | None = None,
        as_responder: bool = False,
    ) -> None:
        peer = _peer_b58(peer_id)
        punch = _PUNCH.get()
        if punch is None or punch.peer != peer:  # a dial outside any exchange: its own punch
            punch = _Punch(peer)
        ip, port = _tcp_endpoint(addr)
        refusal = punch_budget(self).admit(
            punch.number,
            peer,
            ip,
            port,
            trio.current_time(),
            relayed=_relayed_only(self.host, peer_id),
            own_ips=_own_ips(self.host),
        )
        if refusal is not None:
            log.debug("hole punch dial to %s at %s refused: %s", peer[:12], addr, refusal.reason)
            if refusal.charge:
                _charge(self, punch, refusal.reason)
            return
        await original(self, peer_id, addr, source, as_responder)

    return _dial_peer
