"""A gossip message our validator ignored is marked seen, as go-libp2p marks every message
it has validated (py-libp2p marks only accepted ones): gossip never asks for it again, and
the peer that would answer such asks is never charged for handing us the same copy again.

Two real peers on loopback. The producer gossips a header, then the same header in a
second gossip message (a copy under a new message id: the receiver ignores it as a
duplicate, at no cost). The producer then advertises that message (IHAVE) over and over,
as a peer outside the mesh does each heartbeat, e.g. right after a reconnect. py-libp2p's
cache of validation results holds 1,000 messages, which a busy peer turns over in seconds
(here it is emptied before each advert); unmarked, each advert then drew an IWANT, the copy
came back through admission, and the same peer handing the same copy again used up its
allowance for copies and paid `flooding` (what a default devnet showed after reconnects)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.codec import decode
from protocol.identity import Identity
from protocol.wire import RolloutRecord

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _cfg(tmp: Path, name: str, manifest, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest,
        identity=Identity.generate(),
        data_dir=tmp / name,
        roles=("relay",),
        header_batch=1,
        **kw,
    )


async def test_an_ignored_copy_advertised_again_is_not_asked_for_nor_charged(
    tmp_path: Path,
) -> None:
    manifest = net_manifest("seen")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest, bootstrap=(b.host.listen_addrs()[0],))) as a,
    ):
        topic = a.topics["rollouts"]
        await a.host.wait_for_topic_peers(topic, 1, 10)
        record = synthetic_record(a.identity, manifest, 0, n_completion=8)
        await a.produce(record)
        with trio.fail_after(10):
            while b.counters["in_rollout_header"] < 1:
                await trio.sleep(0.05)
        pubsub, router = a.host._pubsub, a.host._pubsub.router
        sent: list = []
        publish = router.publish

        async def capture(forwarder, msg):  # type: ignore[no-untyped-def]
            sent.append(msg)
            await publish(forwarder, msg)

        router.publish = capture
        await a.host.publish(topic, decode(RolloutRecord, record).header)  # a copy, a new id
        router.publish = publish
        with trio.fail_after(10):
            while b.counters["in_rollout_header"] < 2:
                await trio.sleep(0.05)
        msg_id = pubsub.get_message_id(sent[0])
        b_id = next(p for p in pubsub.peers if str(p) == b.host.peer_id)
        cache = b.host._pubsub.validation_cache
        for _ in range(70):  # heartbeat gossip advertising the copy again
            cache.cache.clear()  # turned over by a busy peer's traffic
            cache.access_order.clear()
            await router.emit_ihave(topic, [msg_id], b_id)
            await trio.sleep(0.02)
        await trio.sleep(1.0)
        assert b.rejects.get("flooding", 0) == 0, dict(b.rejects)
        assert b.counters["in_rollout_header"] == 2, dict(b.counters)
        assert b.admission.scores.score(a.host.peer_id, time.time()) >= 0
        assert not b.host.is_banned(a.host.peer_id)
