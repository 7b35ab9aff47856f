"""The sans-IO shard scheduler, driven with explicit times; and manifest admission."""

from __future__ import annotations

import pytest

from protocol.admission import Admission, Kind, MessageReceived, Reason, Reject, RunRules
from protocol.envelope import seal
from protocol.errors import LocalProtocolError
from protocol.identity import Identity
from protocol.shard_schedule import Cancel, DropPeer, Request, ScheduleConfig, ShardScheduler
from protocol.wire import ShardInfo, WeightManifest

M = b"m" * 32
N = b"n" * 32
MiB = 1024 * 1024


def sched(**kw) -> ShardScheduler:
    return ShardScheduler(ScheduleConfig(**kw), salt=b"t")


def requests(actions):
    return [(a.peer, a.index) for a in actions if isinstance(a, Request)]


def test_rarest_first():
    s = sched(per_peer=1, total=1)
    s.want(M, [MiB] * 3)
    s.on_have("a", M, {0, 1, 2}, 0.0)
    s.on_have("b", M, {0, 1}, 0.0)
    s.on_have("c", M, {0}, 0.0)
    assert requests(s.next_requests(0.0)) == [("a", 2)]  # held by one peer only


def test_bounds_per_peer_and_total():
    s = sched(per_peer=2, total=3)
    s.want(M, [MiB] * 10)
    for p in "ab":
        s.on_have(p, M, range(10), 0.0)
    got = requests(s.next_requests(0.0))
    assert len(got) == 3
    assert max(sum(1 for p, _ in got if p == x) for x in "ab") == 2
    assert s.next_requests(0.0) == []  # nothing more while all slots are busy
    s.on_done(got[0][0], M, got[0][1], 1.0)
    assert len(s.next_requests(1.0)) == 1


def test_multi_source_and_throughput_preference():
    s = sched(per_peer=1, total=4)
    s.want(M, [MiB] * 6)
    s.on_have("fast", M, range(6), 0.0)
    s.on_have("slow", M, range(6), 0.0)
    first = requests(s.next_requests(0.0))
    assert {p for p, _ in first} == {"fast", "slow"}  # two sources at once
    by_peer = dict(first)
    s.on_done("fast", M, by_peer["fast"], 0.1)  # 10 MiB/s
    s.on_done("slow", M, by_peer["slow"], 2.0)  # 0.5 MiB/s
    assert s.rate("fast") > s.rate("slow")
    nxt = requests(s.next_requests(2.0))
    assert nxt[0][0] == "fast"  # the measured-faster peer is asked first


def test_endgame_duplicates_then_cancels():
    s = sched(per_peer=2, total=8, endgame_copies=2)
    s.want(M, [MiB])
    s.on_have("a", M, {0}, 0.0)
    assert requests(s.next_requests(0.0)) == [("a", 0)]
    s.on_have("b", M, {0}, 0.5)
    assert requests(s.next_requests(0.5)) == [("b", 0)]  # endgame copy
    assert s.next_requests(0.6) == []  # at most 2 copies
    out = s.on_done("b", M, 0, 1.0)
    assert out == [Cancel("a", M, 0, "endgame: a copy arrived")]
    assert s.complete(M)


def test_no_endgame_while_shards_wait():
    s = sched(per_peer=1, total=8)
    s.want(M, [MiB] * 3)
    s.on_have("a", M, {0, 1, 2}, 0.0)
    assert len(s.next_requests(0.0)) == 1
    assert s.next_requests(0.0) == []


def test_stalled_peer_dropped_and_shard_re_requested():
    s = sched(per_peer=1, total=2, stall_s=5.0, min_rate_bytes_s=MiB, drop_s=30.0)
    s.want(M, [MiB] * 2)
    s.on_have("a", M, {0, 1}, 0.0)
    s.on_have("b", M, {0, 1}, 0.0)
    first = dict((i, p) for p, i in requests(s.next_requests(0.0)))
    assert s.tick(5.9) == []  # deadline 0 + 5 + 1 s
    out = s.tick(6.0)
    drops = [a for a in out if isinstance(a, DropPeer)]
    assert {d.peer for d in drops} == {"a", "b"}
    assert all(d.until == 36.0 for d in drops)
    assert s.next_requests(6.0) == []  # both dropped
    s.on_have("c", M, {0, 1}, 7.0)
    again = requests(s.next_requests(7.0))
    assert len(again) == 1 and again[0][0] == "c"  # c has one slot
    assert first  # both shards had been requested before the stall
    assert len(requests(s.next_requests(40.0))) >= 1  # drop ended: a and b usable again


def test_bad_shard_goes_elsewhere():
    s = sched(per_peer=1, total=1)
    s.want(M, [MiB])
    s.on_have("liar", M, {0}, 0.0)
    s.on_have("honest", M, {0}, 0.0)
    ((peer, _),) = requests(s.next_requests(0.0))
    out = s.on_bad(peer, M, 0, 1.0)
    assert isinstance(out[0], DropPeer) and out[0].peer == peer
    other = "honest" if peer == "liar" else "liar"
    assert requests(s.next_requests(1.0)) == [(other, 0)]
    s.on_done(other, M, 0, 2.0)
    assert s.complete(M)


def test_missing_answer_updates_have_map_without_blame():
    s = sched(per_peer=1, total=1)
    s.want(M, [MiB])
    s.on_have("a", M, {0}, 0.0)
    s.next_requests(0.0)
    s.on_missing("a", M, 0, 1.0)
    assert s.next_requests(1.0) == []  # a no longer claims it
    s.on_have("a", M, {0}, 4.0)  # its keepalive offers it again
    assert requests(s.next_requests(4.0)) == [("a", 0)]


def test_a_busy_peer_is_left_alone_until_its_keepalive_and_a_not_held_one_is_not():
    from protocol.shard_schedule import HAVE_KEEPALIVE_S

    s = sched(per_peer=1, total=4)
    s.want(M, [MiB] * 3)
    s.on_have("a", M, {0, 1, 2}, 0.0)
    ((_, i),) = requests(s.next_requests(0.0))
    s.on_busy("a", M, i, 1.0)
    assert s.next_requests(1.0) == []  # not asked for its other shards either
    assert s.next_requests(1.0 + HAVE_KEEPALIVE_S - 0.01) == []
    assert requests(s.next_requests(1.0 + HAVE_KEEPALIVE_S)) == [("a", i)]  # still held
    # "Not held" is no busy peer: it is asked for its other shards at once.
    g = sched(per_peer=1, total=4)
    g.want(M, [MiB] * 3)
    g.on_have("a", M, {0, 1, 2}, 0.0)
    ((_, i),) = requests(g.next_requests(0.0))
    g.on_missing("a", M, i, 1.0)
    assert len(requests(g.next_requests(1.0))) == 1


def test_no_endgame_while_a_shard_waits_for_a_busy_holder():
    s = sched(per_peer=1, total=8, endgame_copies=2)
    s.want(M, [MiB] * 2)
    s.on_have("a", M, {0}, 0.0)
    s.on_have("c", M, {1}, 0.0)
    assert sorted(requests(s.next_requests(0.0))) == [("a", 0), ("c", 1)]
    s.on_busy("c", M, 1, 0.5)  # c is busy: shard 1 waits for it
    s.on_have("b", M, {0}, 0.6)
    assert s.next_requests(0.6) == []  # shard 0 is not duplicated onto the idle holder
    s.on_have("c", M, {1}, 3.5)  # c's keepalive: every missing shard in flight, endgame
    assert sorted(requests(s.next_requests(3.5))) == [("b", 0), ("c", 1)]


def test_failed_transfer_and_peer_gone():
    s = sched(per_peer=1, total=2)
    s.want(M, [MiB] * 2)
    s.want(N, [MiB], have=[0])
    assert s.complete(N)
    s.on_have("a", M, {0, 1}, 0.0)
    s.on_have("b", M, {0, 1}, 0.0)
    got = requests(s.next_requests(0.0))
    s.on_peer_gone("a", 1.0)
    s.on_failed("b", M, dict((p, i) for p, i in got)["b"], 1.0)
    assert s.next_requests(1.0) == []  # a gone, b dropped
    assert s.progress()["shards_missing"] == 2 and s.progress()["in_flight"] == 0
    assert s.forget(M) == [] and not s.complete(M)


def test_have_already_and_progress():
    s = sched()
    s.want(M, [10, 20, 30], have=[1])
    assert s.missing(M) == {0, 2}
    assert s.progress()["bytes_done"] == 20 and s.progress()["bytes_total"] == 60


def test_config_is_checked():
    with pytest.raises(LocalProtocolError):
        ScheduleConfig(per_peer=0)
    with pytest.raises(LocalProtocolError):
        ScheduleConfig(stall_s=float("nan"))


# ------------------------------------------------------------------ manifest admission

TRAINER = Identity.generate()
MALLORY = Identity.generate()


def manifest(version: int) -> WeightManifest:
    return WeightManifest(
        version=version,
        kind="full",
        base_version=version,
        base_digest=b"",
        total_bytes=10,
        file_digest=b"d" * 32,
        shards=(ShardInfo(index=0, offset=0, size=10, digest=b"s" * 32),),
    )


def sealed(who: Identity, version: int, seq: int = 1) -> bytes:
    return seal(who, manifest(version), run_id="r", policy_version=version, seq=seq, timestamp_ms=0)


def test_pulled_manifest_from_non_trainer_is_unauthorized_and_scored():
    a = Admission(RunRules("r", 2, frozenset({TRAINER.peer_id})), version=5)
    out = a.handle(MessageReceived(MALLORY.peer_id, Kind.WEIGHT_MANIFEST, sealed(MALLORY, 3), 0.0))
    rej = [x for x in out if isinstance(x, Reject)]
    assert rej and rej[0].reason is Reason.UNAUTHORIZED and rej[0].penalty < 0
    assert a.scores.score(MALLORY.peer_id, 0.0) < 0


def test_pulled_manifest_of_an_older_version_is_admitted():
    a = Admission(RunRules("r", 2, frozenset({TRAINER.peer_id})), version=5)
    out = a.handle(MessageReceived("relay", Kind.WEIGHT_MANIFEST, sealed(TRAINER, 3), 0.0))
    assert not any(isinstance(x, Reject) for x in out)
    # gossip of an old version is still OUTDATED
    out = a.handle(MessageReceived("relay", Kind.WEIGHT_ANNOUNCE, sealed(TRAINER, 4, 2), 0.0))
    assert [x.reason for x in out if isinstance(x, Reject)] == [Reason.OUTDATED]


def test_broken_transfer_backs_off_briefly_a_liar_for_long():
    # A reset or a timeout is no evidence of lying (a busy honest peer, a lost
    # connection): the peer is asked again after `fail_backoff_s`, not `drop_s`.
    s = sched(per_peer=1, total=1, fail_backoff_s=2.0, drop_s=30.0, bad_drop_s=600.0)
    s.want(M, [MiB] * 2)
    s.on_have("a", M, {0, 1}, 0.0)
    ((_, i),) = requests(s.next_requests(0.0))
    (drop, *_) = s.on_failed("a", M, i, 1.0)
    assert isinstance(drop, DropPeer) and drop.until == 3.0
    assert s.next_requests(2.9) == []
    ((_, j),) = requests(s.next_requests(3.0))
    (bad, *_) = s.on_bad("a", M, j, 4.0)
    assert bad.until == 604.0
    assert s.next_requests(100.0) == []


def test_failure_of_a_request_no_longer_in_flight_blames_nobody():
    # The scheduler cancelled it (endgame, forget, peer gone): the task that ran it
    # reports an error when it is torn down; that is not the peer's fault.
    s = sched(per_peer=1, total=1)
    s.want(M, [MiB])
    s.on_have("a", M, {0}, 0.0)
    ((_, i),) = requests(s.next_requests(0.0))
    s.on_peer_gone("a", 1.0)
    assert s.on_failed("a", M, i, 1.1) == []
    s.on_have("a", M, {0}, 2.0)
    assert requests(s.next_requests(2.0)) == [("a", 0)]


def test_peer_gone_cancels_its_requests():
    s = sched(per_peer=2, total=2)
    s.want(M, [MiB] * 2)
    s.on_have("a", M, {0, 1}, 0.0)
    got = requests(s.next_requests(0.0))
    out = s.on_peer_gone("a", 1.0)
    assert sorted((c.peer, c.index) for c in out if isinstance(c, Cancel)) == sorted(got)
    assert s.progress()["in_flight"] == 0


def test_a_seeder_sends_every_shard_once_before_any_twice():
    from protocol.shard_schedule import first_copies_first

    served: dict[int, int] = {}
    assert first_copies_first(served, 3, 0)
    served[0] = 1
    assert not first_copies_first(served, 3, 0)  # 1 and 2 have not gone out yet
    assert first_copies_first(served, 3, 1)
    served[1] = served[2] = 1
    assert first_copies_first(served, 3, 0)  # every shard went out once: copies again


def test_a_busy_server_declines_past_its_queue_limit() -> None:
    from protocol.shard_schedule import UPLOAD_MAX_WAIT_S, upload_busy

    rate = 10 * MiB
    assert not upload_busy(0, rate)  # an idle server always takes a request
    assert not upload_busy(UPLOAD_MAX_WAIT_S * rate, rate)
    assert upload_busy(UPLOAD_MAX_WAIT_S * rate + 1, rate)
    assert upload_busy(64 * MiB, rate)  # one 64 MiB shard queued: 6.4 s of uplink


def test_next_upload_is_shortest_remaining_first_unless_a_chunk_waited_too_long() -> None:
    from protocol.shard_schedule import UPLOAD_MAX_WAIT_S, next_upload

    waiting = [(0.0, 4 << 20), (0.1, 1 << 20), (0.2, 1 << 20), (0.3, 3 << 20)]
    assert next_upload(waiting, now=1.0) == 1  # fewest bytes left; the earlier of a tie
    assert next_upload(waiting, now=UPLOAD_MAX_WAIT_S) == 0  # waited its limit: goes first
    assert next_upload([(5.0, 9), (1.0, 9)], now=5.5) == 1  # tie on bytes left: the older
    with pytest.raises(LocalProtocolError):
        next_upload([], now=0.0)
