"""Trust and accounting rules: who may judge, what counts as work, who pays.

Each test pins one way to cheat these rules and checks that it fails: vouching without
authority, draining a signer's rate with a third party's replays, counting the same work
twice, dodging audits, shopping task counters.
"""

from __future__ import annotations

import dataclasses

import pytest

from protocol import admission as adm
from protocol.admission import (
    KIND_RULES,
    Admission,
    AdmissionConfig,
    Deliver,
    Kind,
    MessageReceived,
    Reason,
    Reject,
    RunRules,
    Stage,
    Store,
)
from protocol.audit_sample import check_ticket, sample_ticket, sampled, window_ticket
from protocol.authority import Authority
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.rollout import make_record
from protocol.verified import Status, VerifiedRule, Vote, judge
from protocol.wire import Delegation, RolloutRecord, Verdict
from tests.test_protocol_admission import ALICE, BOB, RELAY, RUN, T0, TRAINER, body, header

VALIDATOR = Identity.from_private_bytes(bytes(range(3, 35)))
DELEGATE = Identity.from_private_bytes(bytes(range(4, 36)))
SYBIL = Identity.from_private_bytes(bytes(range(5, 37)))


def rules() -> RunRules:
    return RunRules(
        RUN,
        max_staleness=2,
        trainer_keys=frozenset({TRAINER.peer_id}),
        validator_keys=frozenset({VALIDATOR.peer_id}),
    )


def machine(**cfg) -> Admission:
    return Admission(rules(), AdmissionConfig(**cfg), version=10)


def msg(peer, kind, data, now=T0) -> MessageReceived:
    return MessageReceived(peer, kind, data, now)


def rollout(
    ident: Identity = ALICE,
    *,
    seq: int = 1,
    counter: int | None = None,
    seed: int | None = None,
    version: int = 10,
    at: float = T0,
) -> bytes:
    seed = seq if seed is None else seed
    return make_record(
        ident,
        body(seed=seed),
        dataset="chain_sum",
        task_index=seq,
        counter=seq if counter is None else counter,
        task_seed=seed,
        reward=1.0,
        run_id=RUN,
        policy_version=version,
        seq=seq,
        timestamp_ms=int(at * 1000),
    )


def verdict(
    judge_id: Identity, rid: bytes, producer: bytes, passed: bool = True, seq: int = 1
) -> bytes:
    v = Verdict(
        rollout_id=rid,
        producer=producer,
        passed=passed,
        reason="ok" if passed else "bad_proof",
        reward_rescored=1.0,
        metrics=(),
    )
    return seal(judge_id, v, run_id=RUN, policy_version=10, seq=seq, timestamp_ms=int(T0 * 1000))


def delegation(validator: Identity, granted: bool, seq: int, signer: Identity = TRAINER) -> bytes:
    d = Delegation(validator=validator.peer_id, granted=granted)
    return seal(
        signer, d, run_id=RUN, policy_version=10, seq=seq, timestamp_ms=int(T0 * 1000) + seq
    )


def reject(actions) -> Reject:
    assert actions and isinstance(actions[0], Reject), actions
    return actions[0]


# -- 1. who may vouch ----------------------------------------------------------------------


def test_verdict_from_a_key_the_manifest_does_not_name_is_unauthorized():
    a = machine()
    rid = content_id(header(rollout()))
    r = reject(a.handle(msg(BOB.peer_id, Kind.VERDICT, verdict(BOB, rid, ALICE.peer_id))))
    assert (r.reason, r.stage) == (Reason.UNAUTHORIZED, Stage.CONTEXT) and r.penalty < 0
    ok = a.handle(msg(RELAY, Kind.VERDICT, verdict(VALIDATOR, rid, ALICE.peer_id)))
    assert isinstance(ok[-1], Deliver)


def test_self_vouching_verdict_is_unauthorized_even_relayed():
    a = machine()
    rid = content_id(header(rollout()))
    r = reject(a.handle(msg(RELAY, Kind.VERDICT, verdict(ALICE, rid, ALICE.peer_id))))
    assert r.reason is Reason.UNAUTHORIZED


def test_a_relay_of_many_verdicts_from_keys_nobody_authorized_pays_past_an_allowance():
    """Found by bench adversary: sybil keys' fail-verdicts relayed by one peer cost the
    sybils (unknown keys, free to make) and never the peer that sent them. An honest relay
    forwards only verdicts its own admission passed, so a signer that was never
    authorized (not in the manifest, no delegation ever heard) draws on the relay's
    allowance of blameless refusals; a few, e.g. before a delegation reaches us, are free."""
    a = machine(waste_burst=20.0, waste_rate=0.001)
    rid = content_id(header(rollout()))
    sybils = [Identity.from_private_bytes(bytes([40 + i]) * 32) for i in range(5)]
    refused = [
        reject(
            a.handle(
                msg(
                    "flooder",
                    Kind.VERDICT,
                    verdict(sybils[i % 5], rid, ALICE.peer_id, False, seq=i // 5 + 1),
                    T0 + i * 0.01,
                )
            )
        )
        for i in range(60)
    ]
    assert all(r.reason in (Reason.UNAUTHORIZED, Reason.FLOODING) for r in refused)
    assert refused[0].penalty == 0 and a.scores.score("flooder", T0 + 1) < 0
    # A relay that forwards a handful of a newly delegated validator's verdicts before we
    # heard the delegation pays nothing.
    for seq in range(1, 6):
        a.handle(msg("relay2", Kind.VERDICT, verdict(DELEGATE, rid, ALICE.peer_id, seq=seq)))
    assert a.scores.score("relay2", T0 + 1) == 0
    # A revoked key was authorized once: a relay that has not heard the revocation is
    # never charged for it, past the allowance or not.
    a.handle(msg(RELAY, Kind.DELEGATION, delegation(VALIDATOR, False, 1)))
    for seq in range(1, 40):
        a.handle(msg("relay3", Kind.VERDICT, verdict(VALIDATOR, rid, ALICE.peer_id, seq=seq)))
    assert a.scores.score("relay3", T0 + 1) == 0


def test_trainer_signed_delegation_grants_and_revokes_the_right_to_judge():
    a = machine()
    rid = content_id(header(rollout()))
    assert reject(a.handle(msg(RELAY, Kind.VERDICT, verdict(DELEGATE, rid, ALICE.peer_id, seq=1))))
    # Only a trainer key may delegate.
    forged = reject(a.handle(msg(RELAY, Kind.DELEGATION, delegation(DELEGATE, True, 1, SYBIL))))
    assert forged.reason is Reason.UNAUTHORIZED
    assert isinstance(
        a.handle(msg(RELAY, Kind.DELEGATION, delegation(DELEGATE, True, 2)))[-1], Deliver
    )
    ok = a.handle(msg(RELAY, Kind.VERDICT, verdict(DELEGATE, rid, ALICE.peer_id, seq=2)))
    assert isinstance(ok[-1], Deliver)
    assert isinstance(
        a.handle(msg(RELAY, Kind.DELEGATION, delegation(DELEGATE, False, 3)))[-1], Deliver
    )
    r = reject(a.handle(msg(RELAY, Kind.VERDICT, verdict(DELEGATE, rid, ALICE.peer_id, seq=3))))
    assert r.reason is Reason.UNAUTHORIZED
    # An older grant echoing through gossip does not undo the revocation.
    late = a.handle(msg(BOB.peer_id, Kind.DELEGATION, delegation(DELEGATE, True, 2)))
    assert reject(late).reason is Reason.DUPLICATE
    assert not a.authority.may_judge(DELEGATE.peer_id)


def test_authority_orders_delegations_by_time_then_seq():
    auth = Authority(validator_keys={VALIDATOR.peer_id}, trainer_keys={TRAINER.peer_id})
    assert auth.may_judge(VALIDATOR.peer_id) and not auth.may_judge(DELEGATE.peer_id)
    assert auth.apply(TRAINER.peer_id, DELEGATE.peer_id, True, (5, 1))
    assert not auth.apply(TRAINER.peer_id, DELEGATE.peer_id, False, (4, 9))  # older: ignored
    assert auth.may_judge(DELEGATE.peer_id)
    assert auth.apply(TRAINER.peer_id, VALIDATOR.peer_id, False, (6, 1))  # revoke a listed key
    assert not auth.may_judge(VALIDATOR.peer_id)
    with pytest.raises(PermissionError):
        auth.apply(SYBIL.peer_id, SYBIL.peer_id, True, (7, 1))


def _vote(who: Identity, passed: bool, producer: bytes = ALICE.peer_id) -> Vote:
    return Vote(signer=who.peer_id, producer=producer, passed=passed)


def test_verified_needs_a_quorum_of_authorized_judges_and_ignores_the_rest():
    auth = Authority(
        validator_keys={VALIDATOR.peer_id, DELEGATE.peer_id}, trainer_keys={TRAINER.peer_id}
    )
    one = VerifiedRule(quorum=1, confirm=1)  # one judge decides (as in a one-validator run)
    two = VerifiedRule(quorum=2)
    p = ALICE.peer_id
    assert judge(p, [], auth, one) is Status.PENDING
    assert judge(p, [_vote(VALIDATOR, True)], auth, one) is Status.VERIFIED
    assert judge(p, [_vote(VALIDATOR, True)], auth, two) is Status.PENDING
    # The same judge twice is one vote.
    assert judge(p, [_vote(VALIDATOR, True)] * 2, auth, two) is Status.PENDING
    assert judge(p, [_vote(VALIDATOR, True), _vote(DELEGATE, True)], auth, two) is Status.VERIFIED
    # Sybils, the producer itself and verdicts about another producer count for nothing.
    junk = [
        _vote(SYBIL, True),
        _vote(ALICE, True),
        _vote(SYBIL, False),
        _vote(DELEGATE, False, producer=BOB.peer_id),
    ]
    assert judge(p, junk, auth, one) is Status.PENDING
    assert judge(p, [*junk, _vote(VALIDATOR, True)], auth, one) is Status.VERIFIED
    # One authorized failure rejects when one judge decides.
    assert judge(p, [_vote(VALIDATOR, True), _vote(DELEGATE, False)], auth, one) is Status.REJECTED


def test_no_single_validator_decides_alone_when_the_run_has_two():
    auth = Authority(validator_keys={VALIDATOR.peer_id, DELEGATE.peer_id, SYBIL.peer_id})
    rule, p = VerifiedRule(), ALICE.peer_id  # confirm=2 by default
    assert judge(p, [_vote(VALIDATOR, True)], auth, rule) is Status.PENDING  # waits, unconfirmed
    assert judge(p, [_vote(VALIDATOR, False)], auth, rule) is Status.CONTESTED  # no withdrawal
    # One pass does not outweigh a pending fail.
    assert judge(p, [_vote(VALIDATOR, True), _vote(DELEGATE, False)], auth, rule) is (
        Status.CONTESTED
    )
    both_fail = [_vote(VALIDATOR, False), _vote(DELEGATE, False)]
    assert judge(p, both_fail, auth, rule) is Status.REJECTED  # the re-audit confirmed it
    outvoted = [_vote(VALIDATOR, False), _vote(DELEGATE, True), _vote(SYBIL, True)]
    assert judge(p, outvoted, auth, rule) is Status.VERIFIED  # the re-audits overturned it
    # A flagged validator's votes count for nothing, nor does it count as a judge.
    assert judge(p, outvoted, auth, rule, ignore={VALIDATOR.peer_id}) is Status.VERIFIED
    lone = Authority(validator_keys={VALIDATOR.peer_id})
    assert judge(p, [_vote(VALIDATOR, False)], lone, rule) is Status.REJECTED  # no second one


def test_run_rules_read_validators_and_quorum_from_the_manifest():
    from protocol.wire import DatasetSpec, RunManifest

    m = RunManifest(
        run_id=RUN,
        model="builtin:tiny",
        model_digest=b"",
        seed=7,
        datasets=(DatasetSpec(name="chain_sum", weight=1),),
        group_size=1,
        max_staleness=2,
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        proof_chunk=32,
        proof_topk=128,
        trainer_keys=(),
        validator_keys=(VALIDATOR.peer_id,),
        verdict_quorum=2,
    )
    r = RunRules.from_manifest(m)
    assert r.validator_keys == frozenset({VALIDATOR.peer_id}) and r.verdict_quorum == 2


# -- 5. replays never cost the signer ------------------------------------------------------


def test_third_party_replaying_a_fresh_header_pays_and_the_signer_does_not():
    a = machine()
    first = header(rollout(seq=1))
    assert isinstance(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, first))[-1], Deliver)
    attacker = "attacker"
    t = T0
    for _ in range(400):  # ~40 copies a second for 10 s
        t += 0.025
        a.handle(msg(attacker, Kind.ROLLOUT_HEADER, first, t))
    # The honest worker keeps publishing at its own modest rate: every header admitted.
    for seq in range(2, 40):
        t += 0.2
        acts = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rollout(seq=seq, at=t)), t))
        assert isinstance(acts[-1], Deliver), acts
    assert a.scores.score(ALICE.peer_id, t) > 0
    assert a.scores.score(attacker, t) < 0


def test_stale_replays_are_rate_limited_before_any_signature_check():
    opened = []

    def counting(data: bytes):
        opened.append(1)
        return KIND_RULES[Kind.ROLLOUT_HEADER].opener(data)

    rules_ = dict(KIND_RULES)
    rules_[Kind.ROLLOUT_HEADER] = dataclasses.replace(rules_[Kind.ROLLOUT_HEADER], opener=counting)
    a = Admission(rules(), AdmissionConfig(), version=10, rules=rules_)
    old = [header(rollout(seq=i, at=T0 - 3600)) for i in range(1, 11)]
    for i in range(2000):
        a.handle(msg("attacker", Kind.ROLLOUT_HEADER, old[i % 10], T0 + i * 0.001))
    assert len(opened) < 400  # the sender's own bucket refuses the rest unopened
    assert a.scores.score("attacker", T0 + 2) < 0
    assert a.scores.score(ALICE.peer_id, T0 + 2) == 0


def test_the_cheap_sender_limit_comes_before_decoding():
    stages = KIND_RULES[Kind.ROLLOUT_HEADER].stages()
    assert stages.index(Stage.RATE) < stages.index(Stage.DECODE)
    assert stages.index(Stage.DEDUP) < stages.index(Stage.QUOTA)
    assert stages.index(Stage.REPLAY) < stages.index(Stage.QUOTA)


# -- 3. one unit of work counts once -------------------------------------------------------


def test_same_body_resigned_under_a_new_counter_is_refused_on_gossip_and_pull():
    a = machine()
    rec1 = rollout(seq=1, counter=1, seed=0)
    rec2 = rollout(seq=2, counter=2, seed=0)  # identical body, new seq and counter
    assert isinstance(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rec1)))[-1], Deliver)
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec1))[-1], Deliver)
    r = reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rec2))))
    assert (r.reason, r.stage) == (Reason.DOUBLE_WORK, Stage.UNIQUE) and r.penalty < 0
    b = machine()
    assert isinstance(b.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec1))[-1], Deliver)
    assert reject(b.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec2))).reason is Reason.DOUBLE_WORK


def test_same_counter_new_content_is_refused():
    a = machine()
    assert isinstance(
        a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rollout(seq=1, counter=7))))[-1],
        Deliver,
    )
    r = reject(
        a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rollout(seq=2, counter=7, seed=5))))
    )
    assert r.reason is Reason.DOUBLE_WORK
    # The same counter at another policy version is the same task: double work too.
    again = a.handle(
        msg(
            ALICE.peer_id,
            Kind.ROLLOUT_HEADER,
            header(rollout(seq=3, counter=7, seed=6, version=11)),
        )
    )
    assert reject(again).reason is Reason.DOUBLE_WORK


def test_pulled_record_with_same_seq_and_new_timestamp_is_refused():
    a = machine()
    rec1 = rollout(seq=4)
    rec2 = rollout(seq=4, at=T0 + 1)  # same seq, same counter, new timestamp: a new id
    assert isinstance(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rec1)))[-1], Deliver)
    assert reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rec2)))).reason in (
        Reason.REPLAY,
        Reason.DOUBLE_WORK,
    )
    assert reject(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec2))).reason is Reason.DOUBLE_WORK
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec1))[-1], Deliver)


def test_relay_of_double_work_is_not_blamed_but_the_signer_is():
    a = machine()
    a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(seq=1, counter=3))))
    r = reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(seq=2, counter=3, seed=1)))))
    assert r.reason is Reason.DOUBLE_WORK and r.penalty == 0.0
    assert a.scores.score(ALICE.peer_id, T0) < 0  # two signed rollouts for one counter


# -- 2. audit sampling the producer cannot predict -----------------------------------------


def test_audit_ticket_is_the_validators_own_signature_and_checkable_by_anyone():
    rid = content_id(b"some rollout")
    t = sample_ticket(VALIDATOR, RUN, rid)
    assert t == sample_ticket(VALIDATOR, RUN, rid)  # deterministic
    assert check_ticket(VALIDATOR.peer_id, RUN, rid, t)
    assert not check_ticket(DELEGATE.peer_id, RUN, rid, t)
    assert not check_ticket(VALIDATOR.peer_id, RUN, content_id(b"other"), t)
    hits = sum(
        sampled(sample_ticket(VALIDATOR, RUN, content_id(bytes([i, j]))), 0.25)
        for i in range(20)
        for j in range(20)
    )
    assert 60 < hits < 140
    assert sampled(t, 1.0) and not sampled(t, 0.0)


def test_window_tickets_are_the_validators_own_per_producer_and_window():
    producer = ALICE.peer_id
    t = window_ticket(VALIDATOR, RUN, producer, 3)
    assert t == window_ticket(VALIDATOR, RUN, producer, 3)  # every record of the window agrees
    others = {
        window_ticket(VALIDATOR, RUN, producer, 4),
        window_ticket(VALIDATOR, RUN, BOB.peer_id, 3),
        window_ticket(DELEGATE, RUN, producer, 3),
        window_ticket(VALIDATOR, RUN + "x", producer, 3),
    }
    assert t not in others and len(others) == 4
    # never a record's ticket: a window ticket cannot be passed off as a verdict's sample
    assert not check_ticket(VALIDATOR.peer_id, RUN, producer + (3).to_bytes(8, "big"), t)
    hits = sum(sampled(window_ticket(VALIDATOR, RUN, producer, w), 0.0625) for w in range(800))
    assert 20 < hits < 80


def test_verdict_with_a_forged_sample_ticket_is_refused():
    a = machine()
    rid = content_id(header(rollout()))
    v = Verdict(
        rollout_id=rid,
        producer=ALICE.peer_id,
        passed=True,
        reason="ok",
        reward_rescored=1.0,
        metrics=(),
        sample_ticket=sample_ticket(DELEGATE, RUN, rid),
    )
    data = seal(VALIDATOR, v, run_id=RUN, policy_version=10, seq=9, timestamp_ms=int(T0 * 1000))
    assert reject(a.handle(msg(RELAY, Kind.VERDICT, data))).reason is Reason.BAD_SIGNATURE


def test_validator_role_samples_by_ticket_not_by_public_hash():
    from node.roles import validator as role

    rid = content_id(b"r")
    assert role.selected(VALIDATOR, RUN, rid, 1.0) == sample_ticket(VALIDATOR, RUN, rid)
    picks = [
        role.selected(VALIDATOR, RUN, content_id(bytes([i])), 0.5) is not None for i in range(64)
    ]
    expect = [
        sampled(sample_ticket(VALIDATOR, RUN, content_id(bytes([i]))), 0.5) for i in range(64)
    ]
    assert picks == expect


def test_store_before_forward_in_admission_order():
    a = machine()
    acts = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(rollout())))
    assert [type(x) for x in acts][:2] == [Store, adm.Forward]


def test_record_roundtrip_keeps_body():
    rec = rollout()
    assert decode(RolloutRecord, rec).body == encode(body(seed=1))


# -- 4. counter shopping -------------------------------------------------------------------


def _shop(ledger, producer: bytes, solved: list[bool], publish) -> None:
    for c, ok in enumerate(solved):
        if publish(c, ok):
            ledger.add(producer, c, 1.0 if ok else 0.0)


def test_counter_shopping_gains_nothing():
    import random

    from protocol.accounting import WorkLedger

    rng = random.Random(7)
    solved = [rng.random() < 0.23 for _ in range(512)]
    ledger = WorkLedger()
    _shop(ledger, b"honest", solved, lambda c, ok: True)
    _shop(ledger, b"shopper", solved, lambda c, ok: ok)  # publishes only what it solved
    honest = ledger.counted_reward(b"honest")
    assert honest is not None and 0.15 < honest < 0.3
    assert not ledger.allowed(b"shopper") and ledger.counted_reward(b"shopper") == 0.0
    # A careful shopper withholds failures only up to the allowance: its gain stays small.
    careful = WorkLedger()
    budget = [careful.rule.limit(512) - 1]

    def within(c: int, ok: bool) -> bool:
        if ok or budget[0] < 1:
            return True
        budget[0] -= 1
        return False

    _shop(careful, b"careful", solved, within)
    assert careful.allowed(b"careful")
    assert careful.counted_reward(b"careful") / honest <= 1.05


def test_counters_arriving_out_of_order_and_twice():
    from protocol.accounting import GapRule, WorkLedger

    ledger = WorkLedger()
    for c in (5, 3, 4, 7, 6, 3):
        ledger.add(b"p", c, 0.5)
    s = ledger.standing(b"p")
    assert (s.first, s.last, s.published, s.withheld) == (3, 7, 5, 0)
    ledger.add(b"p", 40, 0.0)
    s = ledger.standing(b"p")
    assert s.withheld == 32 and s.allowed  # the newest counters may still be in flight
    ledger.add(b"p", 200, 0.0)
    s = ledger.standing(b"p")
    assert not s.allowed and s.weight < 0.05  # far below the newest: withheld
    strict = WorkLedger(GapRule(lag=0))
    for c in (3, 4, 5, 6, 7, 40):
        strict.add(b"p", c, 0.0)
    assert not strict.allowed(b"p")


# -- the trainer's wiring of the rules -----------------------------------------------------


def test_trainer_counts_only_authorized_verdicts_on_the_right_producer():
    from node.roles.trainer import Collector
    from protocol.verified import VerifiedRule

    a = machine()
    rec = rollout(seq=1)
    rid = content_id(header(rec))
    c = Collector(a.authority, VerifiedRule(quorum=1))
    deliver = [
        x.item for x in a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec)) if isinstance(x, Deliver)
    ]
    c.on_deliver(deliver[0])
    # A self-vouching verdict never even gets through admission; one that names another
    # producer is admitted (the validator may judge) but counts for nothing.
    assert (
        reject(a.handle(msg(RELAY, Kind.VERDICT, verdict(ALICE, rid, ALICE.peer_id)))).reason
        is Reason.UNAUTHORIZED
    )
    wrong = a.handle(msg(RELAY, Kind.VERDICT, verdict(VALIDATOR, rid, BOB.peer_id, seq=1)))
    c.on_deliver(wrong[-1].item)
    assert c.summarize(10, 2)["verified"] == 0
    right = a.handle(msg(RELAY, Kind.VERDICT, verdict(VALIDATOR, rid, ALICE.peer_id, seq=2)))
    c.on_deliver(right[-1].item)
    assert c.summarize(10, 2)["verified"] == 1


def test_trainer_refuses_a_producer_that_withholds_counters():
    from node.roles.trainer import Collector
    from protocol.verified import VerifiedRule

    a = machine(signer_burst=1000.0, sender_burst=1000.0)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    went_bad = []
    t = T0
    for counter in range(0, 200, 5):  # publishes one counter in five, one every 2 s
        t += 2.0
        h = header(rollout(seq=counter + 1, counter=counter, at=t))
        went_bad += c.on_deliver(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h, t))[-1].item)
    assert went_bad == [ALICE.peer_id]  # once its gaps are older than the grace
    assert c.summarize(10, 2, t)["producers_refused"] == 1


def test_rollouts_that_arrive_too_stale_are_late_not_withheld():
    """Found on a devnet at 8-16 rollouts a batch: the trainer moved a version every
    ~15 s, a fifth of the workers' rollouts arrived more than S versions old, admission
    refused them, their counters became gaps, and all three honest workers were refused
    as withholders (and, charged -1 for every stale one they served, banned). A stale
    refusal of an authentic rollout now carries it (`Reject.late`): its counter is
    published work, it costs its producer nothing, and nothing of it is trained on."""
    from node.roles.trainer import Collector

    a = machine(signer_burst=1000.0, sender_burst=1000.0)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    went_bad, t, version, late = [], T0, 10, 0
    for counter in range(300):
        t += 0.5
        if counter % 30 == 29:  # the trainer publishes
            version += 1
            a.handle(adm.VersionChanged(version, t))
        stale = counter % 3 == 0 and version > 10  # a third went stale on the way
        made_with = version - 3 if stale else version
        late += stale
        h = header(rollout(seq=counter + 1, counter=counter, version=made_with, at=t))
        for x in a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, t)):
            if isinstance(x, Deliver):
                went_bad += c.on_deliver(x.item)
            elif isinstance(x, adm.Reject):
                assert x.reason is Reason.STALE and x.penalty == 0.0
                assert x.late is not None and x.late.signer == ALICE.peer_id
                went_bad += c.on_late(x.late)
    assert went_bad == []
    assert c.ledger.allowed(ALICE.peer_id, t) and a.scores.score(ALICE.peer_id, t) > 0
    assert c.summarize(version, 2, t)["bodies"] == 0  # headers only; none stale tracked
    assert late > 80 and len(c.tracks) == 300 - late


def test_a_shopper_that_falls_silent_is_still_charged_once_the_grace_has_passed():
    """Found by bench adversary: the charge was judged only when the shopper's own next
    rollout arrived, so a shopper that published its solved counters and stopped (or
    left under a fresh key) was never charged. Any later delivery now re-judges it."""
    from node.roles.trainer import Collector

    a = machine(signer_burst=1000.0, sender_burst=1000.0)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    went_bad = []
    t = T0
    for counter in range(0, 400, 4):  # one counter in four, for 10 s, then silence
        t += 0.1
        h = header(rollout(seq=counter // 4 + 1, counter=counter, at=t))
        went_bad += c.on_deliver(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h, t))[-1].item)
    assert went_bad == []  # within the grace: the gaps may still be filled
    for i in range(60):  # an honest worker goes on publishing, every counter
        t += 1.0
        h = header(rollout(BOB, seq=i + 1, counter=i, seed=70_000 + i, at=t))
        went_bad += c.on_deliver(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h, t))[-1].item)
    assert went_bad == [ALICE.peer_id]
    assert c.ledger.allowed(BOB.peer_id, t)


def test_gap_charges_is_the_rule_the_trainer_and_the_simulator_share():
    """The charge rule itself (`protocol.accounting.GapCharges`), time passed in: a
    producer that shows one counter in four and stops is charged once, by the clock alone,
    a grace after its gaps opened; an honest one never."""
    from protocol.accounting import GapCharges

    g = GapCharges()
    out = []
    for i, counter in enumerate(range(0, 400, 4)):
        out += g.on_rollout(b"shopper", counter, 1.0, T0 + 0.1 * i)
        out += g.on_rollout(b"honest", i, 0.5, T0 + 0.1 * i)
    assert out == []
    late = [p for s in range(1, 60) for p in g.on_time(T0 + 10 + s)]
    assert late == [b"shopper"]
    assert g.on_time(T0 + 200) == []  # charged once for the same gaps
    assert g.ledger.allowed(b"honest", T0 + 200)


# -- 6. headers without bodies, fresh identities -------------------------------------------


def test_a_flood_of_fresh_identities_from_one_sender_is_refused_and_costs_it():
    # a running view (restored from the store: not young, `tests/test_protocol_young_view.py`)
    a = machine()
    a.handle(adm.Known(Kind.ROLLOUT_HEADER, (), T0, signers=(BOB.peer_id,)))
    results = []
    for i in range(500):  # 1,000 a second: far past what a busy honest relay sends
        fresh = Identity.from_private_bytes(i.to_bytes(2, "big") * 16)
        h = header(rollout(fresh, seq=1, seed=i, at=T0 + i * 0.001))
        results.append(a.handle(msg("flooder", Kind.ROLLOUT_HEADER, h, T0 + i * 0.001)))
    admitted = sum(isinstance(r[-1], Deliver) for r in results)
    assert admitted <= 20, admitted
    assert a.scores.score("flooder", T0 + 5) < 0
    # A known producer relayed by the same kind of peer is unaffected.
    ok = a.handle(
        msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(ALICE, seq=7, seed=10_000)), T0 + 5)
    )
    assert isinstance(ok[-1], Deliver)


def test_a_header_whose_body_never_comes_costs_its_sender_and_signer():
    a = machine()
    h = header(rollout(BOB, seq=1))
    acts = a.handle(msg("relay2", Kind.ROLLOUT_HEADER, h))
    assert isinstance(acts[-1], Deliver)
    before = a.scores.score("relay2", T0)
    a.handle(adm.BodyMissing(content_id(h), BOB.peer_id, "relay2", T0 + 60))
    assert a.scores.score("relay2", T0 + 60) < before
    assert a.scores.score(BOB.peer_id_b58, T0 + 60) < 0  # in the senders' id form


def test_an_honest_relay_forwarding_what_our_view_refuses_is_not_scored_down():
    """Found by bench adversary: relays that forwarded a fresh-identity flood (refused here
    as too many new signers) ran out of their allowance and were charged as flooders."""
    a = machine()
    for i in range(300):
        fresh = Identity.from_private_bytes((i + 1000).to_bytes(2, "big") * 16)
        h = header(rollout(fresh, seq=1, seed=20_000 + i, at=T0 + i * 0.1))
        a.handle(msg("honest-relay", Kind.ROLLOUT_HEADER, h, T0 + i * 0.1))
    assert a.scores.score("honest-relay", T0 + 30) >= 0


def test_the_author_of_verdicts_signed_by_keys_nobody_authorized_pays_from_the_first():
    """Found by bench adversary --quick: 50 sybil fail-verdicts, published by the attacker
    itself, stayed inside the relay allowance of blameless refusals and cost it nothing.
    A sender that is the gossip origin of another key's verdict is its author, not a relay:
    no relay allowance applies. A relay of the same verdicts (origin: each sybil) still
    pays nothing for the first few."""
    rid = content_id(header(rollout()))
    sybils = [Identity.from_private_bytes(bytes([40 + i]) * 32) for i in range(5)]
    a = machine()
    first = reject(
        a.handle(
            MessageReceived(
                "author",
                Kind.VERDICT,
                verdict(sybils[0], rid, ALICE.peer_id, False),
                T0,
                origin="author",
            )
        )
    )
    assert first.reason is Reason.UNAUTHORIZED and first.penalty < 0
    relayed = reject(
        a.handle(
            MessageReceived(
                "relay",
                Kind.VERDICT,
                verdict(sybils[1], rid, ALICE.peer_id, False),
                T0,
                origin=sybils[1].peer_id_b58,
            )
        )
    )
    assert relayed.penalty == 0 and a.scores.score("relay", T0) == 0


def test_a_sender_that_authors_headers_of_fresh_identities_pays_and_their_relay_does_not():
    """Found by bench adversary (fresh_identity_flood, attacker_penalized false since stop
    19): an attacker that published 300 headers of 300 fresh keys itself, at a rate an
    honest relay could send, had them refused for free. The gossip origin (the publisher
    that signed the gossip message) is authenticated by strict signing, and an honest node
    publishes only objects it signed itself: a sender that is the origin of another
    signer's header is no relay, and pays for the new-identity refusals it causes."""
    a = machine()
    for i in range(300):
        fresh = Identity.from_private_bytes((i + 3000).to_bytes(2, "big") * 16)
        h = header(rollout(fresh, seq=1, seed=30_000 + i, at=T0 + i * 0.1))
        a.handle(MessageReceived("author", Kind.ROLLOUT_HEADER, h, T0 + i * 0.1, origin="author"))
    assert a.scores.score("author", T0 + 30) < 0
    # The same flood relayed: each header's gossip origin is its own signer (or unknown).
    b = machine()
    for i in range(300):
        fresh = Identity.from_private_bytes((i + 3000).to_bytes(2, "big") * 16)
        h = header(rollout(fresh, seq=1, seed=30_000 + i, at=T0 + i * 0.1))
        b.handle(
            MessageReceived("relay", Kind.ROLLOUT_HEADER, h, T0 + i * 0.1, origin=fresh.peer_id_b58)
        )
    assert b.scores.score("relay", T0 + 30) >= 0
    # A new worker publishing its own headers is refused as new for free, as before.
    c = machine()
    workers = _workers(60)
    for i, w in enumerate(workers):
        h = header(rollout(w, seq=1, seed=40_000 + i, at=T0 + i * 0.01))
        c.handle(
            MessageReceived(
                w.peer_id_b58, Kind.ROLLOUT_HEADER, h, T0 + i * 0.01, origin=w.peer_id_b58
            )
        )
    assert all(c.scores.score(w.peer_id_b58, T0 + 1) >= 0 for w in workers)


# -- honest peers never pay for what others send -----------------------------------------


def _workers(n: int) -> list[Identity]:
    return [Identity.from_private_bytes((7000 + i).to_bytes(2, "big") * 16) for i in range(n)]


def test_a_relay_forwarding_each_message_once_never_pays_for_copies():
    """Found by review: every copy counted against the sender's allowance, so an honest
    relay that forwards (once each) headers we already hold - we heard them from the
    signers first, or held them before a restart - was charged FLOODING."""
    a = machine()
    t = T0
    for i, w in enumerate(_workers(10) * 30):  # 300 headers, 10 known workers
        t += 0.1
        h = header(rollout(w, seq=i + 1, seed=30_000 + i, at=t))
        assert isinstance(a.handle(msg(w.peer_id, Kind.ROLLOUT_HEADER, h, t))[-1], Deliver)
        acts = a.handle(msg("honest-relay", Kind.ROLLOUT_HEADER, h, t + 0.05))
        assert reject(acts).reason is Reason.DUPLICATE and reject(acts).penalty == 0, acts
    assert a.scores.score("honest-relay", t) >= 0


def test_a_sender_repeating_the_same_message_pays_past_its_allowance():
    a = machine()
    h = header(rollout(seq=1))
    a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h))
    reasons = [
        reject(a.handle(msg("echo", Kind.ROLLOUT_HEADER, h, T0 + i * 0.1))).reason
        for i in range(100)
    ]
    assert reasons[0] is Reason.DUPLICATE and Reason.FLOODING in reasons
    assert a.scores.score("echo", T0 + 10) < 0


def test_pulled_records_are_never_rate_limited_against_the_peer_we_asked():
    """Found by review: a catch-up burst (records we asked for) drew on the source's
    gossip rate bucket; past 200 records the source paid -0.5 for each."""
    a = machine()
    workers = _workers(5)
    outcomes = []
    for i in range(400):
        rec = rollout(workers[i % 5], seq=i + 1, seed=40_000 + i, at=T0 - 30)
        outcomes.append(a.handle(msg("source", Kind.ROLLOUT_RECORD, rec, T0 + i * 0.001)))
    assert all(isinstance(o[-1], Deliver) for o in outcomes)
    assert a.scores.score("source", T0 + 1) >= 0


def test_an_honest_relay_busier_than_the_sender_rate_is_not_scored_down():
    """Found by review: a relay carrying many producers at 80 messages/s (each producer
    well within its own rate) was charged -0.5 per message over 50/s until banned."""
    a = machine()
    workers = _workers(10)
    t = T0
    for i in range(1600):  # 80/s for 20 s, 8/s per producer
        t += 1 / 80
        h = header(rollout(workers[i % 10], seq=i + 1, seed=50_000 + i, at=t))
        a.handle(msg("busy-relay", Kind.ROLLOUT_HEADER, h, t))
    assert a.scores.score("busy-relay", t) >= 0
    assert not a.scores.is_banned("busy-relay", t)


def test_catch_up_after_live_gossip_does_not_charge_an_honest_worker():
    """Found by review: a trainer that (re)joins hears a worker's live counters first and
    its older ones from catch-up seconds later. The gap in between was judged at once:
    the honest worker was charged as a shopper and its rollouts refused."""
    from node.roles.trainer import Collector

    a = machine(signer_burst=10_000.0, sender_burst=10_000.0)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    went_bad = []
    t = T0
    for counter in range(900, 980):  # live gossip, 10 a second
        t += 0.1
        h = header(rollout(seq=counter + 1, counter=counter, at=t))
        went_bad += c.on_deliver(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h, t))[-1].item)
    for counter in range(700, 900):  # catch-up pulls the older ones, oldest first
        t += 0.02
        rec = rollout(seq=counter + 1, counter=counter, at=T0 - 60)
        went_bad += c.on_deliver(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec, t))[-1].item)
    assert went_bad == []
    assert c.ledger.allowed(ALICE.peer_id, t)
    assert c.summarize(10, 2, t)["producers_refused"] == 0


def test_a_body_pull_that_only_failed_to_connect_costs_nobody():
    """Found by review: while a producer restarted, pulls of its newest bodies failed to
    connect until they gave up, and the honest producer and its relay were charged
    BodyMissing. Only a source that answered without the body is evidence."""
    a = machine()
    h = header(rollout(BOB, seq=1))
    a.handle(msg("relay2", Kind.ROLLOUT_HEADER, h))
    before = a.scores.score("relay2", T0 + 60)
    acts = a.handle(adm.BodyMissing(content_id(h), BOB.peer_id, "relay2", T0 + 60, answered=0))
    assert acts == []
    assert a.scores.score("relay2", T0 + 60) == pytest.approx(before)
    assert a.scores.score(BOB.peer_id_b58, T0 + 60) == 0
    a.handle(adm.BodyMissing(content_id(h), BOB.peer_id, "relay2", T0 + 60, answered=2))
    assert a.scores.score(BOB.peer_id_b58, T0 + 60) < 0


def test_producers_known_before_a_restart_are_not_new_identities_after_it():
    """Found by review: after a restart every producer counted as a new identity, so a
    relay carrying 100 known producers got all but the first few dozen refused. The node
    now restores the signers it stored (`Known(..., signers=...)`)."""
    workers = _workers(100)
    a = machine()
    a.handle(adm.Known(Kind.ROLLOUT_HEADER, (), T0, signers=tuple(w.peer_id for w in workers)))
    t = T0
    outcomes = []
    for i, w in enumerate(workers):
        t += 0.02
        h = header(rollout(w, seq=i + 1, seed=60_000 + i, at=t))
        outcomes.append(a.handle(msg("relay", Kind.ROLLOUT_HEADER, h, t)))
    assert all(isinstance(o[-1], Deliver) for o in outcomes)


# -- refusals that do not judge the content cost nobody later ------------------------------


def test_a_relayed_copy_refused_over_the_signers_rate_leaves_the_producers_own_copy_free():
    """The relay's copy is refused over the signer's rate (capacity, not a judgement of
    the header); the producer's own copy arriving later by its direct path is admitted,
    not refused as a replay, and the producer pays nothing."""
    a = machine(signer_rate=1.0, signer_burst=1.0)
    assert isinstance(
        a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(seq=1))))[-1], Deliver
    )
    h = header(rollout(seq=2))
    r = reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h)))
    assert (r.reason, r.stage, r.penalty) == (Reason.RATE_LIMITED, Stage.QUOTA, 0.0)
    own = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, T0 + 2))
    assert isinstance(own[-1], Deliver), own
    assert a.scores.score(ALICE.peer_id, T0 + 2) >= 0


def test_a_relayed_copy_refused_as_a_new_identity_leaves_the_producers_own_copy_free():
    a = machine(new_signer_burst=1.0, young_view_signers=0)
    assert isinstance(
        a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(BOB, seq=1))))[-1], Deliver
    )
    h = header(rollout(ALICE, seq=1, seed=77))
    r = reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h)))
    assert (r.reason, r.penalty) == (Reason.NEW_IDENTITIES, 0.0)
    own = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, T0 + 1))
    assert isinstance(own[-1], Deliver), own
    assert a.scores.score(ALICE.peer_id, T0 + 1) >= 0


def test_a_header_refused_as_double_work_is_charged_once_whoever_relays_copies():
    """A refusal that judges the content (the signer signed two rollouts for one unit of
    work) is remembered: copies of it relayed later cost the signer nothing more."""
    a = machine()
    assert isinstance(
        a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rollout(seq=1))))[-1], Deliver
    )
    twin = header(rollout(seq=2, counter=1))
    first = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, twin))
    assert reject(first).reason is Reason.DOUBLE_WORK
    charged = a.scores.score(ALICE.peer_id, T0)
    assert charged < 0
    for relay in (b"relay-b", b"relay-c", b"relay-d"):
        a.handle(msg(relay, Kind.ROLLOUT_HEADER, twin))
    assert a.scores.score(ALICE.peer_id, T0) == charged


# -- one signer, several sequence spaces ---------------------------------------------------


def test_one_key_signing_every_kind_interleaved_gets_nothing_refused_as_a_replay():
    """A rollout header's seq is its task counter (small, dense); every other signed object
    of the same key takes its seq from a time-based counter (`node.peer.peer.SeqCounter`, about
    time x 4096). Each kind has its own replay window, so neither space shadows the other."""
    from protocol.wire import FraudEvidence, ProducerClaim

    a = machine()
    timed = int(T0) * 4096
    out = []
    for i in range(1, 6):
        t = T0 + i
        out.append(
            a.handle(
                msg(
                    VALIDATOR.peer_id,
                    Kind.ROLLOUT_HEADER,
                    header(rollout(VALIDATOR, seq=i, seed=900 + i, at=t)),
                    t,
                )
            )
        )
        rid = content_id(header(rollout(seq=i)))
        v = verdict(VALIDATOR, rid, ALICE.peer_id, seq=timed + 3 * i)
        out.append(a.handle(msg(VALIDATOR.peer_id, Kind.VERDICT, v, t)))
        claim = ProducerClaim(
            producer=ALICE.peer_id, rollout_ids=(rid,), statistic="toploc", median=2.0, limit=1.0
        )
        data = seal(
            VALIDATOR,
            claim,
            run_id=RUN,
            policy_version=10,
            seq=timed + 3 * i + 1,
            timestamp_ms=int(t * 1000),
        )
        out.append(a.handle(msg(VALIDATOR.peer_id, Kind.PRODUCER_CLAIM, data, t)))
        fraud = FraudEvidence(record=rollout(seq=i), reason="bad_proof", detail="", metrics=())
        data = seal(
            VALIDATOR,
            fraud,
            run_id=RUN,
            policy_version=10,
            seq=timed + 3 * i + 2,
            timestamp_ms=int(t * 1000),
        )
        out.append(a.handle(msg(VALIDATOR.peer_id, Kind.FRAUD_EVIDENCE, data, t)))
    refused = [acts[0] for acts in out if isinstance(acts[0], Reject)]
    assert not refused, refused
    assert a.scores.score(VALIDATOR.peer_id, T0 + 6) > 0
    # A reused number within one kind is still a replay.
    again = header(rollout(VALIDATOR, seq=3, seed=999, at=T0 + 7))
    r = reject(a.handle(msg(VALIDATOR.peer_id, Kind.ROLLOUT_HEADER, again, T0 + 7)))
    assert r.reason is Reason.REPLAY


# -- persistent faults reach a ban ---------------------------------------------------------


@pytest.mark.parametrize("fault", ["wrong_run", "clock_skew"])
@pytest.mark.parametrize("gap_s", [0.01, 15.0])
def test_a_sender_that_keeps_sending_wrong_run_or_skewed_messages_is_banned(fault, gap_s):
    """A peer on another run, or with its clock far off, sends nothing we can use, and
    each of its messages costs us a signature check: within a dozen messages it is
    banned, however slowly it sends them (within a half-life)."""
    a = machine()
    banned_at = None
    for i in range(12):
        t = T0 + i * gap_s
        at = t + 600.0 if fault == "clock_skew" else t
        run_id = "other-run" if fault == "wrong_run" else RUN
        h = header(
            make_record(
                ALICE,
                body(seed=i),
                dataset="chain_sum",
                task_index=i,
                counter=i,
                task_seed=i,
                reward=1.0,
                run_id=run_id,
                policy_version=10,
                seq=i + 1,
                timestamp_ms=int(at * 1000),
            )
        )
        acts = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, t))
        assert reject(acts).reason == fault
        if any(isinstance(x, adm.Ban) for x in acts):
            banned_at = i
            break
    assert banned_at is not None, a.scores.score(ALICE.peer_id, t)


def test_a_wrong_run_message_now_and_then_costs_only_its_base_price():
    """Doubling counts repeats within the window only: one mistake an hour stays cheap."""
    a = machine()
    for i in range(4):
        t = T0 + i * 3600.0
        h = header(
            make_record(
                ALICE,
                body(seed=i),
                dataset="chain_sum",
                task_index=i,
                counter=i,
                task_seed=i,
                reward=1.0,
                run_id="other-run",
                policy_version=10,
                seq=i + 1,
                timestamp_ms=int(t * 1000),
            )
        )
        r = reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, t)))
        assert (r.reason, r.penalty) == (Reason.WRONG_RUN, adm.PENALTIES[Reason.WRONG_RUN])
