"""No single validator decides alone: a validator answers another's failed verdict with its
own, published, verdict (a real peer running `node.roles.validator.run`, its audit a
stand-in), so a trainer hears a second opinion before it withdraws anything: the re-audit
of a record it had not audited, and its unpublished verdict of a record it audited only
for its producer's window."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from protocol.admission import Kind
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.wire import RolloutRecord, Verdict
from tests.support.polling import until
from tests.test_node_fraud import _manifest, _record, _stand_in_audit, _validator

pytestmark = pytest.mark.network


async def test_a_failed_verdict_is_answered_by_our_own_published_verdict(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    me, liar, honest = Identity.generate(), Identity.generate(), Identity.generate()
    manifest = _manifest("reaudit", me, liar)
    seqs = iter(range(1, 100))

    def fail(data: bytes) -> bytes:
        rid = content_id(decode(RolloutRecord, data).header)
        v = Verdict(
            rollout_id=rid,
            producer=honest.peer_id,
            passed=False,
            reason="proof-mismatch",
            reward_rescored=0.0,
            metrics=(),
        )
        ms = int(time.time() * 1000)
        return seal(liar, v, run_id="reaudit", policy_version=0, seq=next(seqs), timestamp_ms=ms)

    # Every producer window audited whole, no record sampled on its own ticket.
    async with _validator(
        tmp_path, monkeypatch, manifest, me, _stand_in_audit, 0.0, window_fraction=1.0
    ) as (peer, ctx):
        sender = Identity.generate().peer_id_b58
        window_only = _record(honest, manifest, 0, cheat=False)
        assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, window_only)).accepted
        await until("audited for its window", lambda: ctx.status.get("window_audited", 0) >= 1)
        rid = content_id(decode(RolloutRecord, window_only).header)
        assert peer.store.verdicts_for(rid) == []  # nothing said yet
        assert (await peer.admit(sender, Kind.VERDICT, fail(window_only))).accepted
        await until(
            "our verdict is published",
            lambda: any(
                v.validator == me.peer_id and v.accepted for v in peer.store.verdicts_for(rid)
            ),
        )
        # A record we never audited: the fail opens a case, our re-audit is published.
        fresh = _record(honest, manifest, 1, cheat=False)
        rid2 = content_id(decode(RolloutRecord, fresh).header)
        assert (await peer.admit(sender, Kind.VERDICT, fail(fresh))).accepted
        assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, fresh)).accepted
        await until(
            "the re-audit is published",
            lambda: any(
                v.validator == me.peer_id and v.accepted for v in peer.store.verdicts_for(rid2)
            ),
        )
        assert peer.admission.scores.score(liar.peer_id_b58, time.time()) < 0
        # Re-audited and audited for its window: a second fail is not answered twice (two
        # verdicts of ours on one rollout could be held against our own key).
        await until("audited for its window too", lambda: ctx.status.get("window_audited", 0) >= 2)
        liar2 = fail(fresh)
        assert (await peer.admit(sender, Kind.VERDICT, liar2)).accepted
        await trio.sleep(0.5)  # what would publish a second verdict runs at once
        mine = [v for v in peer.store.verdicts_for(rid2) if v.validator == me.peer_id]
        assert len(mine) == 1
