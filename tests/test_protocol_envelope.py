"""Signed envelopes and rollout records: signatures, tamper detection, replay, fuzzing."""

from __future__ import annotations

import io
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.envelope import ReplayGuard, open_envelope, seal, signing_bytes
from protocol.errors import (
    DecodeError,
    IntegrityError,
    RemoteProtocolError,
    ReplayError,
    SignatureError,
)
from protocol.fuzz import fuzz_record
from protocol.identity import Identity, peer_id_from_b58, peer_id_to_b58, verify_signature
from protocol.rollout import make_record, open_record, read_records, write_records
from protocol.wire import SIGNED_KINDS, Envelope, PeerHello, RolloutHeader, Verdict
from swarm_node_bench.codec import typical_body
from tests.wire_strategies import for_class

ALICE = Identity.from_private_bytes(bytes(range(32)))
STAMP = dict(run_id="test-run", policy_version=4, seq=9, timestamp_ms=1_000_000)


def _hello() -> PeerHello:
    return PeerHello(
        roles=("inference",), policy_version=4, listen_addrs=("/ip4/127.0.0.1/tcp/1",), agent="t"
    )


def _record(seed: int = 0) -> bytes:
    body = typical_body(random.Random(seed))
    return make_record(
        ALICE, body, dataset="chain_sum", task_index=1, counter=2, task_seed=3, reward=0.5, **STAMP
    )


def test_peer_id_matches_libp2p():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    pair = create_new_key_pair(ALICE.private_bytes())
    assert ID.from_pubkey(pair.public_key).to_bytes() == ALICE.peer_id
    assert ALICE.peer_id_b58.startswith("12D3KooW")
    assert peer_id_from_b58(peer_id_to_b58(ALICE.peer_id)) == ALICE.peer_id


@pytest.mark.parametrize("kind", sorted(SIGNED_KINDS))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_seal_open_round_trip(kind, data):
    cls = SIGNED_KINDS[kind]
    obj = data.draw(for_class(cls))
    sealed = seal(ALICE, obj, **STAMP)
    env, back = open_envelope(sealed, cls)
    assert back == obj
    assert env.signer == ALICE.peer_id and env.seq == 9 and env.run_id == "test-run"


def test_every_flipped_bit_of_an_envelope_fails():
    sealed = seal(ALICE, _hello(), **STAMP)
    for i in range(len(sealed) * 8):
        tampered = bytearray(sealed)
        tampered[i // 8] ^= 1 << (i % 8)
        with pytest.raises(RemoteProtocolError):
            open_envelope(bytes(tampered), PeerHello)


def test_signature_of_another_kind_does_not_transfer():
    sealed = seal(ALICE, _hello(), **STAMP)
    env = decode(Envelope, sealed)
    forged = Envelope(**{**{n: getattr(env, n) for n, _ in env.wire_fields()}, "kind": "verdict"})
    with pytest.raises(DecodeError, match="expected 'peer_hello'"):
        open_envelope(encode(forged), PeerHello)
    with pytest.raises(RemoteProtocolError):
        open_envelope(encode(forged), Verdict)


def test_resigned_by_someone_else_is_a_different_signer():
    mallory = Identity.generate()
    env = decode(Envelope, seal(ALICE, _hello(), **STAMP))
    claimed = Envelope(
        **{**{n: getattr(env, n) for n, _ in env.wire_fields()}, "signer": mallory.peer_id}
    )
    with pytest.raises(SignatureError):
        open_envelope(encode(claimed), PeerHello)
    assert not verify_signature(ALICE.peer_id, signing_bytes(env), mallory.sign(signing_bytes(env)))


def test_record_round_trip_and_id():
    record = _record()
    opened = open_record(record)
    assert opened.header.n_completion == len(opened.body.completion_ids) == 416
    assert opened.envelope.signer == ALICE.peer_id
    assert len(opened.rollout_id) == 32
    assert open_record(_record(1)).rollout_id != opened.rollout_id


def test_flipped_bits_in_a_record_fail():
    record = _record()
    rng = random.Random(5)
    positions = list(range(0, 400 * 8)) + [rng.randrange(len(record) * 8) for _ in range(3000)]
    for i in positions:
        tampered = bytearray(record)
        tampered[i // 8] ^= 1 << (i % 8)
        with pytest.raises(RemoteProtocolError):
            open_record(bytes(tampered))


def test_swapped_body_fails_integrity():
    a, b = decode_record_parts(_record(0)), decode_record_parts(_record(1))
    from protocol.wire import RolloutRecord

    mixed = encode(RolloutRecord(header=a.header, body=b.body))
    with pytest.raises(IntegrityError):
        open_record(mixed)


def decode_record_parts(data: bytes):
    from protocol.wire import RolloutRecord

    return decode(RolloutRecord, data)


def test_record_fuzz_small():
    report = fuzz_record(_record(), 3000, seed=7)
    assert report.failures == 0, report.examples


def test_record_stream_round_trip_and_garbage():
    records = [_record(i) for i in range(3)]
    buf = io.BytesIO()
    assert write_records(buf, records) == 3
    buf.seek(0)
    assert list(read_records(buf)) == records
    with pytest.raises(DecodeError, match="item 1"):
        list(read_records(io.BytesIO(buf.getvalue()[: len(records[0]) + 20] + b"\x93\x01\x02\x03")))


def _env(seq: int, ts: int = 1_000_000, run: str = "test-run", who: Identity = ALICE) -> Envelope:
    return decode(
        Envelope,
        seal(who, _hello(), run_id=run, policy_version=1, seq=seq, timestamp_ms=ts),
    )


def test_replay_guard_rules():
    guard = ReplayGuard("test-run", max_skew_ms=1000, window=4)
    now = 1_000_000
    guard.check(_env(5), now)
    guard.check(_env(3), now)  # out of order within the window is fine
    with pytest.raises(ReplayError, match="already used"):
        guard.check(_env(5), now)
    guard.check(_env(10), now)
    with pytest.raises(ReplayError, match="too old"):
        guard.check(_env(6), now)  # 6 <= 10 - 4
    with pytest.raises(ReplayError, match="run"):
        guard.check(_env(11, run="other-run"), now)
    with pytest.raises(ReplayError, match="outside"):
        guard.check(_env(12, ts=now + 5000), now)
    guard.check(_env(5, who=Identity.generate()), now)  # per-signer sequences


def test_replay_guard_keeps_one_sequence_space_per_kind_and_may_only_check():
    guard = ReplayGuard("test-run", window=4)
    now = 1_000_000
    hello = _env(10**12)
    guard.check(hello, now)
    v = Verdict(
        rollout_id=bytes(32),
        producer=ALICE.peer_id,
        passed=True,
        reason="ok",
        reward_rescored=1.0,
        metrics=(),
    )
    low = decode(
        Envelope, seal(ALICE, v, run_id="test-run", policy_version=1, seq=3, timestamp_ms=now)
    )
    guard.check(low, now, remember=False)  # far below the hello's seq: another space
    guard.check(low, now, remember=False)  # only checked: nothing remembered
    guard.remember(low)
    with pytest.raises(ReplayError, match="already used"):
        guard.check(low, now)
    with pytest.raises(ReplayError, match="already used"):
        guard.check(hello, now)


def test_replay_guard_memory_is_bounded():
    guard = ReplayGuard("test-run", window=8, max_signers=3)
    env = _env(0)
    for seq in range(1000):
        guard.check(
            Envelope(**{**{n: getattr(env, n) for n, _ in env.wire_fields()}, "seq": seq}),
            1_000_000,
        )
    assert max(guard.held()) <= 16
    for _ in range(5):
        guard.check(_env(1, who=Identity.generate()), 1_000_000)
    assert len(guard.held()) == 3


def test_header_only_checks():
    from protocol.rollout import open_header

    rec = decode_record_parts(_record())
    env, header, rid = open_header(rec.header)
    assert isinstance(header, RolloutHeader) and header.dataset == "chain_sum"
