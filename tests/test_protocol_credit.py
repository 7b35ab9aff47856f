"""Credit rules: work is bound to the key that made it, and arrival order never moves
credit or blame from one producer to another."""

from __future__ import annotations

import pytest

from protocol import penalties
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Deliver,
    Kind,
    MessageReceived,
    Reason,
    Reject,
    RunRules,
)
from protocol.assignment import task_seed
from protocol.codec import decode
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.rollout import make_record
from protocol.wire import RolloutRecord, Verdict
from tests.test_protocol_admission import ALICE, BOB, RELAY, RUN, T0, body

RUN_SEED = 7
THIEF = BOB


def machine() -> Admission:
    return Admission(
        RunRules(RUN, max_staleness=2, run_seed=RUN_SEED), AdmissionConfig(), version=10
    )


def bound_record(
    producer: Identity, counter: int, *, signer: Identity | None = None, seq: int = 1
) -> bytes:
    """A record of `producer`'s work (its seed), signed by `signer` (default: the producer)."""
    seed = task_seed(RUN_SEED, counter, producer.peer_id)
    return make_record(
        signer or producer,
        body(seed=seed),
        dataset="chain_sum",
        task_index=counter,
        counter=counter,
        task_seed=seed,
        reward=1.0,
        run_id=RUN,
        policy_version=10,
        seq=seq,
        timestamp_ms=int(T0 * 1000),
    )


def header(rec: bytes) -> bytes:
    return decode(RolloutRecord, rec).header


def test_a_re_signed_copy_arriving_first_is_refused_and_the_producer_keeps_its_work() -> None:
    a = machine()
    honest = header(bound_record(ALICE, 3))
    stolen = header(bound_record(ALICE, 3, signer=THIEF))  # same work, the thief's key
    acts = a.handle(MessageReceived(THIEF.peer_id, Kind.ROLLOUT_HEADER, stolen, T0))
    (r,) = [x for x in acts if isinstance(x, Reject)]
    assert r.reason is Reason.NOT_BOUND and r.penalty < 0
    acts = a.handle(MessageReceived(RELAY, Kind.ROLLOUT_HEADER, honest, T0 + 0.1))
    assert any(isinstance(x, Deliver) for x in acts), acts  # not a duplicate of the copy
    assert a.scores.score(ALICE.peer_id, T0 + 0.2) >= 0
    assert a.scores.score(THIEF.peer_id, T0 + 0.2) < 0


def test_a_re_signed_record_pulled_from_a_relay_blames_the_thief_and_the_relay_not_the_producer() -> (
    None
):
    a = machine()
    stolen = bound_record(ALICE, 4, signer=THIEF)
    acts = a.handle(MessageReceived(RELAY, Kind.ROLLOUT_RECORD, stolen, T0))
    (r,) = [x for x in acts if isinstance(x, Reject)]
    assert r.reason is Reason.NOT_BOUND
    assert a.scores.score(ALICE.peer_id, T0) == 0
    assert a.scores.score(THIEF.peer_id, T0) < 0


def test_the_producers_own_work_is_admitted() -> None:
    a = machine()
    acts = a.handle(MessageReceived(ALICE.peer_id, Kind.ROLLOUT_RECORD, bound_record(ALICE, 5), T0))
    assert any(isinstance(x, Deliver) for x in acts), acts


def stolen_digest(thief: Identity, counter: int, victim: Identity, victim_counter: int) -> bytes:
    """A record signed by `thief` for its own counter with its own bound seed, whose header
    names `victim`'s body (the body itself: the victim's, bound to the victim's seed)."""
    seed = task_seed(RUN_SEED, counter, thief.peer_id)
    return make_record(
        thief,
        body(seed=task_seed(RUN_SEED, victim_counter, victim.peer_id)),
        dataset="chain_sum",
        task_index=counter,
        counter=counter,
        task_seed=seed,
        reward=1.0,
        run_id=RUN,
        policy_version=10,
        seq=counter,
        timestamp_ms=int(T0 * 1000),
    )


def test_a_thief_naming_a_workers_body_digest_first_never_makes_the_workers_header_a_duplicate() -> (
    None
):
    """Bound-digest theft: the thief's header (its own counter, its own bound seed, the
    worker's body digest) reaches us first. Headers prove nothing of who made a body, so
    across signers only bodies are deduplicated: the worker's header and its record are
    admitted, and the thief's record (the worker's body, not of the thief's task) is
    refused and charged to the thief."""
    a = machine()
    mine = bound_record(ALICE, 6)
    theirs = stolen_digest(THIEF, 9, ALICE, 6)
    assert decode(RolloutRecord, theirs).body == decode(RolloutRecord, mine).body
    acts = a.handle(MessageReceived(THIEF.peer_id, Kind.ROLLOUT_HEADER, header(theirs), T0))
    assert any(isinstance(x, Deliver) for x in acts), acts  # a claim, like any header
    acts = a.handle(MessageReceived(RELAY, Kind.ROLLOUT_HEADER, header(mine), T0 + 0.1))
    assert any(isinstance(x, Deliver) for x in acts), acts  # not a free duplicate
    acts = a.handle(MessageReceived(THIEF.peer_id, Kind.ROLLOUT_RECORD, theirs, T0 + 0.2))
    (r,) = [x for x in acts if isinstance(x, Reject)]
    assert r.reason is Reason.NOT_BOUND and r.penalty < 0
    acts = a.handle(MessageReceived(ALICE.peer_id, Kind.ROLLOUT_RECORD, mine, T0 + 0.3))
    assert any(isinstance(x, Deliver) for x in acts), acts  # its catch-up copy too
    assert a.scores.score(ALICE.peer_id, T0 + 0.4) >= 0
    assert a.scores.score(THIEF.peer_id, T0 + 0.4) < 0
    # the worker's body held first: the thief's record is refused all the same
    b = machine()
    assert any(
        isinstance(x, Deliver)
        for x in b.handle(MessageReceived(RELAY, Kind.ROLLOUT_RECORD, mine, T0))
    )
    acts = b.handle(MessageReceived(RELAY, Kind.ROLLOUT_RECORD, theirs, T0 + 0.1))
    assert [x.reason for x in acts if isinstance(x, Reject)] == [Reason.NOT_BOUND]


# -- credit is the re-scored reward of a body someone holds ---------------------------------

VALIDATOR = Identity.from_private_bytes(bytes(range(3, 35)))
WINDOW_S = 300.0  # the body pull window (protocol.body_pull.PullConfig.window_s)


def judged_machine(version: int = 10, **cfg) -> Admission:
    rules = RunRules(
        RUN, max_staleness=2, run_seed=RUN_SEED, validator_keys=frozenset({VALIDATOR.peer_id})
    )
    return Admission(
        rules, AdmissionConfig(signer_burst=1e4, sender_burst=1e4, **cfg), version=version
    )


def claimed_record(
    producer: Identity,
    counter: int,
    reward: float,
    *,
    version: int = 10,
    at: float = T0,
    salt: int = 0,
) -> bytes:
    """`producer`'s record of `counter` at `version`, claiming `reward` (body `salt` differs
    per version: another sample of the same task)."""
    seed = task_seed(RUN_SEED, counter, producer.peer_id)
    return make_record(
        producer,
        body(n=8 + salt, seed=seed),
        dataset="chain_sum",
        task_index=counter,
        counter=counter,
        task_seed=seed,
        reward=reward,
        run_id=RUN,
        policy_version=version,
        seq=counter + 1,
        timestamp_ms=int(at * 1000),
    )


def pass_verdict(rid: bytes, producer: bytes, rescored: float, seq: int, at: float) -> bytes:
    v = Verdict(
        rollout_id=rid,
        producer=producer,
        passed=True,
        reason="ok",
        reward_rescored=rescored,
        metrics=(),
    )
    return seal(VALIDATOR, v, run_id=RUN, policy_version=10, seq=seq, timestamp_ms=int(at * 1000))


def delivered(a: Admission, peer, kind: Kind, data: bytes, now: float):
    return [
        x.item for x in a.handle(MessageReceived(peer, kind, data, now)) if isinstance(x, Deliver)
    ]


def solved(counter: int, salt: int = 0) -> bool:
    """The true outcome of one sample: about one in five solves."""
    return (counter * 7 + salt * 3) % 10 < 2


def run_worker(a: Admission, c, who: Identity, counters: range, *, lie: bool, seq0: int = 0):
    """`who` publishes a header per counter (claiming 1.0 if `lie`, else the truth) and
    serves the body only of solved ones if `lie` (all if honest); a validator passes every
    body it holds and the trainer re-scores it. Returns (charged producers, time, true mean)."""
    charged, t, truth = [], T0, []
    for counter in counters:
        t += 0.5
        ok = solved(counter)
        truth.append(1.0 if ok else 0.0)
        rec = claimed_record(who, counter, 1.0 if lie else float(ok), at=t)
        for item in delivered(a, who.peer_id, Kind.ROLLOUT_HEADER, header(rec), t):
            charged += c.on_deliver(item)
        if lie and not ok:
            continue  # the lie's body is never served
        for item in delivered(a, who.peer_id, Kind.ROLLOUT_RECORD, rec, t + 0.1):
            charged += c.on_deliver(item)
            charged += c.on_rescored(item.content_id, 1.0 if ok else 0.0, t + 0.2)
            v = pass_verdict(
                item.content_id, who.peer_id, 1.0 if ok else 0.0, seq0 + counter + 1, t
            )
            for vi in delivered(a, RELAY, Kind.VERDICT, v, t + 0.3):
                charged += c.on_deliver(vi)
    return charged, t, sum(truth) / len(truth)


def collector():
    from node.roles.trainer import Collector
    from protocol.verified import VerifiedRule

    a = judged_machine()
    return a, Collector(a.authority, VerifiedRule(quorum=1))


def test_a_worker_claiming_reward_1_and_serving_only_solved_bodies_is_credited_its_true_rate() -> (
    None
):
    a, c = collector()
    charged, t, true_mean = run_worker(a, c, ALICE, range(200), lie=True)
    _, t2, honest_mean = run_worker(a, c, BOB, range(200), lie=False, seq0=1000)
    assert c.credited_reward(ALICE.peer_id, t) is not None
    end = max(t, t2) + WINDOW_S + 1
    c.on_time(end)
    liar = c.credited_reward(ALICE.peer_id, end)
    assert abs(liar - true_mean) <= 0.02 * true_mean, (liar, true_mean)
    assert c.credited_reward(BOB.peer_id, end) == pytest.approx(honest_mean)
    assert c.summarize(10, 2, end)["skipped"] == 160  # the lies whose bodies never came


def test_a_header_without_its_body_is_skipped_only_once_the_pull_window_closes() -> None:
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S)
    book.on_header(b"p", 0, 10, 1.0, T0)
    book.on_time(T0 + WINDOW_S - 1)
    assert book.standing(b"p") is None and book.credited_reward(b"p") is None
    book.on_time(T0 + WINDOW_S)
    assert book.standing(b"p").skipped == 1 and book.credited_reward(b"p") == 0.0


def test_a_claimed_reward_that_differs_from_the_re_score_costs_its_signer_and_credits_the_re_score() -> (
    None
):
    a, c = collector()
    t = T0 + 1
    rec = claimed_record(ALICE, 1, 1.0, at=t)  # an unsolved body, claimed solved
    (item,) = delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, rec, t)
    assert c.on_deliver(item) == []
    assert c.on_rescored(item.content_id, 0.0, t) == [ALICE.peer_id]
    assert (
        penalties.FALSE_CLAIM.payer is penalties.Payer.PRODUCER and penalties.FALSE_CLAIM.cost < 0
    )
    v = pass_verdict(item.content_id, ALICE.peer_id, 0.0, 1, t)
    for vi in delivered(a, RELAY, Kind.VERDICT, v, t):
        c.on_deliver(vi)
    assert c.credited_reward(ALICE.peer_id, t) == 0.0
    assert c.on_rescored(item.content_id, 0.0, t) == []  # charged once per record


def test_a_held_body_is_credited_its_re_score_at_once_and_a_failed_judgement_settles_it_at_0() -> (
    None
):
    a, c = collector()
    t = T0 + 1
    rids = []
    for counter in (1, 2):
        rec = claimed_record(ALICE, counter, 1.0, at=t)
        (item,) = delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, rec, t)
        c.on_deliver(item)
        c.on_rescored(item.content_id, 1.0, t)
        rids.append(item.content_id)
    assert c.credited_reward(ALICE.peer_id, t) == 1.0  # held, not judged: its re-score
    v = Verdict(
        rollout_id=rids[1],
        producer=ALICE.peer_id,
        passed=False,
        reason="bad_proof",
        reward_rescored=1.0,
        metrics=(),
    )
    failed = seal(VALIDATOR, v, run_id=RUN, policy_version=10, seq=1, timestamp_ms=int(t * 1000))
    for vi in delivered(a, RELAY, Kind.VERDICT, failed, t):
        c.on_deliver(vi)
    assert c.credited_reward(ALICE.peer_id, t) == 0.5  # the failed one: 0
    s = c.credit.standing(ALICE.peer_id)
    assert (s.held, s.judged, s.reward_sum) == (2, 1, 1.0)


def test_every_held_body_counts_not_the_judged_sample() -> None:
    """Only a quarter of the held bodies is judged, and the judged ones happen to be the
    solved ones: the producer is credited the exact mean re-score of all its held bodies
    times its held share, not an estimate from the sample."""
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S)
    n, rescores = 200, {}
    for counter in range(n):
        ok = solved(counter)
        book.on_header(b"p", counter, 10, float(ok), T0)
        if counter % 10 == 3:
            continue  # never served: skipped
        rescores[counter] = float(ok)
        book.on_body(b"p", counter, 10, float(ok), float(ok), T0)
        if ok and counter % 2 == 0 or counter % 8 == 1:  # a biased quarter is judged
            book.on_judged(b"p", counter, 10, True, float(ok), T0)
    book.on_time(T0 + WINDOW_S)
    held_mean = sum(rescores.values()) / len(rescores)
    assert book.credited_reward(b"p") == pytest.approx(held_mean * len(rescores) / n, abs=1e-12)
    assert book.credited_reward(b"p", withheld=n) == pytest.approx(
        held_mean * len(rescores) / (2 * n)
    )


# -- version shopping -----------------------------------------------------------------------


def test_one_counter_is_one_task_whatever_version_is_claimed() -> None:
    from trainer.tasks import derive_task

    args = dict(
        run_seed=RUN_SEED,
        datasets=[("chain_sum", 1)],
        group_size=4,
        producer=ALICE.peer_id,
        counter=9,
    )
    import inspect

    assert "policy_version" not in inspect.signature(derive_task).parameters
    assert derive_task(**args).task_seed == task_seed(RUN_SEED, 9, ALICE.peer_id)
    assert task_seed(RUN_SEED, 9, ALICE.peer_id) != task_seed(RUN_SEED, 9, BOB.peer_id)


def test_a_second_record_for_the_same_counter_under_another_version_is_double_work() -> None:
    a = judged_machine()
    first = claimed_record(ALICE, 3, 0.0, version=10, at=T0)
    again = claimed_record(ALICE, 3, 1.0, version=11, at=T0 + 1, salt=1)
    assert delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, first, T0)
    acts = a.handle(MessageReceived(ALICE.peer_id, Kind.ROLLOUT_RECORD, again, T0 + 1))
    (r,) = [x for x in acts if isinstance(x, Reject)]
    assert r.reason is Reason.DOUBLE_WORK and r.penalty < 0


def test_the_trainer_refuses_a_version_it_has_not_published_and_its_signer_pays() -> None:
    trainer = judged_machine(publishes_versions=True)
    other = judged_machine()
    rec = claimed_record(ALICE, 4, 1.0, version=11, at=T0)
    (r,) = [
        x
        for x in trainer.handle(MessageReceived(RELAY, Kind.ROLLOUT_HEADER, header(rec), T0))
        if isinstance(x, Reject)
    ]
    assert r.reason is Reason.UNPUBLISHED_VERSION and r.penalty == 0  # the relay: free
    assert trainer.scores.score(ALICE.peer_id, T0) < 0 and trainer.scores.score(RELAY, T0) == 0
    # A peer that is not the trainer may be behind: it admits the claim within its margin.
    assert delivered(other, RELAY, Kind.ROLLOUT_HEADER, header(rec), T0)
    # Versions it has published are admitted.
    assert delivered(
        trainer, RELAY, Kind.ROLLOUT_HEADER, header(claimed_record(ALICE, 5, 1.0, at=T0)), T0
    )


def test_a_version_shopper_is_credited_its_true_rate_and_pays() -> None:
    """Per counter the shopper publishes whichever of v10, v11, v12 solved its task (the
    trainer has published v10): credited about the solve rate of v10, and charged."""
    from node.roles.trainer import Collector
    from protocol.verified import VerifiedRule

    a = judged_machine(publishes_versions=True)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    t, truth, charged = T0, [], []
    for counter in range(200):
        t += 0.5
        outcomes = [solved(counter, salt) for salt in range(3)]
        truth.append(1.0 if outcomes[0] else 0.0)
        pick = outcomes.index(True) if any(outcomes) else 0
        rec = claimed_record(
            ALICE, counter, float(outcomes[pick]), version=10 + pick, at=t, salt=pick
        )
        for item in delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, rec, t):
            charged += c.on_deliver(item)
            charged += c.on_rescored(item.content_id, float(outcomes[pick]), t)
            v = pass_verdict(item.content_id, ALICE.peer_id, float(outcomes[pick]), counter + 1, t)
            for vi in delivered(a, RELAY, Kind.VERDICT, v, t):
                charged += c.on_deliver(vi)
    end = t + WINDOW_S + 60
    c.on_time(end)
    assert a.scores.score(ALICE.peer_id, t) < 0
    banned = a.handle(
        MessageReceived(ALICE.peer_id, Kind.ROLLOUT_RECORD, claimed_record(ALICE, 999, 0.0), t)
    )
    assert banned[0].reason is Reason.BANNED  # banned within a few shopped counters
    heard = c.ledger.standing(ALICE.peer_id).last + 1  # the counters it got through before
    true_mean = sum(truth[:heard]) / heard
    credited = c.credited_reward(ALICE.peer_id, end)
    assert credited <= 1.02 * true_mean, (credited, true_mean)


def test_credit_book_orders_of_arrival_and_bounds() -> None:
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S, max_open=4)
    # A verdict before the header and the body: the header's claim is still the one checked.
    book.on_judged(b"p", 0, 10, True, 1.0, T0)
    book.on_header(b"p", 0, 10, 1.0, T0)
    assert book.on_body(b"p", 0, 10, 1.0, 0.0, T0 + 1) is not None  # claimed 1, re-scored 0
    assert book.credited_reward(b"p") == 0.0  # our re-score, not the judge's
    # A body judged by a validator that we never hold: the judge's re-score once the
    # window closes; a failed judgement: 0; a body of another version than claimed: nothing.
    book.on_header(b"p", 1, 10, 1.0, T0)
    book.on_judged(b"p", 1, 10, True, 1.0, T0 + 1)
    book.on_header(b"p", 2, 10, 1.0, T0)
    book.on_body(b"p", 2, 10, 1.0, 1.0, T0 + 1)
    book.on_judged(b"p", 2, 10, False, 1.0, T0 + 2)
    assert book.on_body(b"p", 3, 10, 0.0, 0.0, T0) is None
    assert book.on_body(b"p", 3, 11, 1.0, 0.0, T0) is None  # not this claim: no charge
    book.on_time(T0 + WINDOW_S)
    s = book.standing(b"p")
    assert (s.held, s.judged, s.skipped, s.false_claims, s.reward_sum) == (4, 3, 0, 1, 1.0)
    assert book.credited_reward(b"p") == 1.0 / 4  # counter 3 is held, not judged: its re-score 0
    # Bounded: claims past `max_open` settle the oldest open one as skipped.
    for counter in range(10, 20):
        book.on_header(b"q", counter, 10, 1.0, T0 + WINDOW_S)
    assert book.standing(b"q").skipped >= 6


def test_a_shopper_across_published_versions_earns_nothing_for_going_back() -> None:
    """The trainer has published v10, v11 and v12 (all within S): per counter the shopper
    publishes whichever of them solved its task. Once it published a counter at a newer
    version, its claims at older ones are out of order: credited 0, never trained on, and
    those going back to a second older version cost it."""
    from node.roles.rollout_fates import Fates
    from node.roles.trainer import Collector, pick_ready
    from protocol.standing import StandingBook
    from protocol.verified import VerifiedRule

    a = judged_machine(version=12, publishes_versions=True)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    t, truth, waiting = T0, [], {}
    for counter in range(200):
        t += 0.5
        outcomes = [solved(counter, salt) for salt in range(3)]
        truth.append(1.0 if outcomes[2] else 0.0)  # an honest worker holds the newest
        pick = outcomes.index(True) if any(outcomes) else 2
        rec = claimed_record(
            ALICE, counter, float(outcomes[pick]), version=10 + pick, at=t, salt=pick
        )
        for item in delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, rec, t):
            c.on_deliver(item)
            waiting[item.content_id] = (item.obj, t)
            c.on_rescored(item.content_id, float(outcomes[pick]), t)
            v = pass_verdict(item.content_id, ALICE.peer_id, float(outcomes[pick]), counter + 1, t)
            for vi in delivered(a, RELAY, Kind.VERDICT, v, t):
                c.on_deliver(vi)
    true_mean = sum(truth) / len(truth)
    credited = c.credited_reward(ALICE.peer_id, t)
    # At most one counter gained per step up to a newer version (two steps here).
    assert credited <= true_mean + 2 / len(truth), (credited, true_mean)
    assert c.credit.standing(ALICE.peer_id).out_of_order > 50
    from collections import OrderedDict

    ready, _unaudited = pick_ready(c, StandingBook(), OrderedDict(waiting), 12, 2, t, Fates())
    back = [ro for ro in ready if ro.header.counter > 2 and ro.envelope.policy_version < 12]
    assert len(ready) > 100 and back == []  # after reaching v12 at counter 2, none gone back
    # Going back to one version is free (an honest restart may); to the other, it costs.
    went_back = c.take_went_back()
    assert set(went_back) == {ALICE.peer_id}
    assert 0 < len(went_back) < c.credit.standing(ALICE.peer_id).out_of_order


def test_an_honest_worker_moving_forward_is_never_out_of_order() -> None:
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S)
    heard = [(c, 10 + c // 50) for c in range(200)]  # a new version every 50 counters
    heard = heard[1::2] + heard[0::2]  # gossip reorders
    for counter, version in heard:
        book.on_header(b"p", counter, version, 0.0, T0)
    book.on_time(T0 + WINDOW_S)
    s = book.standing(b"p")
    assert (s.out_of_order, s.skipped) == (0, 200)


def test_sampled_audits_credit_an_honest_worker_and_a_liar_their_true_rates() -> None:
    """A quarter of the held bodies is judged (the validator's sample): the honest worker
    that lost a few bodies and the liar that serves only its solved ones are each credited
    their true rate over what they served, not less for the lost bodies' peers and not
    more for the lies."""
    import hashlib

    from protocol.credit import CreditBook

    def audited(producer: bytes, counter: int) -> bool:
        return hashlib.sha256(producer + counter.to_bytes(4, "big")).digest()[0] < 64

    book = CreditBook(pull_window_s=WINDOW_S)
    n = 2000
    for counter in range(n):
        ok = solved(counter)
        for who, lie in ((b"honest", False), (b"liar", True)):
            book.on_header(who, counter, 10, 1.0 if lie else float(ok), T0)
            lost = not lie and counter % 50 == 7  # 2% of honest bodies never arrive
            if lost or (lie and not ok):
                continue
            book.on_body(who, counter, 10, 1.0 if lie else float(ok), float(ok), T0)
            if audited(who, counter):
                book.on_judged(who, counter, 10, True, float(ok), T0)
    book.on_time(T0 + WINDOW_S)
    true_rate = sum(solved(c) for c in range(n)) / n
    # Every held body's re-score counts, the judged sample no more than the rest: exact.
    served = sum(solved(c) for c in range(n) if c % 50 != 7) / n
    assert book.credited_reward(b"honest") == pytest.approx(served, abs=1e-12)
    assert book.credited_reward(b"liar") == pytest.approx(true_rate, abs=1e-12)


def test_going_back_to_one_version_is_free_going_back_again_costs_the_producer() -> None:
    """Within `back_window_s` the first version a producer goes back to is free (an honest
    restart makes one batch, at one older version); a claim going back to another one
    costs its producer `out_of_order`, each time; after the window it is free again."""
    from protocol.credit import CreditBook, OutOfOrder

    book = CreditBook(pull_window_s=WINDOW_S, back_window_s=600.0)
    book.on_header(b"p", 10, 12, 0.0, T0)
    restart = [book.on_header(b"p", c, 11, 0.0, T0 + 1) for c in range(11, 19)]  # one batch back
    assert restart == [None] * 8
    again = book.on_body(b"p", 19, 10, 1.0, 1.0, T0 + 2)  # back to another version
    assert again == OutOfOrder(b"p", 19, 10)
    assert book.on_header(b"p", 20, 11, 0.0, T0 + 3) is None  # still the free one
    assert book.standing(b"p").out_of_order == 10
    assert book.on_header(b"q", 5, 9, 0.0, T0 + 3) is None  # another producer: its own window
    assert book.on_header(b"p", 21, 10, 0.0, T0 + 1 + 600.0) is None  # a new window
    assert isinstance(book.on_header(b"p", 22, 11, 0.0, T0 + 1 + 601.0), OutOfOrder)
    assert penalties.OUT_OF_ORDER.payer is penalties.Payer.PRODUCER
    assert -5 <= penalties.OUT_OF_ORDER.cost < 0  # small: it is credited 0 already


def test_the_collector_charges_the_producer_of_a_claim_going_back_twice_never_the_relay() -> None:
    a, c = collector()
    t = T0 + 1
    charges = []
    for counter, version in ((5, 10), (6, 9), (7, 8)):
        rec = claimed_record(ALICE, counter, 0.0, version=version, at=t)
        for item in delivered(a, RELAY, Kind.ROLLOUT_HEADER, header(rec), t):
            assert c.on_deliver(item) == []
            charges += c.take_went_back()
    assert charges == [ALICE.peer_id]  # the producer, for going back to v8 after v9
    assert c.take_went_back() == []


def test_a_claim_at_a_version_heard_long_after_a_newer_one_was_published_is_stale() -> None:
    """A worker holding older published versions could stay on them and pick whichever
    solved; an honest one moves to a new version within a batch and a download. A claim
    at v heard `stale_after_s` or more after a newer version was published earns 0 and is
    never trained on, free of charge (a slow honest worker may be that late)."""
    from protocol.credit import CreditBook

    grace = 300.0
    book = CreditBook(pull_window_s=WINDOW_S, stale_after_s=grace)
    book.on_published(10, T0)
    book.on_published(11, T0 + 100)
    assert book.on_body(b"p", 1, 10, 1.0, 1.0, T0 + 100 + grace - 1) is None  # within the grace
    assert book.on_body(b"p", 2, 10, 1.0, 1.0, T0 + 100 + grace) is None  # stale: no charge
    assert book.on_body(b"p", 3, 11, 1.0, 1.0, T0 + 10 * grace) is None  # the newest: never
    s = book.standing(b"p")
    assert (s.held, s.stale, s.out_of_order, s.reward_sum) == (2, 1, 0, 2.0)
    assert book.credited_reward(b"p") == 2 / 3
    assert book.not_trained(b"p", 2) and not book.out_of_order(b"p", 2)
    assert not book.not_trained(b"p", 1) and not book.not_trained(b"p", 3)
    assert book.on_body(b"r", 1, 9, 1.0, 1.0, T0 + grace) is None  # older than any we know
    assert book.standing(b"r").stale == 1 and book.credited_reward(b"r") == 0.0
    # Going back is out of order before it is stale: the second time, it costs.
    assert book.on_header(b"p", 4, 10, 0.0, T0 + 10 * grace) is None
    assert book.on_header(b"p", 5, 9, 0.0, T0 + 10 * grace) is not None
    assert book.standing(b"p").out_of_order == 2
    book.on_published(10, T0 + 10 * grace)  # a version heard again keeps its first time
    assert book.on_header(b"q", 1, 10, 0.0, T0 + 10 * grace) is None
    assert book.standing(b"q").stale == 1


def test_an_honest_worker_following_the_published_versions_is_never_stale() -> None:
    """Versions every 60 s; the worker's claims at a version keep coming for a batch and a
    download (90 s) after the next one is published: none is stale."""
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S, stale_after_s=300.0)
    t = T0
    for counter in range(400):
        t = T0 + counter  # a counter a second
        version = 10 + max(0, counter - 90) // 60  # 90 s behind the trainer
        published = 10 + counter // 60
        book.on_published(published, T0 + (published - 10) * 60)
        book.on_body(b"p", counter, version, 0.0, 0.0, t)
    s = book.standing(b"p")
    assert (s.stale, s.out_of_order, s.held) == (0, 0, 400)


def test_the_trainer_never_trains_a_stale_claim_and_credits_it_0() -> None:
    from collections import OrderedDict

    from node.roles.rollout_fates import Fates
    from node.roles.trainer import Collector, pick_ready
    from protocol.credit import STALE_AFTER_S
    from protocol.standing import StandingBook
    from protocol.verified import VerifiedRule

    a = judged_machine(version=10, publishes_versions=True)
    c = Collector(a.authority, VerifiedRule(quorum=1))
    t = T0 + STALE_AFTER_S
    c.on_published(10, T0)
    waiting = OrderedDict()
    for counter, version in ((1, 9), (2, 10)):  # v9 heard 5 minutes after v10 was published
        rec = claimed_record(ALICE, counter, 1.0, version=version, at=t)
        for item in delivered(a, ALICE.peer_id, Kind.ROLLOUT_RECORD, rec, t):
            c.on_deliver(item)
            c.on_rescored(item.content_id, 1.0, t)
            waiting[item.content_id] = (item.obj, t)
            v = pass_verdict(item.content_id, ALICE.peer_id, 1.0, counter, t)
            for vi in delivered(a, RELAY, Kind.VERDICT, v, t):
                c.on_deliver(vi)
    ready, _ = pick_ready(c, StandingBook(), waiting, 10, 2, t, Fates())
    assert [ro.header.counter for ro in ready] == [2]
    assert c.credited_reward(ALICE.peer_id, t) == 0.5
    assert c.credit.standing(ALICE.peer_id).stale == 1


# -- what a relay's delay and a key's youth cannot change -----------------------------------


def test_a_restart_batch_a_relay_delays_is_judged_by_its_signed_time() -> None:
    """An honest worker restarts twice, 700 s apart, each time one batch at an older
    version. A relay holds the first batch until just before the second: by arrival both
    go-backs fall in one window and the second costs 16 charges; by their signed times
    (within the allowed skew) they are two windows, both free. A signed time further in
    the future than the skew counts as the skew, so a producer cannot sign its way out."""
    from protocol.credit import CreditBook

    book = CreditBook(pull_window_s=WINDOW_S, back_window_s=600.0, max_skew_s=120.0)
    for c in range(16):
        assert book.on_header(b"p", c, 12, 0.0, T0, signed_at=T0) is None
    for c in range(32, 48):  # after the first restart, at the newest again
        assert book.on_header(b"p", c, 12, 0.0, T0 + 30, signed_at=T0 + 30) is None
    held = [  # the first restart's batch (signed at T0 + 10), held by the relay
        book.on_header(b"p", c, 10, 0.0, T0 + 650, signed_at=T0 + 10) for c in range(16, 32)
    ]
    second = [book.on_header(b"p", c, 11, 0.0, T0 + 710, signed_at=T0 + 710) for c in range(48, 64)]
    assert held == [None] * 16 and second == [None] * 16
    assert book.standing(b"p").out_of_order == 32  # never trained on, and free
    # a real second go-back within the window still costs, whatever it signs
    q = [book.on_header(b"q", 0, 12, 0.0, T0, signed_at=T0)]
    q.append(book.on_header(b"q", 1, 10, 0.0, T0 + 1, signed_at=T0 + 1))
    q.append(book.on_header(b"q", 2, 11, 0.0, T0 + 2, signed_at=T0 + 100_000))
    assert q[:2] == [None, None] and q[2] is not None


def test_a_key_abandoned_at_its_first_unsolved_counter_earns_at_most_the_swarms_mean() -> None:
    """Key shopping: a fresh key publishes its counters while they solve and is abandoned
    at the first that does not. Each key's own mean is 1.0; a young key is credited at
    most the mean of the keys that are not young, so the shopper earns no more per key
    than an honest key's mean. An honest key past its youth keeps its own mean."""
    import random

    from protocol.credit import YOUNG_COUNTERS, CreditBook

    rng = random.Random(4)
    book = CreditBook(pull_window_s=WINDOW_S)
    honest = [1.0 if rng.random() < 0.3 else 0.0 for _ in range(4 * YOUNG_COUNTERS)]
    for c, r in enumerate(honest):
        book.on_body(b"honest", c, 10, r, r, T0)
    mean = sum(honest) / len(honest)
    assert book.credited_reward(b"honest") == pytest.approx(mean)
    made = solved = 0
    for k in range(200):
        key = b"key%d" % k
        while rng.random() < 0.3:  # solved: published; the first unsolved: abandoned
            book.on_body(key, solved, 10, 1.0, 1.0, T0)
            solved, made = solved + 1, made + 1
        made += 1
    per_key = [x for k in range(200) if (x := book.credited_reward(b"key%d" % k)) is not None]
    assert per_key and max(per_key) <= mean + 1e-12  # its own mean was 1.0
    # per key it earns the swarm's mean, what its counters were truly worth on average
    assert max(per_key) / (solved / made) <= 1.02 + 3 * (0.3 * 0.7 / made) ** 0.5 / 0.3


def test_the_collector_judges_a_late_restart_batch_by_its_envelopes_signed_time() -> None:
    """Through admission and the trainer's collector: the first restart's batch, signed
    at T0 + 10 and pulled only at T0 + 650, and the second, signed and heard at T0 + 710,
    cost their honest producer nothing."""
    from protocol.admission import VersionChanged

    a, c = collector()
    a.handle(VersionChanged(12, T0))
    batches = [(range(0, 8), 12, T0, T0), (range(8, 16), 12, T0 + 30, T0 + 30)]
    batches += [(range(16, 24), 10, T0 + 10, T0 + 650), (range(24, 32), 11, T0 + 710, T0 + 710)]
    for counters, version, signed, heard in batches:
        for counter in counters:
            rec = claimed_record(ALICE, counter, 0.0, version=version, at=signed)
            for item in delivered(a, RELAY, Kind.ROLLOUT_RECORD, rec, heard):
                c.on_deliver(item)
    assert c.credit.standing(ALICE.peer_id).out_of_order == 16
    assert c.take_went_back() == []
