"""Fraud evidence in the validator role: a real peer (py-libp2p host,
admission, SQLite store) running `node.roles.validator.run`. Another validator's failed
verdict is re-checked by our own audit before anyone pays: reproduced, the producer is
banned; not reproduced, the accuser pays and the producer does not.

The audit itself is replaced by a stand-in (a record "cheats" when its claimed reward is
at least 0.5): `verify.auditor.audit_many` has tests of its own; this measures the wiring."""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import pytest
import trio

from node.peer.peer import PeerConfig, open_peer
from node.roles import RoleIO, ValidatorConfig
from node.roles import validator as validator_role
from node.run_file import manifest_from_table
from node.testing.records import synthetic_record
from protocol.admission import Kind
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.producer_cases import PRODUCER_PENALTY, WINDOW_OVER
from protocol.rollout import open_header
from protocol.standing import StandingBook
from protocol.wire import Metric, ProducerClaim, RolloutRecord, Verdict
from tests.support.polling import until
from verify.auditor import AuditSettings
from verify.producer import WINDOW

pytestmark = pytest.mark.network


def _stand_in_audit(rollouts, model, **_kw):  # type: ignore[no-untyped-def]
    return [
        Verdict(
            rollout_id=ro.rollout_id,
            producer=ro.envelope.signer,
            passed=ro.header.reward < 0.5,
            reason="ok" if ro.header.reward < 0.5 else "reward-mismatch",
            reward_rescored=0.0,
            metrics=(),
        )
        for ro in rollouts
    ]


def _record(producer: Identity, manifest, counter: int, cheat: bool) -> bytes:  # type: ignore[no-untyped-def]
    """A record whose claimed reward is on the wanted side (bodies differ by counter)."""
    for seed in range(counter * 1000, counter * 1000 + 100):
        data = synthetic_record(
            producer,
            manifest,
            counter,
            n_prompt=8,
            n_completion=32,
            seq=counter + 1,
            rng=random.Random(seed),
        )
        _env, header, _rid = open_header(decode(RolloutRecord, data).header)
        if (header.reward >= 0.5) == cheat:
            return data
    raise AssertionError("no record found")


def _manifest(run_id: str, *validators: Identity):  # type: ignore[no-untyped-def]
    return manifest_from_table(
        {
            "run": {
                "id": run_id,
                "seed": 7,
                "max_staleness": 2,
                "validator_keys": [v.peer_id_b58 for v in validators],
            },
            "datasets": [{"name": "basic_arithmetic", "weight": 1}],
        }
    )


@contextlib.asynccontextmanager
async def _validator(
    tmp_path: Path,
    monkeypatch,
    manifest,
    me: Identity,
    audit,
    fraction: float,
    window_fraction: float = 0.0,
    probation: bool = False,
):  # type: ignore[no-untyped-def]
    """A real peer running the validator role, its audit replaced by `audit`; yields the
    peer and the role's context (whose `status` the role updates). `window_fraction`: the
    share of producers' windows audited whole (0 here unless a test says). Fresh keys
    start in good standing unless `probation` (then their records are all sampled)."""
    monkeypatch.setattr(
        validator_role,
        "load",
        lambda config, m, say: (object(), None, AuditSettings(), frozenset()),
    )
    if not probation:
        monkeypatch.setattr(
            validator_role, "StandingBook", lambda: StandingBook(probation_passes=0)
        )
    monkeypatch.setattr("verify.auditor.audit_many", audit)
    cfg = PeerConfig(
        manifest=manifest,
        identity=me,
        data_dir=tmp_path / "v",
        roles=("validator",),
        pull_bodies=False,
    )
    config = ValidatorConfig(audit_fraction=fraction, producer_window_fraction=window_fraction)
    ctx = RoleIO(say=lambda _m: None)
    async with open_peer(cfg) as peer, trio.open_nursery() as nursery:
        nursery.start_soon(validator_role.run, peer, config, ctx)
        await trio.sleep(0.2)
        yield peer, ctx
        nursery.cancel_scope.cancel()


async def test_failed_verdicts_are_rechecked_before_anyone_pays(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    me, accuser = Identity.generate(), Identity.generate()
    honest, cheat = Identity.generate(), Identity.generate()
    manifest = _manifest("fraud", me, accuser)
    async with _validator(tmp_path, monkeypatch, manifest, me, _stand_in_audit, 0.0) as (peer, ctx):
        sender = Identity.generate().peer_id_b58  # a relay: it never pays for either
        honest_rec = _record(honest, manifest, 0, cheat=False)
        cheat_rec = _record(cheat, manifest, 0, cheat=True)
        late_rec = _record(honest, manifest, 1, cheat=False)
        for data in (honest_rec, cheat_rec):
            assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, data)).accepted

        seqs = iter(range(1, 100))

        def accuse(data: bytes, producer: Identity) -> bytes:
            rid = content_id(decode(RolloutRecord, data).header)
            verdict = Verdict(
                rollout_id=rid,
                producer=producer.peer_id,
                passed=False,
                reason="proof-mismatch",
                reward_rescored=0.0,
                metrics=(),
            )
            return seal(
                accuser,
                verdict,
                run_id=manifest.run_id,
                policy_version=0,
                seq=next(seqs),
                timestamp_ms=int(time.time() * 1000),
            )

        assert (await peer.admit(sender, Kind.VERDICT, accuse(honest_rec, honest))).accepted
        assert (await peer.admit(sender, Kind.VERDICT, accuse(cheat_rec, cheat))).accepted
        scores = peer.admission.scores
        await until("the cheat is banned", lambda: peer.host.is_banned(cheat.peer_id_b58))
        await until(
            "the false accuser pays", lambda: scores.score(accuser.peer_id_b58, time.time()) < 0
        )
        assert scores.score(honest.peer_id_b58, time.time()) >= 0
        assert not peer.host.is_banned(honest.peer_id_b58)
        assert scores.score(sender, time.time()) >= 0  # the relay of both
        # evidence arriving before its record: the body, once it comes, is re-checked
        before = scores.score(accuser.peer_id_b58, time.time())
        assert (await peer.admit(sender, Kind.VERDICT, accuse(late_rec, honest))).accepted
        await trio.sleep(0.3)
        assert scores.score(accuser.peer_id_b58, time.time()) == pytest.approx(before, abs=0.5)
        handled = await peer.admit(sender, Kind.ROLLOUT_RECORD, late_rec)
        ok, acts = handled.accepted, handled.actions
        assert ok, acts
        await until(
            "the second false accusation costs",
            lambda: scores.score(accuser.peer_id_b58, time.time()) < before - 10,
        )
        assert ctx.status["fraud"]["convicted"] == 1
        assert ctx.status["fraud"]["acquitted"] == 2


async def test_a_producer_whose_window_statistic_is_over_the_limit_pays(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Every record of a slightly-off worker passes alone; its window of WINDOW audited
    records has WINDOW_OVER or more over the calibrated limit, so it pays, once per
    window. An honest worker whose records spike one by one (fewer than WINDOW_OVER a
    window) does not."""
    me, honest, drifty = Identity.generate(), Identity.generate(), Identity.generate()
    manifest = _manifest("producer", me)
    limit = AuditSettings().thresholds.producer_logprob_err_median
    counter = {honest.peer_id: 0}

    def audit(rollouts, model, **_kw):  # type: ignore[no-untyped-def]
        out = []
        for ro in rollouts:
            if ro.envelope.signer == honest.peer_id:
                counter[honest.peer_id] += 1  # a few records of the honest one spike
                value = (
                    3 * limit
                    if counter[honest.peer_id] % (WINDOW // (WINDOW_OVER - 1)) == 0
                    else limit / 10
                )
            else:
                value = 2 * limit  # each record passes (the per-record limit is higher)
            out.append(
                Verdict(
                    rollout_id=ro.rollout_id,
                    producer=ro.envelope.signer,
                    passed=True,
                    reason="ok",
                    reward_rescored=0.0,
                    metrics=(Metric(name="logprob_err_mean", value=value),),
                )
            )
        return out

    async with _validator(tmp_path, monkeypatch, manifest, me, audit, 1.0) as (peer, ctx):
        sender = Identity.generate().peer_id_b58
        scores = peer.admission.scores
        for i in range(2 * WINDOW):
            for producer, counter0 in ((honest, 0), (drifty, 64 * WINDOW)):  # bodies differ
                data = _record(producer, manifest, counter0 + i, cheat=False)
                assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, data)).accepted
        await until("two windows judged", lambda: ctx.status.get("producer_windows") == 4)
        await trio.sleep(0.3)
        assert ctx.status["passed"] == 4 * WINDOW
        assert scores.score(drifty.peer_id_b58, time.time()) <= 2 * PRODUCER_PENALTY + 5
        assert scores.score(honest.peer_id_b58, time.time()) >= 0
        last = ctx.status["producer_findings_last"]
        assert {f["producer"] for f in last} == {drifty.peer_id.hex()[-12:]}
        windows = [f for f in last if f["rule"] == "window"]
        assert len(windows) == 2  # and the sequential rule found it within each window
        assert all(f["records"] == WINDOW and f["statistic"] > f["limit"] for f in windows)


async def test_windows_are_audited_whole_when_single_records_are_sampled_rarely(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """With records sampled one by one (`audit_fraction`, 0.25 by default) a window of
    WINDOW records would be all audited with probability 0.25**16, so the per-producer
    rule would never judge one. A window whose own ticket is sampled
    (`producer_window_fraction`) is audited whole: here no record of a producer in good
    standing is sampled alone and every window whole. A fresh key is on probation: its
    first two windows are all sampled (and published); once it has passed them, its
    slightly-off window is audited whole, it pays and no verdict is published for it
    (the sequential rule finds it within the window, the window rule at its end)."""
    me, drifty = Identity.generate(), Identity.generate()
    manifest = _manifest("windows", me)
    limit = AuditSettings().thresholds.producer_logprob_err_median

    def audit(rollouts, model, **_kw):  # type: ignore[no-untyped-def]
        return [
            Verdict(
                rollout_id=ro.rollout_id,
                producer=ro.envelope.signer,
                passed=True,
                reason="ok",
                reward_rescored=0.0,
                metrics=(
                    Metric(
                        name="logprob_err_mean",
                        value=2 * limit if ro.header.counter >= 2 * WINDOW else limit / 10,
                    ),
                ),
            )
            for ro in rollouts
        ]

    published: list[object] = []
    async with _validator(
        tmp_path, monkeypatch, manifest, me, audit, 0.0, window_fraction=1.0, probation=True
    ) as (peer, ctx):
        monkeypatch.setattr(peer, "publish_verdict", lambda v: published.append(v) or trio.sleep(0))
        sender = Identity.generate().peer_id_b58
        for i in range(2 * WINDOW):  # its probation: every record sampled
            assert (
                await peer.admit(
                    sender, Kind.ROLLOUT_RECORD, _record(drifty, manifest, i, cheat=False)
                )
            ).accepted
        await until(
            "the probation's windows judged", lambda: ctx.status.get("producer_windows") == 2
        )
        assert ctx.status["sampled"] == 2 * WINDOW and len(published) == 2 * WINDOW
        for i in range(2 * WINDOW, 3 * WINDOW):
            assert (
                await peer.admit(
                    sender, Kind.ROLLOUT_RECORD, _record(drifty, manifest, i, cheat=False)
                )
            ).accepted
        await until("the window judged", lambda: ctx.status.get("producer_windows") == 3)
        assert ctx.status["producer_findings"] >= 1
        # audited whole (once the sequential rule banned it, every record is sampled)
        assert ctx.status["window_audited"] + ctx.status["sampled"] == 3 * WINDOW
        assert len(published) == 2 * WINDOW
        assert peer.admission.scores.score(drifty.peer_id_b58, time.time()) <= PRODUCER_PENALTY + 5


async def test_a_producer_claim_is_rechecked_before_anyone_pays(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Another validator's producer claim: we audit every record of the window ourselves;
    our median over the limit costs the producer, within it the accuser; a claim over
    records that are not one window of the producer costs the accuser at once."""
    me, accuser = Identity.generate(), Identity.generate()
    drifty, honest = Identity.generate(), Identity.generate()
    manifest = _manifest("claims", me, accuser)
    limit = AuditSettings().thresholds.producer_logprob_err_median

    def audit(rollouts, model, **_kw):  # type: ignore[no-untyped-def]
        return [
            Verdict(
                rollout_id=ro.rollout_id,
                producer=ro.envelope.signer,
                passed=True,
                reason="ok",
                reward_rescored=0.0,
                metrics=(
                    Metric(
                        name="logprob_err_mean",
                        value=2 * limit if ro.envelope.signer == drifty.peer_id else limit / 10,
                    ),
                ),
            )
            for ro in rollouts
        ]

    async with _validator(tmp_path, monkeypatch, manifest, me, audit, 0.0) as (peer, ctx):
        sender = Identity.generate().peer_id_b58  # a relay of everything: never pays
        scores = peer.admission.scores
        windows: dict[bytes, tuple[bytes, ...]] = {}
        for producer, counter0 in ((drifty, 0), (honest, 2 * WINDOW)):
            rids = []
            for c in range(counter0, counter0 + WINDOW):
                data = _record(producer, manifest, c, cheat=False)
                assert (await peer.admit(sender, Kind.ROLLOUT_RECORD, data)).accepted
                rids.append(content_id(decode(RolloutRecord, data).header))
            windows[producer.peer_id] = tuple(rids)
        seqs = iter(range(1, 100))

        def claim(producer: Identity, rids: tuple[bytes, ...]) -> bytes:
            c = ProducerClaim(
                producer=producer.peer_id,
                rollout_ids=rids,
                statistic="logprob_err_mean",
                median=1.0,
                limit=limit,
            )
            return seal(
                accuser,
                c,
                run_id=manifest.run_id,
                policy_version=0,
                seq=next(seqs),
                timestamp_ms=int(time.time() * 1000),
            )

        assert (
            await peer.admit(sender, Kind.PRODUCER_CLAIM, claim(drifty, windows[drifty.peer_id]))
        ).accepted
        await until(
            "the drifty producer pays",
            lambda: scores.score(drifty.peer_id_b58, time.time()) <= PRODUCER_PENALTY + 5,
        )
        assert scores.score(accuser.peer_id_b58, time.time()) >= 0
        assert (
            await peer.admit(sender, Kind.PRODUCER_CLAIM, claim(honest, windows[honest.peer_id]))
        ).accepted
        await until(
            "the false accuser pays", lambda: scores.score(accuser.peer_id_b58, time.time()) < 0
        )
        assert scores.score(honest.peer_id_b58, time.time()) >= 0
        before = scores.score(accuser.peer_id_b58, time.time())
        # half of each window, claimed as one of the honest producer's
        mixed = windows[honest.peer_id][: WINDOW // 2] + windows[drifty.peer_id][: WINDOW // 2]
        assert (await peer.admit(sender, Kind.PRODUCER_CLAIM, claim(honest, mixed))).accepted
        await until(
            "a claim that is no window costs its signer",
            lambda: scores.score(accuser.peer_id_b58, time.time()) < before - 10,
        )
        assert scores.score(honest.peer_id_b58, time.time()) >= 0
        assert scores.score(sender, time.time()) >= 0
        assert ctx.status["producer_claims"]["convicted"] == 1
