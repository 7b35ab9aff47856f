"""A fast honest producer is never punished for its rate: peers drop what is over their
per-producer rate without charging it, and the node's outbox paces what it publishes to
that rate, so everything it sends is admitted.

Both run on a virtual clock (trio's MockClock, admission fed the same times): three
minutes of a worker producing at 4x the peers' `signer_rate` take a second or two."""

from __future__ import annotations

import trio
import trio.testing

from node.host.host import HostSettings
from node.peer.gossip import Outbox
from node.peer.peer import PACE_MARGIN
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Ban,
    Deliver,
    Disconnect,
    Kind,
    Reason,
    Reject,
)
from protocol.codec import decode
from protocol.wire import HeaderBatch
from tests.test_protocol_admission import ALICE, T0, header, msg, record, rules

RUN_S = 180.0
CFG = AdmissionConfig()
FAST = 4 * CFG.signer_rate  # headers a second the worker makes


def _headers(seq: int, at: float) -> bytes:
    return header(record(ALICE, seq=seq, at=at))


def test_a_producer_at_four_times_the_signer_rate_is_dropped_free_never_banned() -> None:
    a = Admission(rules(), CFG, version=10)
    seq, accepted, refused = 0, 0, []
    steps = int(RUN_S * 10)
    for step in range(steps):  # every 0.1 s, FAST/10 headers straight from the producer
        now = T0 + step / 10
        for _ in range(int(FAST / 10)):
            seq += 1
            out = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, _headers(seq, now), now))
            assert not any(isinstance(x, (Ban, Disconnect)) for x in out), out
            accepted += any(isinstance(x, Deliver) for x in out)
            refused += [x for x in out if isinstance(x, Reject)]
    assert refused and all(r.reason is Reason.RATE_LIMITED and r.penalty == 0.0 for r in refused)
    # what it accepted: the burst, then its rate
    assert accepted >= CFG.signer_rate * RUN_S * 0.95


class _Host:
    settings = HostSettings()

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, bytes]] = []

    async def publish(self, topic: str, data: bytes) -> None:
        self.sent.append((trio.current_time(), topic, data))


def test_the_outbox_paces_a_fast_worker_to_what_its_peers_admit() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    host = _Host()

    async def worker() -> None:
        box = Outbox(
            host,
            8.0,
            max_batch=8,
            batch_topics={"h": "hb"},  # type: ignore[arg-type]
            item_rate_per_s=PACE_MARGIN * CFG.signer_rate,
            item_burst=PACE_MARGIN * CFG.signer_burst,
        )
        seq = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(box.run)
            while trio.current_time() < RUN_S:  # 16 headers every 16/FAST s, or slower when full
                await box.put_many(
                    "h", [_headers(seq + i + 1, T0 + trio.current_time()) for i in range(16)]
                )
                seq += 16
                await trio.sleep(16 / FAST)
            nursery.cancel_scope.cancel()

    trio.run(worker, clock=clock)
    a = Admission(rules(), CFG, version=10)
    delivered = 0
    for at, topic, data in host.sent:
        items = decode(HeaderBatch, data).headers if topic == "hb" else (data,)
        for h in items:
            out = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, T0 + at))
            assert any(isinstance(x, Deliver) for x in out), out  # nothing it sends is refused
            delivered += 1
    # it delivers what its peers accept (a margin below their rate)
    assert delivered >= PACE_MARGIN * CFG.signer_rate * RUN_S * 0.95
