"""No single validator decides alone, either way: the trainer's rules (`protocol.verified`,
`protocol.judges`, `node.roles.trainer.judgement`/`settle`/`pick_ready`) on virtual time,
in the run `node.testing.judges_sim` scripts: two honest validators and a liar that fails
every record of one honest worker and passes everything else at once, the changed records
of a cheating worker included.
"""

from __future__ import annotations

from typing import Any

import pytest

from node.roles.trainer import Collector
from node.testing.judges_sim import CHEAT, HONEST, LIAR, A, B, changed, credit, rid_of, run
from protocol.authority import Authority
from protocol.judges import JudgeBook
from protocol.verified import VerifiedRule, Vote


@pytest.fixture(scope="module")
def with_liar() -> dict[str, Any]:
    return run(liar=True)


def test_the_honest_worker_a_liar_fails_keeps_its_credit_and_is_trained(with_liar):
    without = run(liar=False)
    assert credit(with_liar, HONEST) >= 0.9 * credit(without, HONEST) > 0
    mine = [rid for rid in with_liar["mature"] if with_liar["made"][rid][0] == HONEST]
    assert sum(rid in with_liar["trained"] for rid in mine) >= 0.9 * len(mine)


def test_the_liars_instant_passes_train_no_changed_record(with_liar):
    changed_ids = [rid for rid, (p, c) in with_liar["made"].items() if changed(p, c)]
    assert changed_ids and not any(rid in with_liar["trained"] for rid in changed_ids)
    assert with_liar["standing"].state(CHEAT).value == "banned"


def test_the_lying_validator_is_flagged_and_charged_and_the_honest_ones_are_not(with_liar):
    judges: JudgeBook = with_liar["collector"].judges
    assert judges.flagged(LIAR) and not judges.flagged(A) and not judges.flagged(B)
    assert with_liar["charges"].get(LIAR, 0.0) <= -100  # each disagreement, then the flag
    assert with_liar["charges"].get(A, 0.0) == 0 == with_liar["charges"].get(B, 0.0)
    summary = judges.summary()
    liar, honest = summary[LIAR.hex()[-12:]], summary[A.hex()[-12:]]
    assert honest["agreement"] == 1.0 and liar["agreement"] < 0.9


def test_one_validator_still_decides_alone_when_it_is_the_only_one():
    """A run with one validator key has no second opinion: its fail rejects at once."""
    collector = Collector(Authority(validator_keys={A}), VerifiedRule())
    rid = rid_of(HONEST, 0)
    t = collector.track(rid)
    t.producer, t.votes = HONEST, [Vote(A, HONEST, False)]
    assert collector.status(t).value == "rejected"
