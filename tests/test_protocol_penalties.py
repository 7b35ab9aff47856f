"""The one table of penalties: complete, used by every module, and printed in docs/PROTOCOL.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol import accounting, errors, fraud, penalties, producer_cases
from protocol.admission import PENALTIES, REPEATS_DOUBLE, AdmissionConfig, Reason

PROTOCOL = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md"


def test_the_protocol_doc_prints_the_table_as_rendered():
    text = PROTOCOL.read_text()
    table = penalties.render_markdown()
    assert "### Penalties" in text
    section = text[text.index("### Penalties") :]
    assert table in section, (
        "docs/PROTOCOL.md's penalty table differs: paste penalties.render_markdown()"
    )


def test_every_admission_reason_is_an_offence_of_the_table():
    for reason in Reason:
        assert PENALTIES[reason] == penalties.BY_NAME[reason].cost
    assert REPEATS_DOUBLE == {Reason.WRONG_RUN, Reason.CLOCK_SKEW}
    assert AdmissionConfig().body_missing_sender == penalties.BODY_MISSING_RELAYED.cost


def test_modules_read_their_costs_from_the_table():
    assert fraud.FRAUD_PENALTY == penalties.FRAUD.cost
    assert fraud.FALSE_ACCUSATION == penalties.FALSE_ACCUSATION.cost
    assert producer_cases.PRODUCER_PENALTY == penalties.PRODUCER_WINDOW.cost
    assert accounting.WITHHELD_PENALTY == penalties.WITHHELD.cost
    assert errors.DecodeError("x", None, "y").penalty == penalties.MALFORMED.cost
    assert errors.SignatureError("x").penalty == penalties.BAD_SIGNATURE.cost
    assert errors.ReplayError("x").penalty == penalties.REPLAY.cost
    assert errors.IntegrityError("x").penalty == penalties.BODY_MISMATCH.cost


def test_costs_are_score_changes_and_repeats_double_up_to_a_cap():
    assert all(o.cost <= 0 for o in penalties.TABLE)
    with pytest.raises(ValueError):
        penalties.Offence("reward", 1.0, penalties.Payer.SENDER, "not a penalty")
    assert [penalties.repeat_cost(-2.0, n) for n in range(4)] == [-2.0, -4.0, -8.0, -16.0]
    cap = penalties.MAX_DOUBLINGS
    assert penalties.repeat_cost(-2.0, cap + 10) == penalties.repeat_cost(-2.0, cap)


def test_a_gossip_control_flood_reported_window_after_window_reaches_a_ban():
    from protocol.admission import Admission, Ban, Misbehaved, RunRules

    a = Admission(RunRules("run", 2))
    banned_at = None
    for window in range(12):  # the host reports a sustained flood once per 10 s window
        acts = a.handle(
            Misbehaved(
                "flooder",
                penalties.IHAVE_FLOOD.cost,
                "ihave ids",
                10.0 * window,
                offence=penalties.IHAVE_FLOOD.name,
            )
        )
        if any(isinstance(x, Ban) for x in acts):
            banned_at = window
            break
    assert banned_at is not None and banned_at <= 8
    # A single report now and then costs only its base price.
    b = Admission(RunRules("run", 2))
    for hour in range(3):
        b.handle(
            Misbehaved(
                "rare",
                penalties.IHAVE_FLOOD.cost,
                "ihave ids",
                3600.0 * hour,
                offence=penalties.IHAVE_FLOOD.name,
            )
        )
    assert b.scores.score("rare", 7200.0) >= 3 * penalties.IHAVE_FLOOD.cost
