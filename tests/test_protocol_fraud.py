"""protocol.fraud: accusations are re-checked before anyone pays, and only signers pay."""

from __future__ import annotations

import pytest

from protocol.fraud import (
    FALSE_ACCUSATION,
    FRAUD_PENALTY,
    Audit,
    FraudCases,
    FraudConfig,
    NeedRecord,
    Punish,
)
from protocol.peer_score import ScoreConfig

RID = b"r" * 32
PRODUCER, VALIDATOR, OTHER = b"producer", b"validator", b"other-validator"


def _open(cases: FraudCases, rid: bytes = RID, accuser: bytes = VALIDATOR, now: float = 0.0):
    return cases.accused(rid, PRODUCER, accuser, "proof-mismatch", now)


def test_an_accusation_asks_for_the_record_then_an_audit_and_punishes_nobody_yet():
    cases = FraudCases()
    assert _open(cases) == [NeedRecord(RID, (PRODUCER, VALIDATOR))]
    assert cases.record_held(RID, 1.0) == [Audit(RID)]
    assert cases.record_held(RID, 1.5) == []  # one audit per case


def test_a_reproduced_failure_bans_the_producer_and_only_the_producer():
    cases = FraudCases()
    _open(cases)
    _open(cases, accuser=OTHER)
    cases.record_held(RID, 1.0)
    actions = cases.audited(RID, passed=False, reason="proof-mismatch", now=2.0)
    assert actions == [Punish(PRODUCER, FRAUD_PENALTY, "fraud reproduced: proof-mismatch", "fraud")]
    cfg = ScoreConfig()  # from the best score to below the ban threshold
    assert cfg.max_score + FRAUD_PENALTY < cfg.ban_threshold
    assert cases.counts["convicted"] == 1
    assert _open(cases, accuser=b"third") == []  # judged once; no second conviction


def test_an_accusation_that_does_not_reproduce_costs_every_accuser():
    cases = FraudCases()
    _open(cases)
    _open(cases, accuser=OTHER)
    cases.record_held(RID, 1.0)
    actions = cases.audited(RID, passed=True, reason="ok", now=2.0)
    assert {a.peer for a in actions} == {VALIDATOR, OTHER}
    assert all(isinstance(a, Punish) and a.penalty == FALSE_ACCUSATION for a in actions)
    assert PRODUCER not in {a.peer for a in actions}


def test_a_late_accusation_of_a_rollout_we_already_passed_is_judged_at_once():
    cases = FraudCases()
    assert cases.audited(RID, passed=True, reason="ok", now=0.0) == []  # our own sample
    actions = _open(cases, now=5.0)
    assert actions == [
        Punish(VALIDATOR, FALSE_ACCUSATION, "false accusation: proof-mismatch", "false_accusation")
    ]


def test_a_case_without_record_expires_and_nobody_pays():
    cases = FraudCases(FraudConfig(case_ttl_s=10.0))
    _open(cases, now=0.0)
    assert cases.tick(5.0) == [] and cases.is_open(RID)
    assert cases.tick(11.0) == [] and not cases.is_open(RID)
    assert cases.counts["expired"] == 1
    # a case we cannot judge (no weights of its version) is dropped without blame
    _open(cases, now=20.0)
    assert cases.cannot_judge(RID) == [] and not cases.is_open(RID)


def test_accusations_are_bounded_per_accuser_and_in_total():
    cases = FraudCases(FraudConfig(max_open=5, max_open_per_accuser=2))
    rids = [bytes([i]) * 32 for i in range(10)]
    assert all(_open(cases, rid=r) for r in rids[:2])
    assert _open(cases, rid=rids[2]) == []  # this accuser's third open case: ignored, free
    assert all(_open(cases, rid=r, accuser=OTHER) for r in rids[2:4])
    assert _open(cases, rid=rids[4], accuser=b"v3")
    assert _open(cases, rid=rids[5], accuser=b"v4") == []  # 5 open in total
    assert len(cases.cases) == 5 and cases.counts["ignored"] == 2


def test_an_accusation_naming_another_producer_joins_no_case():
    cases = FraudCases()
    _open(cases)
    assert cases.accused(RID, b"someone-else", OTHER, "x", 1.0) == []
    cases.record_held(RID, 1.0)
    actions = cases.audited(RID, passed=True, reason="ok", now=2.0)
    assert [a.peer for a in actions] == [VALIDATOR]  # OTHER was not counted as an accuser


def test_no_self_accusation_and_config_checked():
    cases = FraudCases()
    assert cases.accused(RID, PRODUCER, PRODUCER, "x", 0.0) == []
    with pytest.raises(ValueError):
        FraudConfig(case_ttl_s=0)
