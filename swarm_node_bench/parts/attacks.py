"""The attacks of `bench adversary`, each run by a fresh attacker identity and peer.

`attack(cmd, manifest, data_dir)` opens a new peer (new key, new store) connected to the
honest peers (`cmd["targets"]`), performs attack `cmd["name"]` for about `cmd["seconds"]`, and answers
`{"sent", "attacker", "signers", "measure"}`: how many attack messages went out, the
attacker's peer id, the identities that signed them, and how the driver decides whether
each had an effect at the trainer ("admitted": admitted at all; "verified": counted as
verified work; "usable": verified and not refused by the work ledger; "double": the same
unit of work counted twice; "credit": reward credited beyond the attacker's true rewards;
"ahead": rollouts of versions the trainer has not published, admitted there; "trained":
records of its signers that the trainer trained on). The credit
cases also answer `produced`, `true_sum` and `truth` (counter -> true reward): the counters the
attacker made and their true (re-scored) rewards, for `credit_gain`.
Every loop is bounded in count and time.

The cases of the per-producer window rule and of standing use the stand-in models of
`swarm_node_bench.parts.adv_peer.model_change` (SLIGHT_CHANGE: passes alone, over the producer limit;
FAILING_CHANGE: fails its audit) and publish at `WINDOW_RATE` records a second.

The cases of the second credit round also answer `truth_by_signer` (signer -> counter ->
the true worth of each counter it made: a changed model's record or another producer's
body is worth 0) for `credit_gain`, and `victims`: honest keys this process signs for,
playing a worker the attack is aimed at (their penalties count as an honest worker's):
    minority_change_per_window  WINDOW_OVER - 1 slightly changed records of every window
                                (never a window over): the sequential rule's case
    partial_window_keys         PARTIAL_KEYS keys of PRODUCER_WINDOW - 1 records each,
                                WINDOW_OVER of them changed: a finding about a partial
                                window must reach the trainer
    bound_digest_theft          a thief's header (its own counter and bound seed) names a
                                victim's body digest and reaches the peers first; it serves
                                the body under its own header; every other of its counters
                                is its own honest work
    key_shopping                fresh keys publishing counters while they solve, each
                                abandoned at its first unsolved one (never published)
    delayed_restart_batch       a relay holds a victim's first restart batch (signed
                                RESTART_GAP_S before the second) until the second restart:
                                the victim must not pay for going back twice
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import trio

from node.host.host import HostSettings, MessageTooLarge, PeerError
from node.peer.peer import PeerConfig, open_peer
from node.store.store import RolloutRow
from node.testing.adversary_records import (
    CHANGED_MARK,
    SLIGHT_MARK,
    VERSION,
    honest_record,
    true_reward,
)
from protocol.admission import Admitted, Kind
from protocol.assignment import task_seed
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.identity import Identity, peer_id_from_b58
from protocol.producer_cases import PRODUCER_WINDOW, WINDOW_OVER
from protocol.rollout import make_record, open_record
from protocol.wire import Envelope, RolloutRecord, Verdict

MAX_MESSAGES = 2000
SLIGHT_CHANGE, FAILING_CHANGE = SLIGHT_MARK, CHANGED_MARK
WINDOW_RATE = 12.0  # records a second (the signer quota is 20)
CHEATER_HONEST = 48  # the changed-model cheater's honest records first (its probation: 32)
CHEATER_CHANGED = 128  # then its changed model's, a quarter of them failing alone
CREDIT_RATE = 15.0  # counters a second in the credit cases: under every receiver's signer rate
SERVE_S = 6.0  # a credit attacker serves what it stored this long after its last counter
MINORITY_WINDOWS = 6  # windows of the minority change
PARTIAL_KEYS = 4  # keys of a partial window each
THEFT_COUNTERS = 40  # the thief's counters, every other one a stolen digest
SHOP_KEYS = 150  # fresh keys of the key shopper (about one in four publishes anything)
RESTART_GAP_S = 80.0  # between a victim's two restarts (signed), over the trainer's back window
SERVE_LONG_S = 2 * SERVE_S  # the second round's cases serve longer: pulls come late on a busy host


async def attack(cmd: dict[str, Any], manifest: Any, data_dir: Path) -> dict[str, Any]:
    """Run attack `cmd["name"]` for `cmd["seconds"]` from a fresh identity and peer; returns what it did."""
    name, seconds = cmd["name"], float(cmd.get("seconds", 5.0))
    ident = Identity.generate()
    cfg = PeerConfig(
        manifest=manifest,
        identity=ident,
        data_dir=data_dir / f"attack-{name}-{os.getpid()}",
        roles=("inference",),
        bootstrap=tuple(cmd["targets"]),
        pull_bodies=False,
        policy_version=VERSION,
        host=HostSettings(peer_dead_after_s=6.0),
    )
    seen: list[Admitted] = []
    out: dict[str, Any] = {"sent": 0, "signers": [ident.peer_id_b58], "measure": "admitted"}
    with trio.move_on_after(seconds + 60):
        async with open_peer(cfg) as peer:
            peer.on_deliver(lambda item: seen.append(item) if len(seen) < 4096 else None)
            out["attacker"] = peer.host.peer_id
            await peer.host.wait_for_topic_peers(peer.topics["rollouts"], 1, 5)
            await trio.sleep(1.0)  # one GossipSub heartbeat: join the mesh
            ctx = _Ctx(peer, manifest, ident, seconds, seen, cmd)
            await ATTACKS[name](ctx, out)
            await trio.sleep(1.0)  # let the last messages leave
    return out


@dataclasses.dataclass
class _Ctx:
    peer: Any
    manifest: Any
    ident: Identity
    seconds: float
    seen: list[Admitted]
    cmd: dict[str, Any]
    # Fresh bodies per attack: one attacker process runs every attack, and bodies repeated
    # from an earlier attack are refused as copies before the rule under test is reached.
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(os.urandom(16)))
    counter: int = 0

    def record(self, **kw: Any) -> bytes:
        self.counter += 1
        ident = kw.pop("ident", self.ident)
        return honest_record(
            ident, self.manifest, self.counter, self.peer.seq.next(), rng=self.rng, **kw
        )

    async def publish(self, topic: str, data: bytes, out: dict[str, Any]) -> None:
        try:
            await self.peer.host.publish(self.peer.topics[topic], data)
        except (MessageTooLarge, PeerError):
            pass
        out["sent"] += 1

    async def store_and_publish(self, record: bytes, out: dict[str, Any]) -> bytes:
        """Store our record (so we serve its body) and gossip its header at once."""
        op = open_record(record)
        rec = decode(RolloutRecord, record)
        row = RolloutRow(
            op.rollout_id,
            op.envelope.run_id,
            op.envelope.signer,
            op.envelope.policy_version,
            rec.header,
            rec.body,
            time.time(),
        )
        await trio.to_thread.run_sync(self.peer.store.put_produced, row)
        await self.publish("rollouts", rec.header, out)
        return op.rollout_id


def _header(record: bytes) -> bytes:
    return decode(RolloutRecord, record).header


async def _forged_signature(c: _Ctx, out: dict[str, Any]) -> None:
    for _ in range(20):
        env = decode(Envelope, _header(c.record()))
        bad = dataclasses.replace(env, signature=bytes([env.signature[0] ^ 1]) + env.signature[1:])
        await c.publish("rollouts", encode(bad), out)


async def _other_run(c: _Ctx, out: dict[str, Any]) -> None:
    for _ in range(20):
        await c.publish("rollouts", _header(c.record(run_id="some-other-run")), out)


async def _future_version(c: _Ctx, out: dict[str, Any]) -> None:
    for _ in range(20):
        await c.publish("rollouts", _header(c.record(version=VERSION + 10)), out)


async def _stale(c: _Ctx, out: dict[str, Any]) -> None:
    for _ in range(20):
        await c.publish("rollouts", _header(c.record(version=1)), out)


async def _oversized(c: _Ctx, out: dict[str, Any]) -> None:
    for _ in range(5):
        await c.publish("rollouts", b"\x92" + os.urandom(200_000), out)


async def _malformed(c: _Ctx, out: dict[str, Any]) -> None:
    for i in range(300):
        await c.publish("rollouts", b"\xc1garbage" + i.to_bytes(2, "big"), out)


async def _rate_flood(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "verified"
    deadline = time.monotonic() + c.seconds
    while time.monotonic() < deadline and out["sent"] < MAX_MESSAGES // 2:
        await c.store_and_publish(c.record(lie=True), out)


async def _replayed_header(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "double"
    out["signers"] = []
    deadline = time.monotonic() + c.seconds
    while time.monotonic() < deadline and out["sent"] < MAX_MESSAGES:
        fresh = [i.header for i in c.seen[-8:] if i.kind is Kind.ROLLOUT_HEADER and i.header]
        if not fresh:
            await trio.sleep(0.1)
            continue
        for h in fresh[-2:]:
            await c.publish("rollouts", h, out)
        await trio.sleep(0.05)  # ~40 copies a second


async def _resigned_copy(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "double"
    originals = [c.record() for _ in range(10)]
    for rec in originals:
        await c.store_and_publish(rec, out)
    out["sent"] = 0
    await trio.sleep(1.0)
    for rec in originals:
        op = open_record(rec)
        c.counter += 1
        copy = make_record(
            c.ident,
            op.body,
            dataset=op.header.dataset,
            task_index=c.counter,
            counter=c.counter,
            task_seed=op.header.task_seed,
            reward=op.header.reward,
            run_id=c.manifest.run_id,
            policy_version=VERSION,
            seq=c.peer.seq.next(),
            timestamp_ms=int(time.time() * 1000),
        )
        await c.store_and_publish(copy, out)


async def _counter_shopping(c: _Ctx, out: dict[str, Any]) -> None:
    out.update(measure="usable", produced=0, true_sum=0.0, truth={})
    for _ in range(min(400, int(c.seconds * 40))):
        rec = c.record()
        out["produced"] += 1
        out["true_sum"] += _truth(rec)
        out["truth"][c.counter] = _truth(rec)
        if open_record(rec).header.reward == 1.0:  # publish only what it solved
            await c.store_and_publish(rec, out)


def _truth(record: bytes) -> float:
    return true_reward(open_record(record).body)


async def _claimed_reward_lie(c: _Ctx, out: dict[str, Any]) -> None:
    """Claims reward 1 in every header; stores (so serves) only the bodies that solved."""
    out.update(measure="credit", produced=0, true_sum=0.0, lies=0, truth={})
    for _ in range(max(60, int(c.seconds * 20))):
        rec = c.record(claim=1.0)
        solved = _truth(rec)
        out["produced"] += 1
        out["true_sum"] += solved
        out["truth"][c.counter] = solved
        if solved:
            await c.store_and_publish(rec, out)
        else:
            out["lies"] += 1
            await c.publish("rollouts", _header(rec), out)  # its body is never served
        await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_S)  # serve what it stored while the trainer pulls


async def _shop_versions(c: _Ctx, out: dict[str, Any], versions: list[int]) -> None:
    """Per counter, samples the task under each of `versions` and publishes whichever
    solved it (the first when none did)."""
    out.update(produced=0, true_sum=0.0, shopped=0, lies=0, truth={})
    for _ in range(max(60, int(c.seconds * 20))):
        c.counter += 1
        tries = [
            honest_record(c.ident, c.manifest, c.counter, c.peer.seq.next(), rng=c.rng, version=v)
            for v in versions
        ]
        solved = [_truth(r) for r in tries]
        pick = solved.index(1.0) if 1.0 in solved else 0
        out["produced"] += 1
        out["true_sum"] += solved[0]  # what it earns at the version it holds
        out["truth"][c.counter] = solved[0]
        out["shopped"] += pick > 0
        out["lies"] += pick > 0
        await c.store_and_publish(tries[pick], out)
        await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_S)  # serve what it stored while the trainer pulls


async def _version_shopping(c: _Ctx, out: dict[str, Any]) -> None:
    """Shops V, V+1, V+2 where the trainer has published V."""
    out["measure"] = "ahead"
    await _shop_versions(c, out, [VERSION, VERSION + 1, VERSION + 2])


async def _published_version_shopping(c: _Ctx, out: dict[str, Any]) -> None:
    """Shops V, V-1, V-2: all published, all within the staleness bound."""
    out["measure"] = "credit"
    await _shop_versions(c, out, [VERSION, VERSION - 1, VERSION - 2])


async def _stay_low_version_shopping(c: _Ctx, out: dict[str, Any]) -> None:
    """Holds V-2, V-1 and V (all published, within S) and never goes back: per counter it
    samples the task under its current version and each newer one, publishes the lowest
    that solved it (its current one when none did) and stays there; the true reward is V's."""
    out["measure"] = "credit"
    out.update(produced=0, true_sum=0.0, shopped=0, lies=0, truth={})
    current = VERSION - 2
    for _ in range(max(60, int(c.seconds * 20))):
        c.counter += 1
        versions = list(range(current, VERSION + 1))
        tries = [
            honest_record(c.ident, c.manifest, c.counter, c.peer.seq.next(), rng=c.rng, version=v)
            for v in versions
        ]
        solved = [_truth(r) for r in tries]
        pick = solved.index(1.0) if 1.0 in solved else 0
        current = versions[pick]
        truth = solved[-1]  # what it earns at the newest version it holds
        out["produced"] += 1
        out["true_sum"] += truth
        out["truth"][c.counter] = truth
        out["shopped"] += current < VERSION
        out["lies"] += current < VERSION
        await c.store_and_publish(tries[pick], out)
        await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_S)  # serve what it stored while the trainer pulls


async def _lying_rollouts(c: _Ctx, out: dict[str, Any], n: int) -> list[bytes]:
    return [await c.store_and_publish(c.record(lie=True), out) for _ in range(n)]


async def _self_vouching(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "verified"
    rids = await _lying_rollouts(c, out, 10)
    for rid in rids:
        v = Verdict(
            rollout_id=rid,
            producer=c.ident.peer_id,
            passed=True,
            reason="ok",
            reward_rescored=1.0,
            metrics=(),
        )
        await c.publish("verdicts", c.peer.seal(v), out)


async def _sybil_fails(c: _Ctx, out: dict[str, Any]) -> None:
    sybils = [Identity.generate() for _ in range(5)]
    out["signers"] = [s.peer_id_b58 for s in sybils]
    deadline = time.monotonic() + c.seconds
    done: set[bytes] = set()
    while time.monotonic() < deadline and out["sent"] < MAX_MESSAGES:
        targets = [i for i in c.seen if i.kind is Kind.ROLLOUT_HEADER and i.content_id not in done]
        if not targets:
            await trio.sleep(0.1)
            continue
        for item in targets[:10]:
            done.add(item.content_id)
            for s in sybils:
                v = Verdict(
                    rollout_id=item.content_id,
                    producer=item.envelope.signer,
                    passed=False,
                    reason="bad_proof",
                    reward_rescored=0.0,
                    metrics=(),
                )
                data = seal(
                    s,
                    v,
                    run_id=c.manifest.run_id,
                    policy_version=VERSION,
                    seq=time.time_ns(),
                    timestamp_ms=int(time.time() * 1000),
                )
                await c.publish("verdicts", data, out)


def _publicly_sampled(validator: bytes, rid: bytes, fraction: float) -> bool:
    """The old, public sampling rule a producer could compute: H(validator || rollout id)."""
    return int.from_bytes(content_id(validator + rid)[:8], "big") < fraction * 2.0**64


async def _audit_dodging(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "verified"
    validator = peer_id_from_b58(c.cmd["validator"])
    for _ in range(10):
        for _try in range(64):  # re-sign until the public rule says "not audited"
            rec = c.record(lie=True)
            if not _publicly_sampled(validator, content_id(_header(rec)), 0.5):
                break
        await c.store_and_publish(rec, out)


async def _header_without_body(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "verified"
    for _ in range(30):
        await c.publish("rollouts", _header(c.record()), out)  # the body is never stored


async def _paced(c: _Ctx, out: dict[str, Any], record: bytes, header_only: bool = False) -> str:
    """Publish one record (only its header: its body is never served) at WINDOW_RATE."""
    if header_only:
        await c.publish("rollouts", _header(record), out)
        rid = content_id(_header(record))
    else:
        rid = await c.store_and_publish(record, out)
    await trio.sleep(1.0 / WINDOW_RATE)
    return rid.hex()


async def _window_withheld_body(c: _Ctx, out: dict[str, Any]) -> None:
    """A slightly changed model, WINDOW_OVER - 1 of its records per window, and the body of
    one other record per window withheld, so that the window never fills."""
    out["measure"] = "trained"
    c.counter = PRODUCER_WINDOW - 1  # the next record opens a window
    for _ in range(3 * PRODUCER_WINDOW):
        k = (c.counter + 1) % PRODUCER_WINDOW
        rec = c.record(change=SLIGHT_CHANGE if 1 <= k < WINDOW_OVER else 0.0)
        await _paced(c, out, rec, header_only=k == PRODUCER_WINDOW - 1)


async def _window_many_keys(c: _Ctx, out: dict[str, Any]) -> None:
    """A slightly changed model spread over 6 keys, half a window each: no window fills."""
    out["measure"] = "trained"
    keys = [Identity.generate() for _ in range(6)]
    out["signers"] = [k.peer_id_b58 for k in keys]
    for key in keys:
        c.counter = PRODUCER_WINDOW - 1
        for _ in range(PRODUCER_WINDOW // 2):
            await _paced(c, out, c.record(ident=key, change=SLIGHT_CHANGE))


async def _window_minority_changed(c: _Ctx, out: dict[str, Any]) -> None:
    """A slightly changed model in WINDOW_OVER records of every window, the rest honest:
    the window's median stays honest."""
    out["measure"] = "trained"
    c.counter = PRODUCER_WINDOW - 1
    for _ in range(3 * PRODUCER_WINDOW):
        k = (c.counter + 1) % PRODUCER_WINDOW
        await _paced(
            c, out, c.record(change=SLIGHT_CHANGE if k in (2, 5, 9, 13)[:WINDOW_OVER] else 0.0)
        )


async def _changed_model(c: _Ctx, out: dict[str, Any]) -> None:
    """Honest through its probation, then a changed model whose records fail their audit a
    quarter of the time; `changed_ids` are the changed model's records."""
    out["measure"] = "trained"
    for _ in range(CHEATER_HONEST):
        await _paced(c, out, c.record())
    rng = random.Random(7)
    out["changed_ids"] = [
        await _paced(c, out, c.record(change=FAILING_CHANGE if rng.random() < 0.25 else 0.0))
        for _ in range(CHEATER_CHANGED)
    ]


async def _fresh_identity_flood(c: _Ctx, out: dict[str, Any]) -> None:
    out["measure"] = "verified"
    fresh = [Identity.generate() for _ in range(300)]
    out["signers"] = [f.peer_id_b58 for f in fresh]
    for f in fresh:
        await c.publish("rollouts", _header(c.record(ident=f)), out)


def _changed_window(
    c: _Ctx, out: dict[str, Any], ident: Identity, changed: set[int], n: int
) -> list[tuple[bytes, bool]]:
    """`n` records of `ident` from the next window on, those at window offsets `changed`
    slightly changed; their true worth joins `truth_by_signer`."""
    truth = out["truth_by_signer"].setdefault(ident.peer_id_b58, {})
    c.counter = PRODUCER_WINDOW - 1  # the next record opens a window
    recs = []
    for _ in range(n):
        k = (c.counter + 1) % PRODUCER_WINDOW
        rec = c.record(ident=ident, change=SLIGHT_CHANGE if k in changed else 0.0)
        truth[c.counter] = 0.0 if k in changed else _truth(rec)
        recs.append((rec, k in changed))
    return recs


async def _minority_change_per_window(c: _Ctx, out: dict[str, Any]) -> None:
    """A slightly changed model in WINDOW_OVER - 1 records of every window: no window is
    ever over; the producer's records over the limit, taken together, are."""
    out.update(measure="trained", truth_by_signer={}, changed_ids=[])
    changed = {2, 7, 11}
    assert len(changed) == WINDOW_OVER - 1
    for rec, slight in _changed_window(
        c, out, c.ident, changed, MINORITY_WINDOWS * PRODUCER_WINDOW
    ):
        rid = await _paced(c, out, rec)
        if slight:
            out["changed_ids"].append(rid)
    await trio.sleep(SERVE_LONG_S)


async def _partial_window_keys(c: _Ctx, out: dict[str, Any]) -> None:
    """A slightly changed model over PARTIAL_KEYS keys, PRODUCER_WINDOW - 1 records each
    with WINDOW_OVER changed: no window fills; each is judged when it closes."""
    out.update(measure="trained", truth_by_signer={}, changed_ids=[])
    keys = [Identity.generate() for _ in range(PARTIAL_KEYS)]
    out["signers"] = [k.peer_id_b58 for k in keys]
    changed = {1, 5, 9, 13}
    assert len(changed) == WINDOW_OVER
    for key in keys:
        for rec, slight in _changed_window(c, out, key, changed, PRODUCER_WINDOW - 1):
            rid = await _paced(c, out, rec)
            if slight:
                out["changed_ids"].append(rid)
    await trio.sleep(SERVE_LONG_S)


def _stolen(thief: Identity, counter: int, seq: int, victim_record: bytes, m: Any) -> bytes:
    """The thief's record for its own `counter` (its own bound seed) carrying the victim's
    body: its header names the victim's body digest."""
    op = open_record(victim_record)
    return make_record(
        thief,
        op.body,
        dataset=op.header.dataset,
        task_index=counter,
        counter=counter,
        task_seed=task_seed(m.seed, counter, thief.peer_id),
        reward=op.header.reward,
        run_id=m.run_id,
        policy_version=VERSION,
        seq=seq,
        timestamp_ms=int(time.time() * 1000),
    )


async def _bound_digest_theft(c: _Ctx, out: dict[str, Any]) -> None:
    """Every other counter of the thief names a victim's body digest, its header ahead of
    the victim's (a thief that wins the race); it serves that body under its header."""
    out.update(measure="theft", truth_by_signer={}, stolen=0)
    victim = Identity.generate()
    out["victims"] = [victim.peer_id_b58]
    mine = out["truth_by_signer"].setdefault(c.ident.peer_id_b58, {})
    theirs = out["truth_by_signer"].setdefault(victim.peer_id_b58, {})
    for i in range(THEFT_COUNTERS):
        if i % 2 == 0:  # its own work
            rec = c.record()
            mine[c.counter] = _truth(rec)
            await c.store_and_publish(rec, out)
        else:
            v_counter = len(theirs)
            v_rec = honest_record(victim, c.manifest, v_counter, v_counter + 1, rng=c.rng)
            theirs[v_counter] = _truth(v_rec)
            c.counter += 1
            mine[c.counter] = 0.0  # another's body: worth nothing to the thief
            await c.store_and_publish(
                _stolen(c.ident, c.counter, c.peer.seq.next(), v_rec, c.manifest), out
            )
            out["stolen"] += 1
            await trio.sleep(0.2)  # the victim's own header, just behind the thief's
            await c.store_and_publish(v_rec, out)
        await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_LONG_S)


async def _key_shopping(c: _Ctx, out: dict[str, Any]) -> None:
    """Fresh keys, each publishing its counters while they solve and abandoned at the
    first that does not (never published)."""
    out.update(measure="gain", truth_by_signer={})
    keys = [Identity.generate() for _ in range(SHOP_KEYS)]
    out["signers"] = [k.peer_id_b58 for k in keys]
    for key in keys:
        truth = out["truth_by_signer"].setdefault(key.peer_id_b58, {})
        for counter in range(64):
            rec = honest_record(key, c.manifest, counter, counter + 1, rng=c.rng)
            truth[counter] = _truth(rec)
            if not truth[counter]:
                break  # abandoned: the key never shows what did not solve
            await c.store_and_publish(rec, out)
            await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_LONG_S)


async def _delayed_restart_batch(c: _Ctx, out: dict[str, Any]) -> None:
    """A victim worker: 16 counters at VERSION, a restart batch of 16 at VERSION - 1, 16
    at VERSION, a second restart batch at VERSION - 2 RESTART_GAP_S later, 16 at VERSION.
    This relay passes its messages on at once, except the first restart batch: held
    until the second restart. Signed times are the victim's."""
    out.update(measure="gain", truth_by_signer={}, signers=[])
    victim = Identity.generate()
    out["victims"] = [victim.peer_id_b58]
    truth = out["truth_by_signer"].setdefault(victim.peer_id_b58, {})
    now = time.time()
    plan = [  # (first counter, version, signed seconds before now), in the relay's order
        (0, VERSION, RESTART_GAP_S + 10),  # within admission's clock skew (120 s)
        (32, VERSION, RESTART_GAP_S - 10),
        (16, VERSION - 1, RESTART_GAP_S),  # held by the relay
        (48, VERSION - 2, 0.0),
        (64, VERSION, -1.0),
    ]
    for first, version, ago in plan:
        for counter in range(first, first + PRODUCER_WINDOW):
            rec = honest_record(
                victim,
                c.manifest,
                counter,
                counter + 1,
                rng=c.rng,
                version=version,
                signed_at=now - ago + counter * 0.01,
            )
            truth[counter] = _truth(rec)
            await c.store_and_publish(rec, out)
            await trio.sleep(1.0 / CREDIT_RATE)
    await trio.sleep(SERVE_LONG_S)


ATTACKS = {
    "forged_signature": _forged_signature,
    "other_run": _other_run,
    "future_version": _future_version,
    "stale_beyond_s": _stale,
    "oversized": _oversized,
    "malformed_flood": _malformed,
    "message_rate_flood": _rate_flood,
    "replayed_header": _replayed_header,
    "resigned_copy": _resigned_copy,
    "counter_shopping": _counter_shopping,
    "self_vouching_verdict": _self_vouching,
    "sybil_fail_verdicts": _sybil_fails,
    "sampled_audit_dodging": _audit_dodging,
    "header_without_body": _header_without_body,
    "window_withheld_body": _window_withheld_body,
    "window_many_keys": _window_many_keys,
    "window_minority_changed": _window_minority_changed,
    "changed_model": _changed_model,
    "fresh_identity_flood": _fresh_identity_flood,
    "claimed_reward_lie": _claimed_reward_lie,
    "version_shopping": _version_shopping,
    "published_version_shopping": _published_version_shopping,
    "stay_low_version_shopping": _stay_low_version_shopping,
    "minority_change_per_window": _minority_change_per_window,
    "partial_window_keys": _partial_window_keys,
    "bound_digest_theft": _bound_digest_theft,
    "key_shopping": _key_shopping,
    "delayed_restart_batch": _delayed_restart_batch,
}
