"""`node.host.libp2p_patches`: `apply()` is idempotent, refuses a py-libp2p other than the
pinned one and names the patch whose target is missing; each patch's effect, where it is
cheap to observe without a network."""

from __future__ import annotations

import types
from typing import Any

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
from libp2p.peer.id import ID

from node.host import libp2p_patches as patches
from node.testing.dcutr_flood import Conn, connect_stream, flood_target, new_peer


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


def _dcutr(peers: list[ID]) -> tuple[Any, Any, list[tuple[str, str]]]:
    """The library's DCUtR on a stand-in host reaching `peers` through a relay only, and
    the (peer, reason) pairs its punch reporter was told."""
    dcutr, network = flood_target(peers)
    charged: list[tuple[str, str]] = []
    patches.set_punch_reporter(dcutr, lambda peer, reason: charged.append((peer, reason)))
    return dcutr, network, charged


async def test_a_connect_listing_a_third_partys_addresses_costs_at_most_8_dials(
    autojump_clock: object,
) -> None:
    patches.apply()
    attacker, accomplice = new_peer(), new_peer()
    dcutr, network, charged = _dcutr([attacker, accomplice])
    victim = [f"/ip4/198.51.100.7/tcp/{port}" for port in range(1000, 1400)]
    per_message = []
    for i in range(8):  # eight CONNECTs of 400 addresses each, as the attack sent them
        before = len(network.dials)
        offered = victim[i * 50 :] + victim[: i * 50]  # a new order each time
        await dcutr._handle_dcutr_stream(connect_stream(attacker, offered))
        per_message.append(len(network.dials) - before)
    assert max(per_message) <= 8, per_message
    assert network.again_within_a_minute == 0
    assert charged and {peer for peer, _ in charged} == {attacker.to_base58()}
    # another peer naming the addresses already dialled gets none of them within the minute
    before = len(network.dials)
    await dcutr._handle_dcutr_stream(connect_stream(accomplice, network.dials[:8]))
    assert len(network.dials) == before
    assert accomplice.to_base58() in {peer for peer, _ in charged}
    assert len(dcutr.host.get_peerstore().addrs(attacker)) <= 8 * 20  # stored: 20 a message


async def test_an_honest_hole_punch_still_dials_the_peers_addresses(
    autojump_clock: object,
) -> None:
    patches.apply()
    honest = new_peer()
    dcutr, network, charged = _dcutr([honest])
    own = ["/ip4/198.51.100.20/tcp/4100", "/ip4/198.51.100.20/tcp/4101"]
    await dcutr._handle_dcutr_stream(connect_stream(honest, own))
    assert sorted(network.dials) == own
    assert not charged
    # never loopback (this machine), our own IP, or a peer reached directly
    network.dials.clear()
    odd = ["/ip4/127.0.0.1/tcp/22", "/ip4/10.9.9.9/tcp/80", "/ip4/0.0.0.0/tcp/1"]
    await dcutr._handle_dcutr_stream(connect_stream(honest, odd))
    assert network.dials == [] and not charged
    direct = new_peer()
    network.connections[direct] = [Conn("/ip4/198.51.100.30/tcp/4100")]
    await dcutr._handle_dcutr_stream(connect_stream(direct, ["/ip4/198.51.100.30/tcp/4100"]))
    assert network.dials == []
