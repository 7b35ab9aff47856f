"""A producer's standing and the window statistic (protocol.standing, verify.producer).

Each test pins one way to dodge the per-producer rule or to waste honest work, driven with
explicit times: a withheld body per window, a minority of changed records per window, many
fresh keys, and honest work that trains although only a sample of it is audited, while a
changed-model cheater is cut off within a bounded number of trained records.
"""

from __future__ import annotations

import random

from node.roles.rollout_fates import Fates
from protocol.audit_sample import sample_ticket, sampled
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.producer_cases import PRODUCER_PENALTY, PRODUCER_WINDOW, ProducerCases
from protocol.standing import (
    HOLD_S,
    MISSING,
    PROBATION_CREDIT,
    WINDOW_OVER,
    Banned,
    Decision,
    HeldPasses,
    StandingBook,
    State,
    window_failed,
)
from verify.producer import CLOSE_AFTER_S, ProducerTally

W = PRODUCER_WINDOW
LIMIT = 1e-6
HONEST, CHANGED = 2e-7, 5e-6
P = b"producer"
VALIDATOR = Identity.from_private_bytes(bytes(range(3, 35)))
RUN = "standing-test"
FRACTION = 0.25


def _rid(c: int) -> bytes:
    return b"r%d" % c


def test_a_window_with_a_withheld_body_is_judged_with_that_record_failed() -> None:
    tally = ProducerTally(LIMIT)
    for c in range(W):
        tally.expect(P, c, _rid(c), now=0.0)
    values = [CHANGED if c in range(1, WINDOW_OVER) else HONEST for c in range(W)]
    withheld = W - 1
    found = [
        tally.add(P, c, _rid(c), {"logprob_err_mean": values[c]}) for c in range(W) if c != withheld
    ]
    assert found == [None] * (W - 1)  # the window never fills: one body is withheld
    assert tally.close(now=CLOSE_AFTER_S - 1) == []
    (finding,) = tally.close(now=CLOSE_AFTER_S + 1)
    assert finding.producer == P and finding.missing == 1
    assert tally.close(now=2 * CLOSE_AFTER_S) == []  # judged once
    # an honest window that lost one body is not convicted for it alone
    for c in range(W, 2 * W):
        tally.expect(P, c, _rid(c), now=10.0)
        if c != W + 2:
            tally.add(P, c, _rid(c), {"logprob_err_mean": HONEST})
    assert tally.close(now=10.0 + CLOSE_AFTER_S + 1) == []
    assert window_failed([HONEST] * (W - 1), LIMIT, missing=1) is False
    assert (
        window_failed(
            [HONEST] * (W - WINDOW_OVER) + [CHANGED] * (WINDOW_OVER - 1), LIMIT, missing=1
        )
        is True
    )
    # bodies that never came never fail a window alone (our own pulls may have failed) ...
    assert window_failed([HONEST] * 8, LIMIT, missing=8) is False
    # ... but they hide no changed record either
    assert window_failed([HONEST] * 7 + [CHANGED], LIMIT, missing=8) is True
    assert MISSING > CHANGED


def test_a_window_with_a_minority_of_changed_records_is_caught() -> None:
    rng = random.Random(1)
    tally, cases = ProducerTally(LIMIT), ProducerCases(LIMIT)
    values = [CHANGED] * (W // 4) + [HONEST] * (W - W // 4)
    rng.shuffle(values)
    found = [tally.add(P, c, _rid(c), {"logprob_err_mean": v}) for c, v in enumerate(values)]
    assert found[-1] is not None and found[:-1] == [None] * (W - 1)
    # a peer re-checking the claim applies the same statistic to its own audits
    cases.claimed(P, tuple(_rid(c) for c in range(W)), b"accuser", now=0.0)
    acts = []
    for c, v in enumerate(values):
        cases.record_held(_rid(c), P, c, now=1.0)
        acts += cases.audited(_rid(c), v, now=2.0)
    assert [(a.peer, a.penalty) for a in acts] == [(P, PRODUCER_PENALTY)]
    honest = ProducerTally(LIMIT)
    assert [
        honest.add(P, c, _rid(c), {"logprob_err_mean": HONEST * (1 + c % 3)}) for c in range(W)
    ] == [None] * W


def test_fresh_keys_are_on_probation_and_pay_for_it_in_audits() -> None:
    book = StandingBook()
    keys = [b"sybil%d" % k for k in range(8)]
    for key in keys:  # a split over many keys: every fresh key is audited whole
        assert book.state(key) is State.PROBATION
        assert book.audit_fraction(key, FRACTION) == 1.0
        assert book.credit_weight(key) == PROBATION_CREDIT
        assert book.decide(key, None, arrived_at=0.0, now=1e9) is Decision.WAIT  # never unaudited
        assert book.decide(key, True, arrived_at=0.0, now=0.0) is Decision.TRAIN
    for _ in range(book.probation_passes - 1):
        assert book.audited(keys[0], True) == []
    assert book.state(keys[0]) is State.PROBATION
    book.audited(keys[0], True)
    assert book.state(keys[0]) is State.GOOD and book.audit_fraction(keys[0], FRACTION) == FRACTION
    assert book.decide(keys[0], None, arrived_at=0.0, now=HOLD_S - 1) is Decision.WAIT
    assert book.decide(keys[0], None, arrived_at=0.0, now=HOLD_S) is Decision.TRAIN
    # one failed audit: banned once, nothing of it trains, no credit
    assert book.audited(keys[0], False, "logprob_mismatch") == [Banned(keys[0], "logprob_mismatch")]
    assert book.audited(keys[0], False) == []
    assert book.credit_weight(keys[0]) == 0.0
    assert book.decide(keys[0], True, arrived_at=0.0, now=1e9) is Decision.DROP
    assert book.audit_fraction(keys[0], FRACTION) == 1.0
    # a run (or a test) that wants no probation
    assert StandingBook(probation_passes=0).state(b"fresh") is State.GOOD


def _run(
    producer: Identity,
    n: int,
    changed_from: int,
    changed_share: float,
    seed: int,
    audit_delay_s: float = 3.0,
    rate: float = 4.0,
) -> tuple[int, int, int]:
    """One producer's `n` records at `rate`/s, audited by one validator at the default
    fraction (its tickets, the standing's probation fraction), trained by the standing rule.
    Returns (honest records trained, changed records trained, records produced)."""
    rng = random.Random(seed)
    val_book, trainer_book = StandingBook(), StandingBook()
    verdict_at: list[tuple[float, int, bool]] = []  # (heard at, record, passed)
    made = []
    for i in range(n):
        t = i / rate
        changed = i >= changed_from and rng.random() < changed_share
        rid = content_id(producer.peer_id + i.to_bytes(8, "big") + bytes([seed]))
        made.append((t, rid, changed))
        fraction = val_book.audit_fraction(producer.peer_id, FRACTION)
        if sampled(sample_ticket(VALIDATOR, RUN, rid), fraction):
            val_book.audited(producer.peer_id, not changed)
            verdict_at.append((t + audit_delay_s, i, not changed))
    verdicts: dict[int, bool] = {}
    waiting = list(range(n))
    trained = [0, 0]
    end = n / rate + 10 * HOLD_S
    now, heard = 0.0, 0
    verdict_at.sort()
    while now <= end:
        while heard < len(verdict_at) and verdict_at[heard][0] <= now:
            _, i, passed = verdict_at[heard]
            verdicts[i] = passed
            trainer_book.audited(producer.peer_id, passed)
            heard += 1
        keep = []
        for i in waiting:
            t, _rid_, changed = made[i]
            if t > now:
                keep.append(i)
                continue
            d = trainer_book.decide(producer.peer_id, verdicts.get(i), arrived_at=t, now=now)
            if d is Decision.TRAIN:
                trained[changed] += 1
            elif d is Decision.WAIT:
                keep.append(i)
        waiting = keep
        now += 1.0
    return trained[0], trained[1], n


def test_honest_work_trains_when_only_a_sample_is_audited() -> None:
    for seed in range(3):
        honest, changed, n = _run(
            Identity.from_private_bytes(bytes([seed + 40]) * 32), 800, 10**9, 0.0, seed
        )
        assert changed == 0
        assert honest / n >= 0.9, (seed, honest, n)


def test_a_changed_model_cheater_is_cut_off_within_32_trained_records() -> None:
    for seed in range(6):
        ident = Identity.from_private_bytes(bytes([seed + 60]) * 32)
        # honest through its probation, then a quarter of its records changed
        _honest, changed, _n = _run(ident, 800, 2 * 2 * PRODUCER_WINDOW, 0.25, seed)
        assert changed <= 32, (seed, changed)


def test_the_trainer_trains_a_good_producers_unaudited_records_and_drops_a_banned_ones() -> None:
    """The trainer's wiring (`node.roles.trainer`): verdicts of the run's validator move
    the producer's standing; once its probation passed, its unaudited records train after
    the hold; a failed verdict bans it and its waiting records never train."""
    from collections import OrderedDict

    from node.roles.trainer import Collector, judged, pick_ready
    from protocol.admission import Deliver, Kind
    from protocol.verified import VerifiedRule
    from tests.test_protocol_admission import ALICE, RELAY, header
    from tests.test_protocol_trust import VALIDATOR as RUN_VALIDATOR
    from tests.test_protocol_trust import machine, msg, rollout, verdict

    a = machine(signer_burst=1000.0, sender_burst=1000.0)
    c, book = Collector(a.authority, VerifiedRule(quorum=1)), StandingBook()
    waiting: OrderedDict = OrderedDict()
    probation = book.probation_passes
    t0 = 1000.0
    rids = []
    for seq in range(1, probation + 9):
        rec = rollout(seq=seq)
        (item,) = [
            x.item for x in a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec)) if isinstance(x, Deliver)
        ]
        c.on_deliver(item)
        waiting[item.content_id] = (item.obj, t0)
        rids.append(content_id(header(rec)))
    # the probation's records get pass verdicts; the rest none
    for k, rid in enumerate(rids[:probation]):
        (item,) = [
            x.item
            for x in a.handle(
                msg(RELAY, Kind.VERDICT, verdict(RUN_VALIDATOR, rid, ALICE.peer_id, seq=k + 1))
            )
            if isinstance(x, Deliver)
        ]
        c.on_deliver(item)
        assert judged(book, a.authority, item) == []
    assert book.state(ALICE.peer_id) is State.GOOD
    ready, unaudited = pick_ready(c, book, waiting, 10, 2, t0 + 1, Fates())
    assert (len(ready), unaudited) == (probation, 0)  # verified: at once
    assert pick_ready(c, book, waiting, 10, 2, t0 + HOLD_S - 1, Fates()) == (
        [],
        0,
    )  # the rest wait the hold
    ready, unaudited = pick_ready(c, book, waiting, 10, 2, t0 + HOLD_S, Fates())
    assert (len(ready), unaudited) == (8, 8)
    # a failed verdict bans: what waits of it is dropped, nothing more trains
    rec = rollout(seq=probation + 20)
    (item,) = [
        x.item for x in a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec)) if isinstance(x, Deliver)
    ]
    c.on_deliver(item)
    waiting[item.content_id] = (item.obj, t0)
    bad = verdict(RUN_VALIDATOR, rids[-1], ALICE.peer_id, passed=False, seq=probation + 1)
    (item,) = [x.item for x in a.handle(msg(RELAY, Kind.VERDICT, bad)) if isinstance(x, Deliver)]
    assert judged(book, a.authority, item) == [Banned(ALICE.peer_id, "bad_proof")]
    assert pick_ready(c, book, waiting, 10, 2, t0 + 10 * HOLD_S, Fates()) == ([], 0) and not waiting


def test_a_closed_window_names_its_withheld_records_and_a_late_audit_is_not_missing() -> None:
    tally = ProducerTally(LIMIT)
    for c in range(W):
        tally.expect(P, c, _rid(c), now=0.0)
    tally.body_held(
        P, 0, now=0.0
    )  # held, its audit still queued at the close: not missing, not counted
    for c in range(1, W - 1):
        tally.add(P, c, _rid(c), {"logprob_err_mean": CHANGED if c < WINDOW_OVER else HONEST})
    (finding,) = tally.close(now=CLOSE_AFTER_S + 1)
    assert finding.missing == 1  # counter W - 1's body never came
    assert finding.rollout_ids == tuple(_rid(c) for c in range(1, W))


def test_a_sybils_passes_are_held_until_its_window_is_judged_and_never_published() -> None:
    """Many keys, half a window each, every record passing alone: the validator holds the
    passes of keys on probation until their window is judged (`HeldPasses`); a Sybil's
    windows close over the limit and none of its passes is ever published, an honest
    key's are published once its window is judged clean."""
    tally, held, book = ProducerTally(LIMIT), HeldPasses(), StandingBook()
    published: list[bytes] = []
    keys = {b"sybil%d" % k: CHANGED for k in range(6)} | {b"honest": HONEST}
    findings = []
    for key, value in keys.items():
        for c in range(W // 2):
            rid = key + bytes([c])
            tally.expect(key, c, rid, now=0.0)
            book.audited(key, True)
            held.hold(key, 0, rid)
            if (found := tally.add(key, c, rid, {"logprob_err_mean": value})) is not None:
                findings.append(found)  # the sequential rule, before the window closes
    assert {f.producer for f in findings} == {k for k in keys if k != b"honest"}
    assert published == []
    for found in findings + tally.close(now=CLOSE_AFTER_S + 1):
        book.ban(found.producer, "window")
        held.failed(found.producer)
    for producer, window in tally.take_cleared():
        published += held.cleared(producer, window)
    assert published == [b"honest" + bytes([c]) for c in range(W // 2)]
    assert len(held) == 0
    assert all(book.state(k) is State.BANNED for k in keys if k != b"honest")


def test_cleared_passes_hands_out_only_the_cleared_windows_and_counts_them() -> None:
    from protocol.standing import HeldPasses, StandingBook, State, cleared_passes

    held, book = HeldPasses(), StandingBook(probation_passes=3)
    p, q = b"p" * 32, b"q" * 32
    for i in range(3):
        held.hold(p, 0, f"p0-{i}")
    held.hold(p, 1, "p1")
    held.hold(q, 0, "q0")
    out = cleared_passes([(p, 0), (q, 5)], held, book)
    assert out == ["p0-0", "p0-1", "p0-2"]
    assert len(held) == 2  # window 1 of p and window 0 of q still wait
    assert book.state(p) is State.GOOD  # its three passes counted: probation over
    assert book.state(q) is State.PROBATION  # nothing of q's cleared
    assert cleared_passes([(p, 0)], held, book) == []  # handed out once
