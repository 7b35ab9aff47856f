"""Stopping loses no queued work: leaving `open_peer` publishes what the outbox still holds
(headers, verdicts) within a bounded wait, before the host closes."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.peer.peer import open_peer
from node.testing.records import net_manifest, synthetic_record
from tests.support.peers import relay_config

pytestmark = pytest.mark.network


async def test_stop_publishes_the_queued_headers(tmp_path: Path) -> None:
    manifest = net_manifest("drain")
    n = 16
    async with open_peer(relay_config(tmp_path, "b", manifest)) as b:
        a_cfg = relay_config(
            tmp_path,
            "a",
            manifest,
            publish_rate_per_s=4.0,
            header_batch=1,
            bootstrap=(b.host.listen_addrs()[0],),
        )
        async with open_peer(a_cfg) as a:
            await a.host.wait_for_topic_peers(a.topics["rollouts"], 1, 10)
            for i in range(n):
                await a.produce(
                    synthetic_record(a.identity, manifest, i, n_completion=16, seq=a.seq.next())
                )
            queued = a.outbox.pending()
            assert queued >= n // 2  # most are still queued when we stop
        # a has stopped; everything it had queued reached b before its host closed
        with trio.move_on_after(10):
            while b.counters["in_rollout_header"] < n:
                await trio.sleep(0.05)
        assert b.counters["in_rollout_header"] == n, (queued, dict(b.counters))
