"""Future versions: the sender is asked to back its claim with a trainer-signed manifest
(`protocol.version_claims`); an unbacked claim costs the sender, a backed one nobody."""

from __future__ import annotations

from protocol.admission import NewestShown, Reason, Reject
from protocol.version_claims import AskNewest, VersionClaims
from tests.test_protocol_admission import (
    ALICE,
    BOB,
    RELAY,
    T0,
    TRAINER,
    header,
    machine,
    msg,
    record,
    weights,
)

AHEAD = 10 + 3  # the machine runs at version 10; 2 ahead is still admitted


def _asks(actions):
    return [a for a in actions if isinstance(a, AskNewest)]


def test_a_future_version_from_its_signer_is_free_but_must_be_backed():
    a = machine()
    actions = a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD))))
    assert actions[0].reason is Reason.FUTURE_VERSION and actions[0].penalty == 0
    assert _asks(actions) == [AskNewest(ALICE.peer_id, AHEAD)]  # the signer holds v itself
    # It shows nothing: no honest producer makes rollouts of a version it never installed.
    out = a.handle(NewestShown(ALICE.peer_id, None, T0 + 1))
    rej = [x for x in out if isinstance(x, Reject)]
    assert rej and rej[0].reason is Reason.UNBACKED_VERSION and rej[0].penalty < 0
    assert a.scores.score(ALICE.peer_id, T0 + 1) < 0


def test_a_backed_claim_costs_nobody():
    a = machine()
    a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD))))
    assert a.handle(NewestShown(ALICE.peer_id, weights(TRAINER, AHEAD, 1), T0 + 1)) == []
    assert a.scores.score(ALICE.peer_id, T0 + 1) == 0


def test_a_relay_needs_only_a_version_its_admission_would_pass():
    a = machine()
    actions = a.handle(msg(RELAY, "rollout_header", header(record(version=AHEAD))))
    assert _asks(actions) == [AskNewest(RELAY, AHEAD - a.config.max_future_versions)]
    # The relay is at AHEAD - 2: it admitted AHEAD honestly.
    assert a.handle(NewestShown(RELAY, weights(TRAINER, AHEAD - 2, 1), T0 + 1)) == []
    assert a.scores.score(RELAY, T0 + 1) == 0


def test_a_manifest_not_signed_by_a_trainer_backs_nothing():
    a = machine()
    a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD))))
    out = a.handle(NewestShown(ALICE.peer_id, weights(BOB, AHEAD, 1), T0 + 1))
    assert any(isinstance(x, Reject) and x.reason is Reason.UNBACKED_VERSION for x in out)
    a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD, seq=2))))


def test_no_answer_is_no_evidence_and_unasked_answers_count_for_nothing():
    a = machine()
    a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD))))
    assert a.handle(NewestShown(ALICE.peer_id, None, T0 + 1, answered=False)) == []
    assert a.handle(NewestShown(ALICE.peer_id, None, T0 + 2)) == []  # nothing open now
    assert a.handle(NewestShown(BOB.peer_id, b"garbage", T0 + 2)) == []
    assert a.scores.score(ALICE.peer_id, T0 + 2) == 0


def test_a_flood_of_claims_costs_one_question_per_sender_and_interval():
    a = machine()
    asks = []
    for seq in range(1, 40):
        asks += _asks(
            a.handle(msg(ALICE.peer_id, "rollout_header", header(record(version=AHEAD, seq=seq))))
        )
    assert len(asks) == 1
    claims = VersionClaims(min_interval_s=10.0, max_open=2)
    assert claims.claimed("p", 5, 0.0) is not None
    claims.unanswered("p")
    assert claims.claimed("p", 5, 1.0) is None  # asked 1 s ago
    assert claims.claimed("p", 5, 11.0) is not None
    assert claims.claimed("q", 5, 11.0) is not None
    assert claims.claimed("r", 5, 11.0) is None  # two open in all
    assert claims.claimed("s", 0, 11.0) is None  # version 0 needs no manifest


def test_pulled_records_are_never_questioned():
    a = machine()
    actions = a.handle(msg(RELAY, "rollout_record", record(version=AHEAD)))
    assert actions[0].reason is Reason.FUTURE_VERSION and _asks(actions) == []
