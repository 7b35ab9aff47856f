"""`node.host.libp2p_patches`: `apply()` is idempotent, refuses a py-libp2p other than the
pinned one and names the patch whose target is missing; each patch's effect, where it is
cheap to observe without a network."""

from __future__ import annotations

import types

import libp2p.identity.identify.identify as identify
import libp2p.io.msgio as msgio
import libp2p.network.swarm as swarm
import libp2p.protocol_muxer.multiselect_client as multiselect_client
import libp2p.pubsub.pubsub as pubsub
import libp2p.security.noise.io as noise_io
import libp2p.stream_muxer.yamux.yamux as yamux
import libp2p.transport.tcp.tcp as tcp
import pytest
from libp2p.io.trio import TrioTCPStream

from node.host import libp2p_patches as patches


def _installed() -> dict[str, object]:
    return {
        "select_one_of": multiselect_client.MultiselectClient.select_one_of,
        "yamux_init": yamux.YamuxStream.__init__,
        "tcp_read": TrioTCPStream.read,
        "listeners": tcp._open_reuseport_listeners,
        "msgio_read_exactly": msgio.read_exactly,
        "yamux_read_exactly": yamux.read_exactly,
        "inbound": swarm.Swarm._do_handle_inbound_connection,
        "upgrade": swarm.Swarm.upgrade_inbound_raw_conn,
        "oversize": pubsub.read_varint_prefixed_bytes_limited,
    }


def test_apply_is_idempotent() -> None:
    patches.apply()
    before = _installed()
    patches.apply()
    for patch in patches.PATCHES:  # each on its own, again: never wrapped twice
        patch()
    assert _installed() == before
    for name, fn in before.items():
        assert getattr(fn, patches.MARKER, None), name


def test_a_wrong_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patches, "_applied", False)
    monkeypatch.setattr(patches, "libp2p_version", lambda: "0.9.0")
    with pytest.raises(patches.PatchError, match=r"written for py-libp2p 0\.8\.1, found 0\.9\.0"):
        patches.apply()
    assert patches.libp2p_version() == "0.9.0"
    monkeypatch.undo()
    assert patches.libp2p_version() == patches.PINNED_LIBP2P


def test_a_missing_target_names_its_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("libp2p.pubsub.pubsub")  # a library without the constant
    monkeypatch.setattr(patches, "_applied", False)
    monkeypatch.setattr(patches, "_libp2p_pubsub", fake)
    monkeypatch.setattr(
        patches,
        "TARGETS",
        tuple(
            (name, fake if owner is pubsub else owner, attr)
            for name, owner, attr in patches.TARGETS
        ),
    )
    with pytest.raises(
        patches.PatchError, match="enlarge_subscription_queue.*SUBSCRIPTION_CHANNEL"
    ):
        patches.apply()
    with pytest.raises(patches.PatchError, match="enlarge_subscription_queue"):
        patches.enlarge_subscription_queue()
    assert not hasattr(fake, "SUBSCRIPTION_CHANNEL_SIZE")  # nothing was set


def test_a_missing_method_is_refused_before_anything_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Client:  # a MultiselectClient without select_one_of
        pass

    monkeypatch.setattr(patches._libp2p_multiselect_client, "MultiselectClient", Client)
    with pytest.raises(patches.PatchError, match="pipeline_multistream_select.*select_one_of"):
        patches.pipeline_multistream_select()
    assert not hasattr(Client, "select_one_of")


def test_the_constants_are_ours() -> None:
    patches.apply()
    assert pubsub.SUBSCRIPTION_CHANNEL_SIZE == patches.SUBSCRIPTION_QUEUE
    assert identify.AGENT_VERSION == patches.AGENT and patches.AGENT.startswith("swarm-node/")
    assert yamux.MAX_MESSAGE_SIZE == noise_io.MAX_PLAINTEXT_LENGTH
    assert yamux._yamux_release_on_read() is False


def test_a_yamux_stream_gets_a_window_lock() -> None:
    patches.apply()
    stream = yamux.YamuxStream.__new__(yamux.YamuxStream)
    fake_init_ran: list[bool] = []

    def init(self: object, *args: object, **kwargs: object) -> None:
        fake_init_ran.append(True)

    patches._yamux_stream_init(init)(stream)
    assert fake_init_ran == [True]
    assert isinstance(stream.window_lock, patches.WindowLock)


def test_no_auto_dials_needs_an_auto_connector() -> None:
    with pytest.raises(patches.PatchError, match="no_auto_dials.*auto_connector"):
        patches.no_auto_dials(types.SimpleNamespace())
    connector = types.SimpleNamespace(maybe_connect=None)
    patches.no_auto_dials(types.SimpleNamespace(auto_connector=connector))
    assert connector.maybe_connect is not None


async def test_buffered_tcp_reads_return_at_most_what_was_asked() -> None:
    chunks = [b"ab" + bytes(100), b"tail"]

    async def raw_read(self: object, n: int | None = None) -> bytes:
        return chunks.pop(0) if chunks else b""

    read = patches._buffered_tcp_read(raw_read)
    stream = types.SimpleNamespace()
    assert await read(stream, 2) == b"ab"  # one socket read serves both calls
    assert await read(stream, 200) == bytes(100)
    assert await read(stream, 0) == b""
    assert await read(stream, 10) == b"tail"
