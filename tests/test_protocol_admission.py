"""The admission pipeline: each stage's rejections, scoring and bans, and a fuzz invariant."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.admission import (
    KIND_RULES,
    PENALTIES,
    PIPELINE,
    Admission,
    AdmissionConfig,
    Admitted,
    Ban,
    BodyMissing,
    Deliver,
    Disconnect,
    Forward,
    Kind,
    MessageReceived,
    Misbehaved,
    PeerConnected,
    Penalized,
    Reason,
    Reject,
    RunRules,
    Stage,
    Store,
    StoreFailed,
    Tick,
    Unban,
    VersionChanged,
    verdict_of,
)
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.errors import LocalProtocolError
from protocol.identity import Identity
from protocol.peer_score import PeerScores, ScoreConfig
from protocol.rollout import make_record
from protocol.wire import (
    Envelope,
    RolloutBody,
    RolloutRecord,
    ShardInfo,
    Verdict,
    WeightManifest,
)

ALICE = Identity.from_private_bytes(bytes(range(32)))
BOB = Identity.from_private_bytes(bytes(range(1, 33)))
TRAINER = Identity.from_private_bytes(bytes(range(2, 34)))
RELAY = b"relay-peer"  # an opaque id: admission never looks inside peer ids
RUN = "test-run"
T0 = 1_700_000_000.0  # seconds; envelope timestamps are ms of the same clock
S = 2  # staleness bound


def rules() -> RunRules:
    return RunRules(
        RUN,
        max_staleness=S,
        trainer_keys=frozenset({TRAINER.peer_id}),
        validator_keys=frozenset({BOB.peer_id}),
    )


def body(n: int = 8, seed: int = 0) -> RolloutBody:
    return RolloutBody(
        prompt_ids=tuple(range(n)),
        completion_ids=tuple(range(100, 100 + n)),
        logprobs=(-0.5,) * n,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=n,
        sampling_seed=seed,
        finish_reason="length",
        proofs=(bytes(258),),
    )


def record(
    ident: Identity = ALICE,
    *,
    seq: int = 1,
    version: int = 10,
    run_id: str = RUN,
    at: float = T0,
    seed: int | None = None,
) -> bytes:
    seed = seq if seed is None else seed  # each counter its own work (one body per rollout)
    return make_record(
        ident,
        body(seed=seed),
        dataset="chain_sum",
        task_index=seq,
        counter=seq,
        task_seed=seed,
        reward=1.0,
        run_id=run_id,
        policy_version=version,
        seq=seq,
        timestamp_ms=int(at * 1000),
    )


def header(rec: bytes) -> bytes:
    return decode(RolloutRecord, rec).header


def machine(**cfg) -> Admission:
    return Admission(rules(), AdmissionConfig(**cfg), version=10)


def msg(peer, kind, data, now=T0) -> MessageReceived:
    return MessageReceived(peer, kind, data, now)


def only_reject(actions) -> Reject:
    assert isinstance(actions[0], Reject), actions
    return actions[0]


# -- the happy paths ----------------------------------------------------------------------


def test_gossiped_header_is_stored_forwarded_delivered():
    a = machine()
    h = header(record())
    actions = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h))
    assert [type(x) for x in actions] == [Store, Forward, Deliver]
    item = actions[0].item
    assert isinstance(item, Admitted)
    assert item.content_id == content_id(h)
    assert item.header == h and item.body is None
    assert item.signer == ALICE.peer_id and item.policy_version == 10
    assert a.scores.score(ALICE.peer_id, T0) > 0  # admitted messages earn a little credit


def test_pulled_record_after_its_header_is_stored_not_forwarded():
    a = machine()
    rec = record()
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rec)))[0], Store)
    actions = a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec))
    assert [type(x) for x in actions] == [Store, Deliver]
    item = actions[0].item
    assert item.content_id == content_id(header(rec))  # the rollout id
    assert item.body == decode(RolloutRecord, rec).body
    assert item.obj.body.sampling_seed == 1
    # The header gossiped again after we hold the record is a duplicate.
    r = only_reject(a.handle(msg(BOB.peer_id, Kind.ROLLOUT_HEADER, header(rec))))
    assert r.reason is Reason.DUPLICATE and r.penalty == 0 and r.verdict == "ignore"


def test_verdict_is_admitted():
    a = machine()
    v = Verdict(
        rollout_id=bytes(32),
        producer=ALICE.peer_id,
        passed=False,
        reason="bad_proof",
        reward_rescored=0.0,
        metrics=(),
    )
    data = seal(BOB, v, run_id=RUN, policy_version=10, seq=1, timestamp_ms=int(T0 * 1000))
    actions = a.handle(msg(BOB.peer_id, "verdict", data))
    assert [type(x) for x in actions] == [Store, Forward, Deliver]
    assert actions[0].item.obj == v and actions[0].item.content_id == content_id(data)


def weights(ident: Identity, version: int, seq: int) -> bytes:
    wm = WeightManifest(
        version=version,
        kind="full",
        base_version=0,
        base_digest=b"",
        total_bytes=10,
        file_digest=bytes(32),
        shards=(ShardInfo(index=0, offset=0, size=10, digest=bytes(32)),),
    )
    return seal(ident, wm, run_id=RUN, policy_version=version, seq=seq, timestamp_ms=int(T0 * 1000))


def test_weight_announcements_need_a_trainer_key_and_a_new_version():
    a = machine()
    r = only_reject(a.handle(msg(BOB.peer_id, Kind.WEIGHT_ANNOUNCE, weights(BOB, 11, 1))))
    assert (r.reason, r.stage) == (Reason.UNAUTHORIZED, Stage.CONTEXT)
    assert r.penalty == PENALTIES[Reason.UNAUTHORIZED] < 0
    actions = a.handle(msg(TRAINER.peer_id, Kind.WEIGHT_ANNOUNCE, weights(TRAINER, 11, 1)))
    assert [type(x) for x in actions] == [Forward, Deliver]  # weights are stored elsewhere
    again = a.handle(msg(TRAINER.peer_id, Kind.WEIGHT_ANNOUNCE, weights(TRAINER, 11, 2)))
    assert only_reject(again).reason is Reason.OUTDATED


# -- each stage's rejection ---------------------------------------------------------------


def test_oversized_is_refused_before_decoding():
    a = machine()
    big = b"\x00" * (KIND_RULES[Kind.ROLLOUT_HEADER].max_bytes + 1)
    r = only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, big)))
    assert (r.reason, r.stage, r.penalty) == (Reason.OVERSIZED, Stage.SIZE, -10.0)
    assert r.kind == "rollout_header"


@pytest.mark.parametrize("data", [b"", b"\xc1", b"hello", encode(body())])
def test_malformed_bytes_are_refused_with_the_decoders_penalty(data):
    r = only_reject(machine().handle(msg(RELAY, Kind.ROLLOUT_HEADER, data)))
    assert (r.reason, r.stage) == (Reason.MALFORMED, Stage.DECODE)
    assert r.penalty < 0 and r.detail


def test_unknown_kind():
    r = only_reject(machine().handle(msg(RELAY, "shard_bomb", b"x")))
    assert r.reason is Reason.UNKNOWN_KIND and r.penalty < 0


def test_bad_signature():
    env = decode(Envelope, header(record()))
    forged = encode(dataclasses.replace(env, signature=bytes(64)))
    r = only_reject(machine().handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, forged)))
    assert (r.reason, r.stage, r.penalty) == (Reason.BAD_SIGNATURE, Stage.SIGNATURE, -50.0)


def test_body_that_does_not_match_the_signed_digest():
    rec = decode(RolloutRecord, record())
    other = decode(RolloutRecord, record(seed=7))
    swapped = encode(RolloutRecord(header=rec.header, body=other.body))
    r = only_reject(machine().handle(msg(RELAY, Kind.ROLLOUT_RECORD, swapped)))
    assert (r.reason, r.stage) == (Reason.BODY_MISMATCH, Stage.SIGNATURE)
    assert r.penalty < 0


def test_wrong_run_counts_against_relays_too():
    r = only_reject(
        machine().handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(record(run_id="other"))))
    )
    assert (r.reason, r.stage, r.penalty) == (Reason.WRONG_RUN, Stage.CONTEXT, -5.0)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(0, 40), v=st.integers(0, 40))
def test_staleness_bound(t, v):
    """A rollout of version v is usable at version t iff t - v <= S (and v not too far ahead)."""
    a = machine()
    a.handle(VersionChanged(t, T0))
    actions = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(record(version=v))))
    future = a.config.max_future_versions
    if t - v > S:
        assert only_reject(actions).reason is Reason.STALE
    elif v - t > future:
        assert only_reject(actions).reason is Reason.FUTURE_VERSION
        assert actions[0].penalty == 0  # we may simply be behind
    else:
        assert isinstance(actions[-1], Deliver)


@pytest.mark.parametrize("alice", [ALICE.peer_id, ALICE.peer_id_b58])
def test_stale_rollout_blames_its_producer_not_the_relay(alice):
    a = machine()
    a.handle(VersionChanged(20, T0))
    for relay in (RELAY, BOB.peer_id_b58):
        r = only_reject(a.handle(msg(relay, Kind.ROLLOUT_HEADER, header(record(seq=1)))))
        assert r.reason is Reason.STALE and r.penalty == 0.0
    late = T0 + a.config.stale_grace_s + 1  # signed well after version 20 was out
    own = only_reject(
        a.handle(msg(alice, Kind.ROLLOUT_HEADER, header(record(seq=2, at=late)), now=late))
    )
    assert own.reason is Reason.STALE and own.penalty == PENALTIES[Reason.STALE] < 0


def test_a_rollout_that_went_stale_on_its_way_costs_its_producer_nothing():
    """The trainer moved on while the rollout was generated or in flight: the producer
    could not have known. Only one signed a grace after the version that made it stale
    costs its producer; one we knew stale from the start (older than our first version) too."""
    a = machine()  # at version 10 since before it started
    a.handle(VersionChanged(13, T0))  # version 10 is stale from here on (S = 2)
    grace = a.config.stale_grace_s
    for seq, signed in enumerate([T0 - 5.0, T0 + 1.0, T0 + grace - 1.0], start=1):
        h = header(record(seq=seq, version=10, at=signed))
        r = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, now=T0 + grace)))
        assert (r.reason, r.penalty) == (Reason.STALE, 0.0), seq
    h = header(record(seq=9, version=10, at=T0 + grace + 1.0))
    r = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, now=T0 + grace + 2.0)))
    assert (r.reason, r.penalty) == (Reason.STALE, PENALTIES[Reason.STALE])
    old = header(record(seq=10, version=7, at=T0 + 1.0))  # stale at version 10 already
    r = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, old, now=T0 + 2.0)))
    assert (r.reason, r.penalty) == (Reason.STALE, PENALTIES[Reason.STALE])


def test_a_stale_record_we_pulled_costs_nobody():
    """A body pull or a catch-up answer is bytes we asked for: stale by the time it came,
    it is refused free, whoever serves it (its producer included)."""
    a = machine()
    a.handle(VersionChanged(20, T0))
    late = T0 + a.config.stale_grace_s + 10
    rec = record(seq=3, version=10, at=late)
    for sender in (ALICE.peer_id, RELAY):
        r = only_reject(a.handle(msg(sender, Kind.ROLLOUT_RECORD, rec, now=late)))
        assert (r.reason, r.penalty) == (Reason.STALE, 0.0)
    assert a.scores.score(ALICE.peer_id, late) == 0


@pytest.mark.parametrize("offset_s", [-600.0, 600.0])
def test_clock_skew(offset_s):
    h = header(record(at=T0 + offset_s))
    r = only_reject(machine().handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h)))
    assert (r.reason, r.stage) == (Reason.CLOCK_SKEW, Stage.CONTEXT)


def test_pulled_records_may_be_old():
    """Records pulled from a store are not live gossip: no timestamp skew rule."""
    rec = record(at=T0 - 3600)
    assert isinstance(machine().handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec))[-1], Deliver)


def test_sender_rate_limit_refills_with_time():
    a = machine(sender_rate=1.0, sender_burst=3.0, sender_overrun_rate=1.0)
    hs = [header(record(BOB if i % 2 else ALICE, seq=i)) for i in range(1, 6)]
    results = [a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h, T0)) for h in hs[:4]]
    assert [type(r[-1]) for r in results[:3]] == [Deliver] * 3
    # Over the rate: dropped unopened, free (a busy relay), until the overrun runs out too.
    r = only_reject(results[3])
    assert (r.reason, r.stage, r.penalty) == (Reason.RATE_LIMITED, Stage.RATE, 0.0)
    over = [only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, hs[4], T0))) for _ in range(3)]
    assert [x.penalty for x in over] == [0.0, 0.0, -0.5]
    # One second later one token is back.
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, hs[4], T0 + 1.0))[-1], Deliver)


def test_signer_rate_limit_is_never_charged():
    a = machine(signer_rate=0.001, signer_burst=2.0)
    hs = [header(record(seq=i)) for i in range(1, 5)]
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, hs[0]))[-1], Deliver)
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, hs[1]))[-1], Deliver)
    relayed = only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, hs[2])))
    assert relayed.reason is Reason.RATE_LIMITED and relayed.penalty == 0.0
    direct = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, hs[3])))
    assert direct.reason is Reason.RATE_LIMITED and direct.penalty == 0.0  # a fast producer


def test_reused_sequence_number_is_a_replay():
    a = machine()
    assert isinstance(
        a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, header(record(seq=5))))[-1], Deliver
    )
    other = header(record(seq=5, seed=3))  # different content, same (signer, seq)
    r = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, other)))
    assert (r.reason, r.stage, r.penalty) == (Reason.REPLAY, Stage.REPLAY, -5.0)


def test_earliest_stage_wins():
    """Bytes wrong in several ways are refused by the first stage of the pipeline."""
    a = machine(sender_rate=0.001, sender_burst=1.0)
    a.handle(VersionChanged(30, T0))
    stale = header(record(version=1, run_id="other"))
    r = only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, stale)))
    assert r.reason is Reason.WRONG_RUN  # the run is checked before the version
    # The cheap per-sender limit runs before any decoding or signature check.
    assert PIPELINE.index(Stage.SIZE) < PIPELINE.index(Stage.RATE) < PIPELINE.index(Stage.DECODE)


def test_rule_table_lists_the_stages_of_each_kind():
    assert Stage.REPLAY not in KIND_RULES[Kind.ROLLOUT_RECORD].stages()
    assert Stage.FORWARD not in KIND_RULES[Kind.ROLLOUT_RECORD].stages()
    assert KIND_RULES[Kind.ROLLOUT_HEADER].stages() == PIPELINE
    assert Stage.STORE not in KIND_RULES[Kind.WEIGHT_ANNOUNCE].stages()


# -- scoring and bans ---------------------------------------------------------------------


def test_garbage_gets_a_peer_disconnected_banned_then_unbanned():
    scores = PeerScores(ScoreConfig(ban_threshold=-30.0, ban_base_s=60.0))
    a = Admission(rules(), version=10, scores=scores)
    bad = b"not msgpack at all"
    now = T0
    banned = None
    for i in range(10):
        actions = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, bad, now + i * 0.01))
        assert isinstance(actions[0], Reject) and actions[0].reason is Reason.MALFORMED
        if len(actions) > 1:
            banned = actions
            break
    assert banned is not None, "repeated garbage must end in a ban"
    assert [type(x) for x in banned] == [Reject, Disconnect, Ban]
    ban = banned[2]
    assert ban.peer == RELAY and ban.record.banned_until == ban.until
    t_ban = now + i * 0.01
    assert ban.until == pytest.approx(t_ban + 60.0)
    # Banned: everything from it is refused, connecting again is refused.
    later = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(record()), t_ban + 1))
    assert [type(x) for x in later] == [Reject, Disconnect]
    assert later[0].reason is Reason.BANNED and later[0].stage is Stage.GATE
    assert a.handle(PeerConnected(RELAY, t_ban + 1)) == [Disconnect(RELAY, Reason.BANNED)]
    # Others are unaffected.
    assert isinstance(
        a.handle(msg(BOB.peer_id, Kind.ROLLOUT_HEADER, header(record(BOB)), t_ban + 1))[-1], Deliver
    )
    # When the ban ends, a tick lifts it.
    assert a.handle(Tick(t_ban + 30)) == []
    assert a.handle(Tick(t_ban + 61)) == [Unban(RELAY)]
    assert a.handle(PeerConnected(RELAY, t_ban + 61)) == []


def test_misbehaved_event_from_a_role():
    a = Admission(rules(), scores=PeerScores(ScoreConfig(ban_threshold=-15.0)))
    first = a.handle(Misbehaved(ALICE.peer_id, -10.0, "failed audit: bad_proof", T0))
    assert first == [
        Penalized(ALICE.peer_id, "misbehaved", -10.0, "role", "failed audit: bad_proof")
    ]
    actions = a.handle(Misbehaved(ALICE.peer_id, -10.0, "fraud reproduced", T0, offence="fraud"))
    assert [type(x) for x in actions] == [Penalized, Disconnect, Ban]
    assert (actions[0].reason, actions[0].detail) == ("fraud", "fraud reproduced")
    with pytest.raises(LocalProtocolError):
        a.handle(Misbehaved(BOB.peer_id, -1.0, "?", T0, offence="no_such_offence"))
    with pytest.raises(LocalProtocolError):
        a.handle(Misbehaved(ALICE.peer_id, 5.0, "not a penalty", T0))


def test_store_failed_forgets_the_item_so_a_copy_is_admitted():
    a = machine()
    rec = record()
    first = a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec))
    assert only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec))).reason is Reason.DUPLICATE
    assert a.handle(StoreFailed(first[0].item, T0)) == []
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, rec))[0], Store)


def test_store_failed_header_copy_is_not_a_replay():
    a = machine()
    h = header(record(seq=3))
    first = a.handle(msg(BOB.peer_id, Kind.ROLLOUT_HEADER, h))
    a.handle(StoreFailed(first[0].item, T0))
    again = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, h, T0 + 1))
    assert [type(x) for x in again] == [Store, Forward, Deliver]
    # Only once, and only for those very bytes.
    a.handle(StoreFailed(again[0].item, T0 + 1))
    other = header(record(seq=3, seed=9))
    r = only_reject(a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, other, T0 + 2)))
    assert r.reason is Reason.REPLAY


def test_local_misuse_raises():
    a = machine()
    with pytest.raises(LocalProtocolError):
        a.handle(object())  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        a.handle(Tick(float("nan")))
    with pytest.raises(LocalProtocolError):
        AdmissionConfig(sender_rate=0)
    with pytest.raises(LocalProtocolError):
        RunRules("", 2)


def test_dedup_memory_is_bounded():
    a = machine(
        dedup_entries=3, sender_rate=1e6, sender_burst=1e6, signer_rate=1e6, signer_burst=1e6
    )
    recs = [record(seq=i) for i in range(1, 6)]
    for r in recs:
        assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, r))[-1], Deliver)
    assert len(a.seen.dedup) == 3
    # The oldest was forgotten (a bounded cache), the newest is still a duplicate.
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, recs[0]))[-1], Deliver)
    assert (
        only_reject(a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, recs[-1]))).reason is Reason.DUPLICATE
    )


# -- fuzz: no sequence of inputs crashes the machine, every reject has a reason ------------

_POOL = [(Kind.ROLLOUT_HEADER, header(record(seq=i, version=8 + i % 5))) for i in range(1, 7)]
_POOL += [(Kind.ROLLOUT_RECORD, record(BOB, seq=i, version=9 + i % 3)) for i in range(1, 4)]
_POOL += [
    (Kind.WEIGHT_ANNOUNCE, weights(TRAINER, 11, 1)),
    (Kind.WEIGHT_ANNOUNCE, weights(BOB, 12, 1)),
]
_PEERS = [ALICE.peer_id, BOB.peer_id, RELAY, "str-peer"]


@st.composite
def _message(draw):
    kind, base = draw(st.sampled_from(_POOL))
    if draw(st.integers(0, 9)) == 0:
        kind = draw(st.sampled_from([*Kind, "nonsense"]))
    how = draw(st.sampled_from(["as_is"] * 4 + ["flip", "truncate", "random", "extend"]))
    if how == "flip" and base:
        i = draw(st.integers(0, len(base) - 1))
        base = base[:i] + bytes([base[i] ^ draw(st.integers(1, 255))]) + base[i + 1 :]
    elif how == "truncate":
        base = base[: draw(st.integers(0, len(base)))]
    elif how == "random":
        base = draw(st.binary(max_size=300))
    elif how == "extend":
        base = base + draw(st.binary(min_size=1, max_size=8))
    return kind, base


_events = st.one_of(
    st.builds(
        lambda p, m, dt: ("msg", p, m[0], m[1], dt),
        st.sampled_from(_PEERS),
        _message(),
        st.floats(0, 5),
    ),
    st.builds(lambda v: ("version", v), st.integers(0, 20)),
    st.builds(lambda dt: ("tick", dt), st.floats(0, 5000)),
    st.builds(lambda p: ("connect", p), st.sampled_from(_PEERS)),
)


def _run(events) -> list:
    a = Admission(rules(), version=10, scores=PeerScores(ScoreConfig(ban_threshold=-25.0)))
    now = T0
    out = []
    for ev in events:
        if ev[0] == "msg":
            now += ev[4]
            actions = a.handle(MessageReceived(ev[1], ev[2], ev[3], now))
            if isinstance(actions[0], Reject):
                r = actions[0]
                assert isinstance(r.reason, Reason) and isinstance(r.stage, Stage)
                assert r.penalty <= 0 and r.penalty == r.penalty
                assert all(not isinstance(x, Store | Forward | Deliver) for x in actions)
            else:
                assert isinstance(actions[-1], Deliver)
        elif ev[0] == "version":
            actions = a.handle(VersionChanged(ev[1], now))
        elif ev[0] == "tick":
            now += ev[1]
            actions = a.handle(Tick(now))
        else:
            actions = a.handle(PeerConnected(ev[1], now))
        for i, x in enumerate(actions):
            if isinstance(x, Ban):
                assert actions[i - 1] == Disconnect(x.peer, actions[i - 1].reason)
                assert x.until > now
        out.append(actions)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(_events, max_size=30))
def test_no_sequence_of_events_crashes_and_every_reject_has_a_reason(events):
    first = _run(events)
    assert _run(events) == first  # deterministic: same inputs, same actions


def test_bytes_like_input_and_dedup_expiry():
    a = machine(dedup_ttl_s=60.0)
    h = header(record())
    actions = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, memoryview(h)))
    assert isinstance(actions[-1], Deliver) and actions[-1].item.data == h
    assert only_reject(a.handle(msg(RELAY, "rollout_header", bytearray(h)))).reason is (
        Reason.DUPLICATE
    )
    a.handle(Tick(T0 + 61))
    assert len(a.seen.dedup) == 0


# -- every score change is reported, and each message gets one gossipsub verdict -----------


def test_every_penalty_is_reported_with_its_peer_and_reason():
    """What a role finds (an audit, fraud), a body nobody served and the signer of double
    work relayed by someone else: each charge comes back as an action naming the peer,
    the cost and the reason, so the node logs it and writes it to the ledger."""
    a = machine()
    rec = record(seq=1)
    assert isinstance(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, header(rec)))[-1], Deliver)
    acts = a.handle(BodyMissing(content_id(header(rec)), ALICE.peer_id, RELAY, T0 + 60))
    got = {(x.peer, x.reason) for x in acts if isinstance(x, Penalized)}
    assert got == {(ALICE.peer_id, "body_missing"), (RELAY, "body_missing_relayed")}
    twin = header(record(seq=2, seed=1))  # the same body under another counter
    acts = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, twin, T0 + 61))
    assert acts[0].reason is Reason.DOUBLE_WORK and acts[0].penalty == 0  # the relay: free
    signer = [x for x in acts if isinstance(x, Penalized)]
    assert [(x.peer, x.reason, x.penalty) for x in signer] == [
        (ALICE.peer_id, "double_work", PENALTIES[Reason.DOUBLE_WORK])
    ]


def test_verdict_of_tells_accept_ignore_and_reject_apart():
    a = machine()
    h = header(record(seq=1))
    assert verdict_of(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, h))) == "accept"
    assert verdict_of(a.handle(msg(BOB.peer_id, Kind.ROLLOUT_HEADER, h))) == "ignore"  # a copy
    assert verdict_of(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, b"junk"))) == "reject"
    stale = header(record(seq=2, version=1))  # stale, relayed: our view, not a fault
    assert verdict_of(a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, stale))) == "ignore"
    pulled = a.handle(msg(RELAY, Kind.ROLLOUT_RECORD, record(seq=3)))
    assert [type(x) for x in pulled] == [Store, Deliver] and verdict_of(pulled) == "accept"
    # Double work relayed: the signer pays, the relay may have heard this twin first, so
    # it is ignored (not forwarded, no gossip penalty); handed over by its signer, rejected.
    twin = header(record(seq=4, seed=3))
    acts = a.handle(msg(RELAY, Kind.ROLLOUT_HEADER, twin))
    assert acts[0].reason is Reason.DOUBLE_WORK and verdict_of(acts) == "ignore"
    twin2 = header(record(seq=5, seed=3))
    acts = a.handle(msg(ALICE.peer_id, Kind.ROLLOUT_HEADER, twin2))
    assert acts[0].reason is Reason.DOUBLE_WORK and verdict_of(acts) == "reject"
    assert verdict_of([]) == "ignore"
