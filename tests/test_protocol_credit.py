"""Credit rules: work is bound to the key that made it, and arrival order never moves
credit or blame from one producer to another."""

from __future__ import annotations

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
from protocol.identity import Identity
from protocol.rollout import make_record
from protocol.wire import RolloutRecord
from tests.test_protocol_admission import ALICE, BOB, RELAY, RUN, T0, body

RUN_SEED = 7
THIEF = BOB


def machine() -> Admission:
    return Admission(RunRules(RUN, max_staleness=2, run_seed=RUN_SEED), AdmissionConfig(), version=10)


def bound_record(producer: Identity, counter: int, *, signer: Identity | None = None, seq: int = 1) -> bytes:
    """A record of `producer`'s work (its seed), signed by `signer` (default: the producer)."""
    seed = task_seed(RUN_SEED, 10, counter, producer.peer_id)
    return make_record(
        signer or producer, body(seed=seed), dataset="chain_sum", task_index=counter,
        counter=counter, task_seed=seed, reward=1.0, run_id=RUN, policy_version=10,
        seq=seq, timestamp_ms=int(T0 * 1000),
    )  # fmt: skip


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


def test_a_re_signed_record_pulled_from_a_relay_blames_the_thief_and_the_relay_not_the_producer() -> None:
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
