"""A header whose body no peer serves: pulled a bounded number of times, given up at the
end of the pull window, then forgotten by the store; nothing queues it again."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol import body_pull as bp
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.wire import RolloutRecord

pytestmark = [pytest.mark.network, pytest.mark.slow]

PULL = bp.PullConfig(window_s=2.0, attempts=1000, retry_s=0.2, retry_max_s=0.2)


async def test_a_body_nobody_serves_is_given_up_and_forgotten(tmp_path: Path) -> None:
    manifest = net_manifest("unpullable")

    def cfg(name: str, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
        return PeerConfig(
            manifest=manifest,
            identity=Identity.generate(),
            data_dir=tmp_path / name,
            roles=("relay",),
            pull=PULL,
            **kw,
        )

    async with (
        open_peer(cfg("t")) as t,
        open_peer(cfg("w", pull_bodies=False, bootstrap=(t.host.listen_addrs()[0],))) as w,
    ):
        await w.host.wait_for_topic_peers(w.topics["rollouts"], 1, 10)
        # Gossiped without storing the record first: the producer answers "not held".
        header = decode(
            RolloutRecord, synthetic_record(w.identity, manifest, 0, n_completion=16)
        ).header
        rid = content_id(header)
        with trio.fail_after(20):
            while t.counters["in_rollout_header"] < 1:
                await w.host.publish(w.topics["rollouts"], header)
                await trio.sleep(0.5)
        with trio.fail_after(20):
            while t.counters["pull_gave_up"] < 1:
                await trio.sleep(0.1)
        assert t.puller is not None
        fetched = t.puller.schedule.stats.fetched
        assert fetched <= PULL.window_s / PULL.retry_s + 2  # bounded by the window
        assert t.counters[f"pull_charge_{bp.PRODUCER_LACKS_BODY}"] >= 1
        with trio.fail_after(15):
            while t.store.has_rollout(rid):
                await trio.sleep(0.2)
        await trio.sleep(2.0)
        assert t.puller.schedule.stats.fetched == fetched  # nothing asked for it again
        assert not t.puller.wanted(rid)
