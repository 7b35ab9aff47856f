"""Producer claims (protocol.producer_cases): re-checked by our own audits of the window."""

from protocol.fraud import FALSE_ACCUSATION, Audit, NeedRecord, Punish
from protocol.producer_cases import PRODUCER_PENALTY, PRODUCER_WINDOW, WINDOW_OVER, ProducerCases

LIMIT = 1e-6
W = PRODUCER_WINDOW
P, ACC = b"producer", b"accuser"


def ids(block: int = 0) -> tuple[bytes, ...]:
    return tuple(b"r%d" % c for c in range(block * W, (block + 1) * W))


def hold_and_audit(cases: ProducerCases, values: list[float], block: int = 0) -> list:
    out = []
    for k, v in enumerate(values):
        c = block * W + k
        acts = cases.record_held(b"r%d" % c, P, c, now=1.0)
        assert acts == [Audit(b"r%d" % c)]
        out += cases.audited(b"r%d" % c, v, now=2.0)
    return out


def test_a_reproduced_claim_costs_the_producer_and_a_false_one_the_accuser() -> None:
    cases = ProducerCases(LIMIT)
    acts = cases.claimed(P, ids(0), ACC, now=0.0)
    assert acts == [NeedRecord(r, (P, ACC)) for r in ids(0)]
    done = hold_and_audit(cases, [3e-6] * (W // 2 + 1) + [1e-8] * (W // 2 - 1))
    assert [(a.peer, a.penalty) for a in done] == [(P, PRODUCER_PENALTY)]
    cases.claimed(P, ids(1), ACC, now=0.0)
    done = hold_and_audit(
        cases, [3e-6] * (WINDOW_OVER - 1) + [1e-8] * (W - WINDOW_OVER + 1), block=1
    )
    assert [(a.peer, a.penalty) for a in done] == [(ACC, FALSE_ACCUSATION)]
    assert cases.counts["convicted"] == cases.counts["acquitted"] == 1
    # judged once: the same false claim again costs at once, a reproduced one nothing
    assert cases.claimed(P, ids(1), ACC, now=3.0) == [
        Punish(ACC, FALSE_ACCUSATION, "false producer claim", "false_accusation")
    ]
    assert cases.claimed(P, ids(0), b"other", now=3.0) == []


def test_a_claim_that_is_not_records_of_the_producer_costs_its_signer() -> None:
    cases = ProducerCases(LIMIT)
    # a record of another signer
    cases.claimed(P, ids(2), ACC, now=0.0)
    (p,) = cases.record_held(ids(2)[0], b"someone-else", 2 * W, now=1.0)
    assert p.peer == ACC and not cases.cases
    # two records of one counter (a producer signs one record per counter)
    cases.claimed(P, ids(3), ACC, now=0.0)
    cases.record_held(ids(3)[0], P, 3 * W, now=1.0)
    (p,) = cases.record_held(ids(3)[1], P, 3 * W, now=1.0)
    assert p.peer == ACC


def test_missing_records_and_unknown_versions_cost_nobody() -> None:
    cases = ProducerCases(LIMIT)
    cases.claimed(P, ids(0), ACC, now=0.0)
    assert cases.wants(ids(0)[0])
    assert cases.cannot_judge(ids(0)[3]) == [] and not cases.cases
    assert not any(cases.wants(r) for r in ids(0))  # the index forgets a dropped claim
    cases.claimed(P, ids(1), ACC, now=0.0)
    assert cases.record_held(ids(1)[0], P, W, now=1.0) == [Audit(ids(1)[0])]
    assert cases.audited(ids(1)[0], None, now=1.0) == [] and not cases.cases  # no model check
    cases.claimed(P, ids(2), ACC, now=0.0)
    assert cases.tick(now=cases.config.case_ttl_s + 1.0) == [] and not cases.cases
    assert cases.counts["expired"] == 1
    # a record audited before the claim checked it does not count towards the median
    cases.claimed(P, ids(4), ACC, now=200.0)
    assert cases.audited(ids(4)[0], 1.0, now=200.0) == []
    assert not cases.cases[next(iter(cases.cases))].values


def test_claims_are_bounded_per_accuser_and_in_all() -> None:
    cases = ProducerCases(LIMIT)
    cfg = cases.config
    for k in range(cfg.max_open_per_accuser + 1):
        cases.claimed(P, ids(k), ACC, now=0.0)
    assert len(cases.cases) == cfg.max_open_per_accuser and cases.counts["ignored"] == 1
    assert cases.claimed(P, ids(0), P, now=0.0) == []  # its own work: never a case


# -- the sequential rule and claims of any size --------------------------------------------


def test_a_minority_change_under_the_window_rule_is_claimed_and_reproduced() -> None:
    """3 changed records of every 16 never fail a window; the sequential rule over the
    producer's audited records catches it, and a peer re-checking the claim convicts."""
    from protocol.producer_cases import sequential_failed

    over = [c for c in range(8 * W) if c % W in (2, 7, 11)]  # WINDOW_OVER - 1 a window
    assert len({c // W for c in over}) == 8 and WINDOW_OVER == 4
    assert sequential_failed(over)
    rids = tuple(b"r%d" % c for c in over)
    cases = ProducerCases(LIMIT)
    cases.claimed(P, rids, ACC, now=0.0)
    done = []
    for c in over:
        assert cases.record_held(b"r%d" % c, P, c, now=1.0) == [Audit(b"r%d" % c)]
        done += cases.audited(b"r%d" % c, 3e-6, now=2.0)
    assert [(a.peer, a.penalty) for a in done] == [(P, PRODUCER_PENALTY)]


def test_a_partial_window_claim_is_judged_not_refused_by_its_size() -> None:
    """A finding about any number of records is a claim a peer re-checks: 15 records of one
    window, WINDOW_OVER of them over, convict; 15 honest ones acquit (the accuser pays)."""
    cases = ProducerCases(LIMIT)
    assert cases.claimed(P, ids(0)[:15], ACC, now=0.0) == [
        NeedRecord(r, (P, ACC)) for r in ids(0)[:15]
    ]
    done = hold_and_audit(cases, [3e-6] * WINDOW_OVER + [1e-8] * (15 - WINDOW_OVER))
    assert [(a.peer, a.penalty) for a in done] == [(P, PRODUCER_PENALTY)]
    cases.claimed(P, ids(1)[:15], ACC, now=0.0)
    done = hold_and_audit(cases, [1e-8] * 15, block=1)
    assert [(a.peer, a.penalty) for a in done] == [(ACC, FALSE_ACCUSATION)]


def test_chosen_records_of_an_honest_producer_never_convict() -> None:
    """The records a claim names are the accuser's choice: an honest producer's rare
    records over the limit, picked from a long history, are not evidence (the span they
    lie in counts every counter in it)."""
    from protocol.producer_cases import SEQ_P0, sequential_failed

    every = int(1 / SEQ_P0)  # honest: one record in 1/P0 over the limit
    assert not sequential_failed(list(range(0, 64 * every, every)))
    assert not sequential_failed([0])  # one record over the limit is noise
    assert sequential_failed([0, 1, 2, 3, 4, 5, 6, 7])  # eight in a row are not


def test_the_sequential_rule_has_its_stated_false_positive_rate_and_power() -> None:
    """docs/DESIGN.md's figures: an honest producer at the assumed rate P0 is never caught
    in 2,000 histories of 4,096 records; a change in 1 record of 8 (half the window
    threshold), every record audited, is caught within 256 records in >= 99% of them."""
    import math
    import random

    from protocol.producer_cases import SEQ_P0, SequentialTest

    rng = random.Random(41)

    def caught_within(rate: float, n: int) -> int | None:
        """The records until caught, a record over the limit with probability `rate`."""
        test, c = SequentialTest(), -1
        while True:  # the gaps between records over the limit are geometric
            c += 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - rate))
            if c >= n:
                return None
            if test.add(c):
                return c + 1

    assert sum(caught_within(SEQ_P0, 4096) is not None for _ in range(2000)) == 0
    found = [caught_within(1 / 8, 256) for _ in range(2000)]
    assert sum(f is not None for f in found) >= 0.99 * 2000
