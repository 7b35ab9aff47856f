"""Trust wiring in the running peer: store before forward, one pump, public
reports, and pulled records that must be the ones asked for."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import trio

from node.host.host import Later
from node.peer.peer import open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import Kind
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.wire import RolloutRecord
from tests.support.peers import relay_config

pytestmark = pytest.mark.network


async def _call(check, *args):  # type: ignore[no-untyped-def]
    """What GossipSub ends up doing with a message: the validator's answer, and for one
    accepted `Later`, whether the host forwards it once the condition holds."""
    out = check(*args)
    out = await out if inspect.isawaitable(out) else out
    return await out.wait() if isinstance(out, Later) else out


async def test_gossip_is_forwarded_only_once_it_is_stored(tmp_path: Path) -> None:
    """The GossipSub validator answers "forward" only after the batched store wrote the
    header, and "drop" if the write fails."""
    manifest = net_manifest("order")
    producer = Identity.generate()
    async with open_peer(relay_config(tmp_path, "t", manifest, pull_bodies=False)) as peer:
        check = peer._validator(Kind.ROLLOUT_HEADER)  # what GossipSub calls
        for i in range(3):
            header = decode(RolloutRecord, synthetic_record(producer, manifest, i)).header
            assert await _call(check, producer.peer_id_b58, header, producer.peer_id_b58)
            assert peer.store.has_rollout(content_id(header)), "forwarded before stored"
        # A store that fails: not forwarded, and a later copy may be admitted.
        real = peer.store.put_admitted_many

        def broken(*a, **k):  # type: ignore[no-untyped-def]
            raise ValueError("disk full")

        peer.store.put_admitted_many = broken  # type: ignore[method-assign]
        peer.store.put_admitted = broken  # type: ignore[method-assign]
        header = decode(RolloutRecord, synthetic_record(producer, manifest, 3)).header
        assert not await _call(check, producer.peer_id_b58, header, producer.peer_id_b58)
        peer.store.put_admitted_many = real  # type: ignore[method-assign]
        del peer.store.put_admitted
        assert await _call(check, producer.peer_id_b58, header, producer.peer_id_b58)
        assert peer.store.has_rollout(content_id(header))


async def test_roles_report_through_a_public_method(tmp_path: Path) -> None:
    manifest = net_manifest("report")
    cheat = Identity.generate()
    async with open_peer(relay_config(tmp_path, "v", manifest)) as peer:
        for _ in range(10):
            peer.report(cheat.peer_id, -20.0, "failed audit: test")
        await trio.sleep(0.1)
        assert peer.host.is_banned(cheat.peer_id_b58)


def test_bodyless_headers_expire_from_the_store(tmp_path: Path) -> None:
    """Rows of headers whose body never came are pruned from the store."""
    import time as _time

    from node.store.store import RolloutRow, Store
    from protocol.rollout import open_record

    manifest = net_manifest("expire")
    producer = Identity.generate()
    with Store.open(tmp_path / "s") as store:
        rids = []
        for i in range(3):
            rec = synthetic_record(producer, manifest, i)
            op = open_record(rec)
            r = decode(RolloutRecord, rec)
            body = r.body if i == 0 else None
            store.put_rollout(
                RolloutRow(
                    op.rollout_id,
                    manifest.run_id,
                    producer.peer_id,
                    0,
                    r.header,
                    body,
                    1000.0 + i,
                    "12D3KooWsender",
                )
            )
            rids.append(op.rollout_id)
        assert store.expire_bodyless(1001.5) == 1  # only the old one without a body
        assert store.has_rollout(rids[0]) and not store.has_rollout(rids[1])
        assert store.has_rollout(rids[2])
        assert store.expire_bodyless(_time.time()) == 1


async def test_a_small_request_cannot_pull_more_than_the_byte_budget(tmp_path: Path) -> None:
    """A 1 KB request pulls at most MAX_RESPONSE_BYTES (not 32 x 4 MiB)."""
    from node.exchange import rollouts as rx

    class FakeStream:
        peer = "client"

        def __init__(self, requests: list[bytes]) -> None:
            self.requests, self.sent = requests, []

        async def receive(self, _cap: int) -> bytes:
            if not self.requests:
                from node.host.host import PeerUnreachable

                raise PeerUnreachable(self.peer, "closed")
            return self.requests.pop(0)

        async def send(self, data: bytes) -> None:
            self.sent.append(data)

    big = b"x" * (3 * 1024 * 1024)

    async def lookup(ids: list[bytes]) -> list[bytes | None]:
        return [big for _ in ids]

    sent: list[int] = []
    s = FakeStream([rx.encode_request([bytes([i]) * 32 for i in range(32)])])
    await rx.server("run", lookup, sent.append)(s)  # type: ignore[arg-type]
    n = sum(sent)
    assert len(s.sent) == 32 and n == rx.MAX_RESPONSE_BYTES // len(big)
    assert sum(len(x) for x in s.sent) <= rx.MAX_RESPONSE_BYTES
