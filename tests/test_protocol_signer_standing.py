"""A producer's signer rate scales with its verified standing: passing verdicts of the run's
validators raise what peers admit from it (up to a factor), a failing one takes it back, a
key that may not judge moves nothing, and over the rate a producer is dropped, never charged."""

from __future__ import annotations

import hashlib

from protocol.admission import Deliver, Kind, MessageReceived, Reason
from tests.test_protocol_trust import ALICE, SYBIL, T0, VALIDATOR, header, machine, rollout, verdict

RATE, PER_STEP = 2.0, 5


def _m():  # type: ignore[no-untyped-def]
    return machine(
        signer_rate=RATE,
        signer_burst=RATE,
        standing_passes_per_step=PER_STEP,
        signer_rate_max_factor=3.0,
    )


def _verdicts(a, judge, n: int, passed: bool = True, seq0: int = 1) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        rid = hashlib.sha256(f"{judge.peer_id_b58}{seq0 + i}".encode()).digest()
        acts = a.handle(
            MessageReceived(
                judge.peer_id_b58,
                Kind.VERDICT,
                verdict(judge, rid, ALICE.peer_id, passed, seq=seq0 + i),
                T0 + i / RATE,
            )
        )  # within the validator's own rate
        assert not passed or judge is not VALIDATOR or isinstance(acts[-1], Deliver), acts


def _admitted_in_10_s(a, seq0: int) -> int:  # type: ignore[no-untyped-def]
    """ALICE publishing 8 headers a second for 10 s; how many are admitted."""
    n = 0
    for i in range(80):
        t = T0 + 100 + seq0 + i / 8
        acts = a.handle(
            MessageReceived(
                ALICE.peer_id,
                Kind.ROLLOUT_HEADER,
                header(rollout(ALICE, seq=seq0 + i, seed=seq0 + i, at=t)),
                t,
            )
        )
        if isinstance(acts[-1], Deliver):
            n += 1
        else:
            assert acts[0].reason is Reason.RATE_LIMITED and acts[0].penalty == 0, acts
    return n


def test_passing_verdicts_raise_the_rate_a_failing_one_resets_it() -> None:
    a = _m()
    base = _admitted_in_10_s(a, 1_000)
    assert base <= RATE * 10 + RATE + 1, base
    assert a.signer_rate_factor(ALICE.peer_id) == 1.0
    _verdicts(a, VALIDATOR, 2 * PER_STEP)
    assert a.signer_rate_factor(ALICE.peer_id) == 3.0
    raised = _admitted_in_10_s(a, 2_000)
    assert raised >= 2.5 * base, (base, raised)
    _verdicts(a, VALIDATOR, 1, passed=False, seq0=500)
    assert a.signer_rate_factor(ALICE.peer_id) == 1.0
    assert a.scores.score(ALICE.peer_id_b58, T0 + 200) >= 0  # dropped over its rate, never charged


def test_verdicts_of_a_key_that_may_not_judge_earn_nothing() -> None:
    a = _m()
    _verdicts(a, SYBIL, 4 * PER_STEP)
    assert a.signer_rate_factor(ALICE.peer_id) == 1.0


def test_the_worker_paces_to_what_its_standing_lets_peers_admit() -> None:
    from node.peer.peer import PACE_MARGIN
    from node.roles.inference import pace_for

    a = _m()
    cfg = a.config
    before = pace_for(cfg, a.signer_rate_factor(ALICE.peer_id))
    _verdicts(a, VALIDATOR, PER_STEP)
    after = pace_for(cfg, a.signer_rate_factor(ALICE.peer_id))
    assert before == (PACE_MARGIN * RATE, PACE_MARGIN * RATE)
    assert after == (2 * PACE_MARGIN * RATE, 2 * PACE_MARGIN * RATE)
    # never past what one connection may send
    assert pace_for(cfg, 1e9)[0] == PACE_MARGIN * cfg.sender_rate
