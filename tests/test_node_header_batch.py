"""Header batching: several signed headers per gossip message, each admitted on its own
(a bad one is refused and blamed alone, and stops the batch at the first hop); a busy
producer's queued headers leave together instead of one per paced message."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.peer.gossip import topic_name
from node.peer.peer import open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.codec import decode, encode
from protocol.wire import HeaderBatch, RolloutRecord
from tests.support.peers import relay_config
from tests.support.polling import until

pytestmark = pytest.mark.network


async def test_a_busy_producer_sends_its_headers_in_batches(tmp_path: Path) -> None:
    manifest = net_manifest("batch")
    n = 24
    async with open_peer(relay_config(tmp_path, "b", manifest)) as b:
        async with open_peer(
            relay_config(
                tmp_path,
                "a",
                manifest,
                publish_rate_per_s=2.0,
                bootstrap=(b.host.listen_addrs()[0],),
            )
        ) as a:
            await a.host.wait_for_topic_peers(a.topics["rollouts"], 1, 10)
            for i in range(n):
                await a.produce(
                    synthetic_record(a.identity, manifest, i, n_completion=16, seq=a.seq.next())
                )
            await until("b admits every header", lambda: b.counters["in_rollout_header"] >= n)
            assert a.outbox.stats.batches < n // 2  # at 2 messages/s, 24 headers took few messages
            assert a.stats()["header_batch_mean"] > 2
            assert b.counters["in_header_batch"] == a.outbox.stats.batches
            assert b.rejects.get("malformed", 0) == 0


async def test_each_header_in_a_batch_is_admitted_on_its_own(tmp_path: Path) -> None:
    manifest = net_manifest("batch-hop")
    async with (
        open_peer(relay_config(tmp_path, "b", manifest)) as b,
        open_peer(
            relay_config(
                tmp_path, "a", manifest, max_peers=1, bootstrap=(b.host.listen_addrs()[0],)
            )
        ) as a,
        open_peer(
            relay_config(
                tmp_path, "c", manifest, max_peers=1, bootstrap=(b.host.listen_addrs()[0],)
            )
        ) as c,
    ):
        await until("chain a - b - c", lambda: len(b.host.connected_peers()) == 2)
        topic = topic_name(manifest.run_id, "header-batches")
        await a.host.wait_for_topic_peers(topic, 1, 10)
        await c.host.wait_for_topic_peers(topic, 1, 10)

        def header(i: int) -> bytes:
            rec = synthetic_record(a.identity, manifest, i, n_completion=16, seq=a.seq.next())
            return decode(RolloutRecord, rec).header

        mixed = HeaderBatch(headers=(header(0), b"\xc1not a header", header(1)))
        await a.host.publish(topic, encode(mixed))
        await until("b admits the two good headers", lambda: b.counters["in_rollout_header"] >= 3)
        await until("b refuses the bad one", lambda: b.rejects.get("malformed", 0) == 1)
        good = HeaderBatch(headers=(header(2), header(3)))
        await a.host.publish(topic, encode(good))
        await until("c gets the good batch", lambda: c.counters["in_rollout_header"] >= 2)
        await trio.sleep(1.0)
        assert c.counters["in_rollout_header"] == 2  # the mixed batch stopped at b
        assert c.rejects.get("malformed", 0) == 0
        assert b.counters["in_header_batch"] == 2

        await a.host.publish(topic, b"\x92\x01garbage")  # broken framing: malformed, blamed on a
        await until("b refuses broken framing", lambda: b.rejects.get("malformed", 0) == 2)
