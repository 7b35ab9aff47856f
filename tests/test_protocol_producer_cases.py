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


def test_a_claim_that_is_not_one_window_of_the_producer_costs_its_signer() -> None:
    cases = ProducerCases(LIMIT)
    # the wrong size: known from the claim alone
    (p,) = cases.claimed(P, ids(0)[:-1], ACC, now=0.0)
    assert (p.peer, p.penalty) == (ACC, FALSE_ACCUSATION)
    # the noisiest records of two windows, claimed as one: found when a record arrives
    picked = ids(0)[: W // 2] + ids(1)[: W // 2]
    cases.claimed(P, picked, ACC, now=0.0)
    assert cases.record_held(picked[0], P, 0, now=1.0) == [Audit(picked[0])]
    (p,) = cases.record_held(picked[-1], P, W + W // 2 - 1, now=1.0)
    assert (p.peer, p.penalty) == (ACC, FALSE_ACCUSATION) and not cases.cases
    # a record of another signer
    cases.claimed(P, ids(2), ACC, now=0.0)
    (p,) = cases.record_held(ids(2)[0], b"someone-else", 2 * W, now=1.0)
    assert p.peer == ACC and not cases.cases
    # two records of one counter (a window must be W distinct counters)
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
