"""One peer process of `bench adversary`: trainer, validator, honest worker or attacker.

The full peer (`node.peer.peer.open_peer`: py-libp2p, admission, SQLite) with synthetic signed
records instead of model output. What stands in for the model (said plainly, because the
benchmark measures the network's rules, not the audit): a record's true reward is
`true_reward(body)` (1.0 for about 23% of bodies, by their digest, else 0.0); honest
workers claim it, and the validator's "audit" re-scores it and fails any record whose
claim differs. What model made a record stands in its first log-prob (`model_change`):
a changed model's record fails its audit, a slightly changed one passes alone but its
statistic is over the producer limit. Sampling (at the default `audit_fraction`, with
probation), verdicts, authority, accounting, standing, the window rule and every
admission rule are the real ones (`protocol.*`, `verify.producer.ProducerTally`,
`node.roles.trainer.Collector`, `pick_ready` and `judged`); the trainer "trains" (counts) what
`pick_ready` hands it and its re-score (`true_reward`) accepts. The trainer credits each body it
holds at `true_reward` and charges `false_claim` for a header that claimed otherwise
(`protocol.credit`); its admission
refuses versions above its own (`publishes_versions`), and its body pull window is
`CREDIT_WINDOW_S` so that headers whose bodies never come are settled as skipped within a run.

Start-up prints `{"peer_id", "addrs"}`; then one JSON command per stdin line, one JSON
answer per line:
    {"cmd": "produce", "rate": R}      worker: honest records at R/s until "stop"
    {"cmd": "stop"}
    {"cmd": "report", "ids": [...]}    trainer/validator: what it counted, scores of `ids`
    {"cmd": "probe", "ids": [...]}     any role: RSS now, connections, scores/banned of `ids`
                                        (and, at the trainer, admitted messages per signer)
    {"cmd": "attack", "name": N, "seconds": S, "targets": [ADDR...], "validator": ID}
                                        attacker: run attack N with a fresh identity
    {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import sys
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import trio

from node.host.host import HostSettings
from node.peer.peer import PeerConfig, open_peer
from node.roles import ValidatorConfig
from node.roles.rollout_fates import Fates
from node.roles.trainer import Collector, judged, pick_ready
from node.testing.adversary_records import (
    VERSION,
    honest_record,
    manifest,
    model_change,
    true_reward,
)
from node.testing.peer_process import json_lines, reply
from protocol import penalties
from protocol.accounting import WorkLedger
from protocol.admission import AdmissionConfig, Admitted, Kind
from protocol.audit_sample import sample_ticket, sampled, window_ticket
from protocol.body_pull import PullConfig
from protocol.credit import STALE_AFTER_S, CreditBook
from protocol.identity import Identity, peer_id_from_b58, peer_id_to_b58
from protocol.producer_cases import PRODUCER_PENALTY
from protocol.rollout import open_record
from protocol.standing import HOLD_S, HeldPasses, StandingBook, State, cleared_passes
from protocol.verified import Status, VerifiedRule
from protocol.wire import Metric, ProducerClaim, Verdict
from swarm_node_bench.parts.attacks import attack
from verify.producer import CLOSE_AFTER_S, STAT, ProducerTally

AUDIT_FRACTION = ValidatorConfig.audit_fraction  # the node's default (`--audit-fraction`)
WINDOW_FRACTION = ValidatorConfig.producer_window_fraction
STAT_LIMIT = 1e-6  # the producer limit; honest records' statistic HONEST_STAT, slight SLIGHT_STAT
HONEST_STAT, SLIGHT_STAT = 1e-7, 5e-6


CREDIT_WINDOW_S = 12.0  # the trainer's body pull window: a header unserved this long is skipped
# The trainer's free go-back window (`protocol.credit`, 600 s in a run): short enough that
# two restarts signed `attacks.RESTART_GAP_S` apart fall in windows of their own.
BACK_WINDOW_S = 40.0
MAX_CHARGES = 100_000  # score changes below zero remembered per process


class _Charges:
    """Every score change below zero this peer's admission made, per peer id (base58):
    the bench's `honest_penalty`. Wraps the one method every change goes through."""

    def __init__(self, scores: Any) -> None:
        self.log: dict[str, list[tuple[float, float]]] = {}
        self.count = 0
        adjust = scores.adjust

        def recording(peer: Any, delta: float, now: float) -> Any:
            if delta < 0 and self.count < MAX_CHARGES:
                self.count += 1
                self.log.setdefault(_b58(peer), []).append((now, delta))
            return adjust(peer, delta, now)

        scores.adjust = recording

    def of(self, ids: list[str]) -> dict[str, list[tuple[float, float]]]:
        """The charges of `ids`."""
        return {p: self.log.get(p, []) for p in ids}


def _b58(peer: Any) -> str:
    if isinstance(peer, (bytes, bytearray)):
        try:
            return peer_id_to_b58(bytes(peer))
        except Exception:  # noqa: BLE001 - an opaque id that is no peer id
            return bytes(peer).hex()
    return str(peer)


class _Counting:
    """The trainer's view: the real Collector plus when each rollout was made, and the
    trainer's standing rule picking what trains (`train_loop`)."""

    def __init__(self, peer: Any, hold_s: float = HOLD_S) -> None:
        self.peer = peer
        self.collector = Collector(
            peer.admission.authority,
            VerifiedRule(quorum=1),
            WorkLedger(),
            pull_window_s=CREDIT_WINDOW_S,
        )
        self.made: dict[
            bytes, tuple[str, float, int, bytes]
        ] = {}  # rid -> producer, t, counter, digest
        self.admitted_by_signer: Counter[str] = Counter()
        self.standing = StandingBook(hold_s=hold_s)
        self.waiting: OrderedDict[bytes, tuple[Any, float]] = OrderedDict()
        self.trained: dict[str, list[str]] = {}  # producer -> rollout ids trained on
        self.admitted_ahead: Counter[str] = Counter()  # rollouts of versions above ours
        self.collector.credit = CreditBook(
            pull_window_s=CREDIT_WINDOW_S, back_window_s=BACK_WINDOW_S
        )
        # Everyone runs VERSION from the start: it was published long enough ago that
        # claims of older versions are stale (`protocol.credit`).
        self.collector.on_published(VERSION, time.time() - STALE_AFTER_S)

    async def train_loop(self) -> None:
        while True:
            ready, _unaudited = pick_ready(
                self.collector, self.standing, self.waiting, VERSION, 2, time.time(), Fates()
            )
            for ro in ready:
                if ro.header.reward == true_reward(ro.body):  # the trainer's re-score
                    self.trained.setdefault(peer_id_to_b58(ro.envelope.signer), []).append(
                        ro.rollout_id.hex()
                    )
            await trio.sleep(0.5)

    def on_deliver(self, item: Admitted) -> None:
        signer = peer_id_to_b58(item.envelope.signer)
        self.admitted_by_signer[signer] += 1
        for bad in self.collector.on_deliver(item):
            self.peer.report(bad, -20.0, "withheld assignment counters")
        for bad in self.collector.take_went_back():
            self.peer.report(
                bad,
                penalties.OUT_OF_ORDER.cost,
                "went back to an older version again",
                penalties.OUT_OF_ORDER.name,
            )
        if item.kind is Kind.ROLLOUT_RECORD:
            for bad in self.collector.on_rescored(
                item.content_id, true_reward(item.obj.body), item.received_at
            ):
                self.peer.report(
                    bad,
                    penalties.FALSE_CLAIM.cost,
                    "claimed reward differs from the re-score",
                    penalties.FALSE_CLAIM.name,
                )
            if len(self.waiting) < 65_536:
                self.waiting[item.content_id] = (item.obj, time.time())
        elif item.kind in (Kind.VERDICT, Kind.PRODUCER_CLAIM):
            for ban in judged(self.standing, self.peer.admission.authority, item):
                for rid in [
                    r for r, (ro, _t) in self.waiting.items() if ro.envelope.signer == ban.producer
                ]:
                    del self.waiting[rid]
        if item.kind in (Kind.ROLLOUT_HEADER, Kind.ROLLOUT_RECORD):
            self.admitted_ahead[signer] += (
                item.envelope.policy_version > self.peer.admission.version
            )
        if item.kind in (Kind.ROLLOUT_HEADER, Kind.ROLLOUT_RECORD):
            h = item.obj.header if item.kind is Kind.ROLLOUT_RECORD else item.obj
            self.made[item.content_id] = (
                peer_id_to_b58(item.envelope.signer),
                item.envelope.timestamp_ms / 1000.0,
                h.counter,
                h.body_digest,
            )

    def report(self, ids: list[str]) -> dict[str, Any]:
        now = time.time()
        verified: dict[str, list[tuple[str, float]]] = {}
        headers: dict[str, list[float]] = {}
        units: Counter[tuple[str, int]] = Counter()
        bodies: Counter[bytes] = Counter()
        usable: Counter[str] = Counter()
        for rid, (producer, t, counter, digest) in self.made.items():
            headers.setdefault(producer, []).append(t)
            track = self.collector.tracks.get(rid)
            if track is not None and track.body and self.collector.status(track) is Status.VERIFIED:
                verified.setdefault(producer, []).append((rid.hex(), t))
                units[(producer, counter)] += 1
                bodies[digest] += 1
                if self.collector.ledger.allowed(track.producer, now):
                    usable[producer] += 1
        scores = self.peer.admission.scores
        # The ledger's final account (every gap judged, as it is once the grace has passed).
        reward = {p: self.collector.ledger.counted_reward(peer_id_from_b58(p)) for p in ids}
        self.collector.on_time(now)  # pull windows that ended are settled as skipped
        credit = {}
        for p in ids:
            s = self.collector.credit.standing(peer_id_from_b58(p))
            span = self.collector.ledger.standing(peer_id_from_b58(p))
            weight = self.standing.credit_weight(peer_id_from_b58(p))
            earned = self.collector.credited_reward(peer_id_from_b58(p))
            credit[p] = {
                "earned": earned,
                "credit_weight": weight,
                "credited": None if earned is None else earned * weight,
                "first": span.first if span else None,
                "last": span.last if span else None,
                "withheld": span.withheld if span else 0,
                **(dataclasses.asdict(s) if s is not None else {}),
            }
        return {
            "verified": verified,
            "headers": headers,
            "usable": dict(usable),
            "double_counted": sum(n - 1 for n in units.values())
            + sum(n - 1 for n in bodies.values()),
            "admitted_by_signer": {p: self.admitted_by_signer[p] for p in ids},
            "scores": {p: scores.score(p, now) for p in ids},
            "banned": {p: scores.is_banned(p, now) for p in ids},
            "counted_reward": reward,
            "trained": self.trained,
            "made": {rid.hex(): (producer, t) for rid, (producer, t, _c, _d) in self.made.items()},
            "bodies": [
                rid.hex()
                for rid in self.made
                if (tr := self.collector.tracks.get(rid)) is not None and tr.body
            ],
            "banned_producers": sorted(
                p for p in ids if self.standing.state(peer_id_from_b58(p)) is State.BANNED
            ),
            "credit": credit,
            "admitted_ahead": {p: self.admitted_ahead[p] for p in ids},
            "rss_mb": _rss_mb(),
        }


def _probe(peer: Any, counting: _Counting | None, ids: list[str]) -> dict[str, Any]:
    """What `bench adversary`'s connection cases look at in a target, now."""
    now = time.time()
    sc = peer.admission.scores
    host = peer.host
    try:
        connections = host.connection_count()
    except Exception:  # noqa: BLE001 - a bench figure, not the peer's business
        connections = -1
    return {
        "rss_mb_now": _rss_mb("VmRSS:"),
        "connections": connections,
        "peers": host.connected_peers(),
        "scores": {p: sc.score(p, now) for p in ids},
        "banned": {p: sc.is_banned(p, now) for p in ids},
        "admitted": {p: counting.admitted_by_signer[p] if counting else 0 for p in ids},
        "refused": {
            r or "": n
            for (_d, o, r), n in peer.store.ledger_summary("in").items()
            if o == "rejected"
        },
    }


def _rss_mb(field: str = "VmHWM:") -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


sampled_at: list[tuple[str, float, str]] = []  # validator: (rollout id, made at, producer)


class _Validator:
    """The validator's sampling, standing and window rule around the stand-in audit."""

    def __init__(
        self, peer: Any, send: Any, close_after_s: float, fraction: float = AUDIT_FRACTION
    ) -> None:
        self.peer, self.send, self.fraction = peer, send, fraction
        self.standing = StandingBook()
        self.tally = ProducerTally(STAT_LIMIT, close_after_s=close_after_s)
        self.held = HeldPasses()

    def window_audited(self, producer: bytes, counter: int) -> bool:
        if self.standing.state(producer) is not State.GOOD:
            return True
        ticket = window_ticket(
            self.peer.identity, self.peer.run_id, producer, counter // self.tally.window
        )
        return sampled(ticket, WINDOW_FRACTION)

    def on_deliver(self, item: Admitted) -> None:
        signer = item.envelope.signer
        if item.kind is Kind.ROLLOUT_HEADER:
            if self.window_audited(signer, item.obj.counter):
                self.tally.expect(signer, item.obj.counter, item.content_id, time.time())
            return
        if item.kind is not Kind.ROLLOUT_RECORD:
            return
        ro = item.obj
        ticket = sample_ticket(self.peer.identity, self.peer.run_id, item.content_id)
        if sampled(ticket, self.standing.audit_fraction(signer, self.fraction)):
            sampled_at.append(
                (ro.rollout_id.hex(), ro.envelope.timestamp_ms / 1000.0, peer_id_to_b58(signer))
            )
        elif self.window_audited(signer, ro.header.counter):
            ticket = b""  # audited for its window only: no verdict published
        else:
            return
        self.tally.body_held(signer, ro.header.counter, time.time())
        with contextlib.suppress(trio.WouldBlock):
            self.send.send_nowait((ro, ticket))

    async def audit_loop(self, receive: Any) -> None:
        async for ro, ticket in receive:
            change = model_change(ro.body)
            passed = ro.header.reward == true_reward(ro.body) and change != "changed"
            reason = (
                "ok" if passed else "changed_model" if change == "changed" else "reward_mismatch"
            )
            value = HONEST_STAT if change == "honest" else SLIGHT_STAT
            v = Verdict(
                rollout_id=ro.rollout_id,
                producer=ro.envelope.signer,
                passed=passed,
                reason=reason,
                reward_rescored=true_reward(ro.body),
                metrics=(Metric(name=STAT, value=value),),
                sample_ticket=ticket,
            )
            signer = ro.envelope.signer
            probation = self.standing.state(signer) is State.PROBATION
            if not (passed and probation):  # a held pass counts once its window is clean
                self.standing.audited(signer, passed, reason)
            if ticket and passed and probation:  # published once its window is judged clean
                self.held.hold(signer, ro.header.counter // self.tally.window, v)
            found = self.tally.add(signer, ro.header.counter, ro.rollout_id, {STAT: value})
            if found is not None:
                await self.on_finding(found)
            if (
                ticket
                and not (passed and probation)
                and not (passed and self.standing.state(signer) is State.BANNED)
            ):
                await self.peer.publish_verdict(v)
            await self.publish_cleared()
            if not passed:
                self.peer.report(ro.envelope.signer, -20.0, f"failed audit: {reason}")

    async def close_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            for found in self.tally.close(time.time()):
                await self.on_finding(found)
            await self.publish_cleared()

    async def publish_cleared(self) -> None:
        for v in cleared_passes(self.tally.take_cleared(), self.held, self.standing):
            await self.peer.publish_verdict(v)

    async def on_finding(self, found: Any) -> None:
        self.standing.ban(found.producer, f"producer {found.rule} over the limit")
        self.held.failed(found.producer)
        self.peer.report(found.producer, PRODUCER_PENALTY, f"producer {found.rule} over the limit")
        # a finding about any number of records is a claim (`node.roles.validator`)
        await self.peer.publish_producer_claim(
            ProducerClaim(
                producer=found.producer,
                rollout_ids=found.rollout_ids,
                statistic=STAT,
                median=min(found.statistic, 1e6),
                limit=found.limit,
            )
        )


async def main(args: argparse.Namespace) -> None:
    """Open the peer in its role and answer commands until `quit`."""
    ident = (
        Identity.from_private_bytes(bytes.fromhex(args.key)) if args.key else Identity.generate()
    )
    m = manifest(args.run, args.validator)
    cfg = PeerConfig(
        manifest=m,
        identity=ident,
        data_dir=Path(args.data_dir),
        roles=(args.role,),
        bootstrap=tuple(args.bootstrap),
        pull_bodies=args.role in ("trainer", "validator"),
        policy_version=VERSION,
        host=HostSettings(peer_dead_after_s=6.0, max_connections=args.max_connections),
        admission=AdmissionConfig(publishes_versions=args.role == "trainer"),
        pull=PullConfig(window_s=CREDIT_WINDOW_S) if args.role == "trainer" else PullConfig(),
    )
    with trio.move_on_after(args.max_life):
        async with open_peer(cfg) as peer, trio.open_nursery() as nursery:
            charges = _Charges(peer.admission.scores)
            counting = _Counting(peer, args.hold) if args.role == "trainer" else None
            if counting is not None:
                peer.on_deliver(counting.on_deliver)
                nursery.start_soon(counting.train_loop)
            if args.role == "validator":
                send, receive = trio.open_memory_channel[Any](4096)
                val = _Validator(peer, send, args.close, args.audit_fraction)
                peer.on_deliver(val.on_deliver)
                nursery.start_soon(val.audit_loop, receive)
                nursery.start_soon(val.close_loop)
            reply({"peer_id": peer.host.peer_id, "addrs": peer.host.listen_addrs()})
            stopping = trio.Event()
            stdin = trio.lowlevel.FdStream(os.dup(0))
            async for cmd in json_lines(stdin):
                kind = cmd.get("cmd")
                if kind == "produce":
                    stopping = trio.Event()
                    nursery.start_soon(_produce, peer, m, cmd.get("rate", 4.0), stopping)
                    reply({"ok": True})
                elif kind == "stop":
                    stopping.set()
                    reply({"ok": True})
                elif kind == "report":
                    ids = cmd.get("ids", [])
                    if counting is not None:
                        reply({**counting.report(ids), "charges": charges.of(ids)})
                    else:
                        now = time.time()
                        sc = peer.admission.scores
                        reply(
                            {
                                "banned": {p: sc.is_banned(p, now) for p in ids},
                                "rss_mb": _rss_mb(),
                                "scores": {p: sc.score(p, now) for p in ids},
                                "charges": charges.of(ids),
                                "sampled": sampled_at,
                                "standing_banned": sorted(
                                    p
                                    for p in ids
                                    if args.role == "validator"
                                    and val.standing.state(peer_id_from_b58(p)) is State.BANNED
                                ),
                            }
                        )
                elif kind == "probe":
                    reply(_probe(peer, counting, cmd.get("ids", [])))
                elif kind == "attack":
                    reply(await attack(cmd, m, Path(args.data_dir)))
                elif kind == "quit":
                    break
            nursery.cancel_scope.cancel()
    reply({"closed": True})


async def _produce(peer: Any, m: Any, rate: float, stopping: trio.Event) -> None:
    rng = random.Random(os.getpid())
    status = await trio.to_thread.run_sync(peer.store.produced_status)
    counter = status["produced"]
    start = time.monotonic()
    i = 0
    while not stopping.is_set():
        rec = honest_record(peer.identity, m, counter, peer.seq.next(), rng=rng)
        open_record(rec)
        await peer.produce(rec)
        counter += 1
        i += 1
        await trio.sleep(max(0.0, start + i / rate - time.monotonic()))


def cli() -> None:
    """Parse the command line and run `main`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--run", default="adversary")
    parser.add_argument("--role", default="inference")
    parser.add_argument("--key", default="")
    parser.add_argument("--validator", default="", help="the run's validator key (base58)")
    parser.add_argument("--bootstrap", nargs="*", default=[])
    parser.add_argument("--max-life", type=float, default=900.0)
    parser.add_argument("--max-connections", type=int, default=HostSettings.max_connections)
    parser.add_argument(
        "--hold", type=float, default=HOLD_S, help="trainer: the standing's hold, s"
    )
    parser.add_argument(
        "--close", type=float, default=CLOSE_AFTER_S, help="validator: window close, s"
    )
    parser.add_argument("--audit-fraction", type=float, default=AUDIT_FRACTION)
    args = parser.parse_args()
    sys.setrecursionlimit(10_000)
    trio.run(main, args)


if __name__ == "__main__":
    cli()
