"""Two real peers on loopback: a worker that produces at 4x its peer's `signer_rate` is
paced by its outbox to what the peer admits; the peer refuses nothing for rate and never
bans it. (`tests/test_node_rate_pacing.py` runs the same outbox and admission for three
virtual minutes; this one shows the real peer and gossip path for 20 real seconds.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node.peer.peer import PACE_MARGIN, PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.identity import Identity

pytestmark = [pytest.mark.network, pytest.mark.slow]

RUN_S = 20.0


def _cfg(tmp: Path, name: str, manifest, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest, identity=Identity.generate(), data_dir=tmp / name, roles=("relay",), **kw
    )


async def test_a_worker_at_four_times_the_signer_rate_is_paced_never_banned(tmp_path: Path) -> None:
    manifest = net_manifest("fast")
    async with (
        open_peer(_cfg(tmp_path, "b", manifest)) as b,
        open_peer(_cfg(tmp_path, "a", manifest, bootstrap=(b.host.listen_addrs()[0],))) as a,
    ):
        await a.host.wait_for_topic_peers(a.topics["rollouts"], 1, 10)
        rate = b.admission.config.signer_rate
        counter = 0
        started = time.monotonic()
        while time.monotonic() - started < RUN_S:  # 16 records every 16 / (4 x rate) s
            batch = [
                synthetic_record(a.identity, manifest, counter + i, n_completion=8)
                for i in range(16)
            ]
            counter += 16
            await a.produce_many(batch)  # waits while the outbox is full
            await trio.sleep(16 / (4 * rate))
        elapsed = time.monotonic() - started
        with trio.move_on_after(10):
            while b.counters["in_rollout_header"] < a.outbox.stats.published:
                await trio.sleep(0.1)
        assert not b.host.is_banned(a.host.peer_id), (
            dict(b.rejects),
            b.store.ledger(direction="in", outcome="rejected", limit=5),
        )
        assert b.rejects.get("rate_limited", 0) == 0, dict(b.rejects)
        assert a.host.peer_id in b.host.connected_peers()
        got = b.counters["in_rollout_header"]
        # what the peer admits, a margin below its rate (plus the first burst)
        assert got >= 0.9 * PACE_MARGIN * rate * elapsed, (got, elapsed)
        assert got <= rate * elapsed + b.admission.config.signer_burst, (got, elapsed)
