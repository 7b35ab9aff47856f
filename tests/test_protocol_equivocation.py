"""protocol.equivocation: two signatures of one key over one slot are evidence anyone
re-checks; honest signing (one object per slot, a full manifest and its patch) is none."""

from __future__ import annotations

import dataclasses

import pytest

from protocol.codec import decode, encode
from protocol.envelope import seal
from protocol.equivocation import EquivocationBook, evidence, from_wire
from protocol.errors import DecodeError, SignatureError
from protocol.identity import Identity
from protocol.wire import (
    Envelope,
    EquivocationEvidence,
    ProducerClaim,
    ShardInfo,
    Verdict,
    WeightManifest,
)

RUN = "equiv"
TRAINER, VALIDATOR = Identity.generate(), Identity.generate()
PRODUCER = Identity.generate().peer_id


def _sealed(who: Identity, obj, seq: int = 1, run: str = RUN) -> bytes:  # type: ignore[no-untyped-def]
    return seal(who, obj, run_id=run, policy_version=0, seq=seq, timestamp_ms=1_000 + seq)


def manifest(version: int, digest: bytes, kind: str = "full") -> WeightManifest:
    """A policy version's manifest whose weights have `digest`."""
    return WeightManifest(
        version=version,
        kind=kind,
        base_version=version - 1 if kind == "delta" else 0,
        base_digest=b"b" * 32 if kind == "delta" else b"",
        total_bytes=10,
        file_digest=digest,
        shards=(ShardInfo(index=0, offset=0, size=10, digest=digest),),
    )


def verdict(rid: bytes, passed: bool, reward: float = 0.0) -> Verdict:
    """A verdict on rollout `rid` of `PRODUCER`."""
    return Verdict(
        rollout_id=rid,
        producer=PRODUCER,
        passed=passed,
        reason="ok" if passed else "proof-mismatch",
        reward_rescored=reward,
        metrics=(),
    )


def test_two_manifests_of_one_version_are_evidence_against_the_trainer_key():
    a = _sealed(TRAINER, manifest(2, b"a" * 32), seq=2)
    b = _sealed(TRAINER, manifest(2, b"b" * 32), seq=3)
    ev = evidence(a, b, RUN)
    assert ev.signer == TRAINER.peer_id and ev.version == 2
    assert evidence(b, a) == ev  # canonical: the order received does not matter
    again = from_wire(decode(EquivocationEvidence, encode(ev.wire())), RUN)
    assert again == ev  # self-contained: the wire form re-checks to the same evidence


def test_a_full_manifest_and_its_patch_or_the_next_version_are_no_evidence():
    full = _sealed(TRAINER, manifest(2, b"a" * 32))
    for other in (manifest(2, b"c" * 32, kind="delta"), manifest(3, b"b" * 32)):
        with pytest.raises(DecodeError):
            evidence(full, _sealed(TRAINER, other, seq=5))
    with pytest.raises(DecodeError):  # the same object signed twice agrees with itself
        evidence(full, _sealed(TRAINER, manifest(2, b"a" * 32), seq=9))


def test_verdicts_conflict_only_on_their_decision():
    rid = b"r" * 32
    passed = _sealed(VALIDATOR, verdict(rid, True), seq=1)
    failed = _sealed(VALIDATOR, verdict(rid, False), seq=2)
    assert evidence(passed, failed).kind == Verdict.KIND
    with pytest.raises(DecodeError):  # a re-audit's other measurements, same decision
        evidence(passed, _sealed(VALIDATOR, verdict(rid, True, reward=1.0), seq=3))
    with pytest.raises(DecodeError):  # another rollout
        evidence(passed, _sealed(VALIDATOR, verdict(b"s" * 32, False), seq=4))


def test_producer_claims_of_one_window_that_differ_are_evidence():
    ids = (b"1" * 32, b"2" * 32)
    one = ProducerClaim(producer=PRODUCER, rollout_ids=ids, statistic="m", median=2.0, limit=1.0)
    two = dataclasses.replace(one, limit=3.0)
    assert (
        evidence(_sealed(VALIDATOR, one), _sealed(VALIDATOR, two, seq=2)).kind == "producer_claim"
    )
    again = dataclasses.replace(one, median=2.1)  # the same finding, the value re-measured
    with pytest.raises(DecodeError):
        evidence(_sealed(VALIDATOR, one), _sealed(VALIDATOR, again, seq=3))


def test_evidence_needs_one_key_one_run_and_valid_signatures():
    a = _sealed(TRAINER, manifest(2, b"a" * 32))
    with pytest.raises(DecodeError):  # two keys: no one equivocated
        evidence(a, _sealed(VALIDATOR, manifest(2, b"b" * 32)))
    with pytest.raises(DecodeError):
        evidence(a, _sealed(TRAINER, manifest(2, b"b" * 32), run="other"))
    b = _sealed(TRAINER, manifest(2, b"b" * 32), seq=2)
    with pytest.raises(DecodeError):
        evidence(a, b, run_id="other")
    env = decode(Envelope, b)
    forged = encode(dataclasses.replace(env, signature=bytes(64)))
    with pytest.raises(SignatureError):  # nobody can frame a key without its signatures
        evidence(a, forged)


def test_the_book_turns_a_second_object_into_evidence_once_and_fails_the_key():
    book = EquivocationBook()
    a = _sealed(TRAINER, manifest(2, b"a" * 32))
    b = _sealed(TRAINER, manifest(2, b"b" * 32), seq=2)
    env_a, obj_a = decode(Envelope, a), manifest(2, b"a" * 32)
    env_b, obj_b = decode(Envelope, b), manifest(2, b"b" * 32)
    assert book.observe(env_a, obj_a, a, 1.0) is None
    assert book.observe(env_a, obj_a, a, 1.5) is None  # the same again: nothing
    ev = book.observe(env_b, obj_b, b, 2.0)
    assert ev is not None and book.failed(TRAINER.peer_id) and book.is_disputed(2)
    assert not book.is_disputed(3) and not book.failed(VALIDATOR.peer_id)
    assert book.observe(env_b, obj_b, b, 3.0) is None  # known: no second report
    other = EquivocationBook()
    assert other.learn(ev, 5.0) and not other.learn(ev, 6.0)  # gossiped evidence, once
    assert other.summary()[0]["kind"] == "weight_manifest"


def test_the_book_is_bounded():
    book = EquivocationBook(max_slots=4)
    for i in range(10):
        data = _sealed(VALIDATOR, verdict(bytes([i]) * 32, True), seq=i + 1)
        book.observe(decode(Envelope, data), verdict(bytes([i]) * 32, True), data, float(i))
    assert len(book._seen) == 4  # noqa: SLF001 - the bound is the point


# -- admission: every peer that sees both objects, or the evidence, fails the key --------


def _admission(run: str = RUN):  # type: ignore[no-untyped-def]
    from protocol.admission import Admission, RunRules

    return Admission(
        RunRules(
            run,
            max_staleness=2,
            trainer_keys=frozenset({TRAINER.peer_id}),
            validator_keys=frozenset({VALIDATOR.peer_id}),
        ),
        version=1,
    )


def _sealed_now(who: Identity, obj, seq: int, now: float, version: int = 1) -> bytes:  # type: ignore[no-untyped-def]
    return seal(who, obj, run_id=RUN, policy_version=version, seq=seq, timestamp_ms=int(now * 1000))


T = 1_700_000_000.0
RELAY_A, RELAY_B = Identity.generate().peer_id_b58, Identity.generate().peer_id_b58


def test_a_peer_that_receives_both_manifests_keeps_evidence_and_fails_the_trainer_key():
    from protocol.admission import Equivocated, Kind, MessageReceived, Penalized, Reject

    a = _admission()
    one = _sealed_now(TRAINER, manifest(2, b"a" * 32), 5, T)
    two = _sealed_now(TRAINER, manifest(2, b"b" * 32), 6, T)
    first = a.handle(MessageReceived(RELAY_A, Kind.WEIGHT_ANNOUNCE, one, T))
    assert not any(isinstance(x, Equivocated) for x in first)
    second = a.handle(MessageReceived(RELAY_B, Kind.WEIGHT_ANNOUNCE, two, T + 1))
    found = [x for x in second if isinstance(x, Equivocated)]
    assert len(found) == 1 and found[0].found_here and found[0].evidence.version == 2
    assert a.equivocations.is_disputed(2) and a.authority.failed(TRAINER.peer_id)
    charged = {x.peer for x in second if isinstance(x, Penalized)}
    assert charged == {TRAINER.peer_id_b58}  # the key pays; neither relay does
    assert all(x.penalty == 0 for x in second if isinstance(x, Reject))
    # Its next version is refused, free for a relay that has not heard of the evidence.
    three = _sealed_now(TRAINER, manifest(3, b"c" * 32), 7, T + 2)
    later = a.handle(MessageReceived(RELAY_A, Kind.WEIGHT_ANNOUNCE, three, T + 2))
    assert [(x.reason, x.penalty) for x in later if isinstance(x, Reject)] == [("unauthorized", 0)]


def test_gossiped_evidence_fails_the_key_at_a_peer_that_saw_one_side_only():
    from protocol.admission import Deliver, Equivocated, Forward, Kind, MessageReceived, Penalized

    one = _sealed_now(TRAINER, manifest(2, b"a" * 32), 5, T)
    two = _sealed_now(TRAINER, manifest(2, b"b" * 32), 6, T)
    reporter = Identity.generate()
    wire_ev = evidence(one, two).wire()
    data = _sealed_now(reporter, wire_ev, 1, T + 1)
    b = _admission()
    b.handle(MessageReceived(RELAY_A, Kind.WEIGHT_ANNOUNCE, two, T))  # its side
    out = b.handle(MessageReceived(RELAY_B, Kind.EQUIVOCATION, data, T + 1))
    assert any(isinstance(x, Deliver) for x in out) and any(isinstance(x, Forward) for x in out)
    found = [x for x in out if isinstance(x, Equivocated)]
    assert len(found) == 1 and not found[0].found_here
    assert b.authority.failed(TRAINER.peer_id) and b.equivocations.is_disputed(2)
    assert {x.peer for x in out if isinstance(x, Penalized)} == {TRAINER.peer_id_b58}
    again = _sealed_now(Identity.generate(), wire_ev, 1, T + 2)  # another reporter: known
    out = b.handle(MessageReceived(RELAY_A, Kind.EQUIVOCATION, again, T + 2))
    assert not any(isinstance(x, Equivocated | Penalized) for x in out)


def test_evidence_that_proves_nothing_costs_its_sender():
    from protocol.admission import Kind, MessageReceived, Reject

    one = _sealed_now(TRAINER, manifest(2, b"a" * 32), 5, T)
    fake = EquivocationEvidence(
        first=one, second=_sealed_now(TRAINER, manifest(3, b"b" * 32), 6, T)
    )
    data = _sealed_now(Identity.generate(), fake, 1, T)
    b = _admission()
    out = b.handle(MessageReceived(RELAY_A, Kind.EQUIVOCATION, data, T))
    rejects = [x for x in out if isinstance(x, Reject)]
    assert rejects and rejects[0].reason == "malformed" and rejects[0].penalty < 0
    assert not b.authority.failed(TRAINER.peer_id)


def test_an_equivocating_validator_key_may_no_longer_judge():
    from protocol.admission import Deliver, Equivocated, Kind, MessageReceived, Reject

    a = _admission()
    rid = b"r" * 32
    passed = _sealed_now(VALIDATOR, verdict(rid, True), 1, T)
    failed = _sealed_now(VALIDATOR, verdict(rid, False), 2, T)
    assert any(
        isinstance(x, Deliver) for x in a.handle(MessageReceived(RELAY_A, "verdict", passed, T))
    )
    out = a.handle(MessageReceived(RELAY_B, Kind.VERDICT, failed, T))
    assert any(isinstance(x, Equivocated) for x in out)
    assert not a.authority.may_judge(VALIDATOR.peer_id)
    later = _sealed_now(VALIDATOR, verdict(b"s" * 32, True), 3, T + 1)
    out = a.handle(MessageReceived(RELAY_A, Kind.VERDICT, later, T + 1))
    assert [(x.reason, x.penalty) for x in out if isinstance(x, Reject)] == [("unauthorized", 0)]


def test_evidence_about_a_key_with_no_authority_disputes_nothing():
    from protocol.admission import Kind, MessageReceived, Reject

    nobody = Identity.generate()
    one = _sealed_now(nobody, manifest(2, b"a" * 32), 5, T)
    two = _sealed_now(nobody, manifest(2, b"b" * 32), 6, T)
    data = _sealed_now(Identity.generate(), evidence(one, two).wire(), 1, T)
    b = _admission()
    out = b.handle(MessageReceived(RELAY_A, Kind.EQUIVOCATION, data, T))
    assert [(x.reason, x.penalty) for x in out if isinstance(x, Reject)] == [("unauthorized", 0)]
    assert not b.equivocations.is_disputed(2)


def test_an_equivocating_validators_votes_count_for_nothing_at_the_trainer():
    from protocol.admission import Kind, MessageReceived
    from protocol.verified import Status, VerifiedRule, Vote, judge

    a = _admission()
    rid = b"r" * 32
    vote = [Vote(VALIDATOR.peer_id, PRODUCER, True)]
    assert judge(PRODUCER, vote, a.authority, VerifiedRule()) is Status.VERIFIED
    for seq, passed in ((1, True), (2, False)):
        a.handle(
            MessageReceived(
                RELAY_A, Kind.VERDICT, _sealed_now(VALIDATOR, verdict(rid, passed), seq, T), T
            )
        )
    assert judge(PRODUCER, vote, a.authority, VerifiedRule()) is Status.PENDING
    assert a.authority.judges() == 0
