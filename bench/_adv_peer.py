"""One peer process of `bench adversary`: trainer, validator, honest worker or attacker.

The full peer (`node.peer.open_peer`: py-libp2p, admission, SQLite) with synthetic signed
records instead of model output. What stands in for the model (said plainly, because the
benchmark measures the network's rules, not the audit): a record's true reward is
`true_reward(body)` (1.0 for about 23% of bodies, by their digest, else 0.0); honest
workers claim it, and the validator's "audit" re-scores it and fails any record whose
claim differs; the trainer credits each body it holds at `true_reward` (its stand-in
re-score) and charges `false_claim` for a header that claimed otherwise. Sampling,
verdicts, authority, accounting, credit and every admission rule are the real ones
(`protocol.*`, `node.roles.trainer.Collector`); the trainer's admission refuses versions
above its own (`publishes_versions`), and its body pull window is `CREDIT_WINDOW_S` so that
headers whose bodies never come are settled as skipped within a run.

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
import dataclasses
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from bench._gossip_peer import json_lines, reply
from bench._records import net_manifest, synthetic_record
from node.host import HostSettings
from node.peer import PeerConfig, open_peer
from node.roles.trainer import Collector
from protocol import penalties
from protocol.accounting import WorkLedger
from protocol.admission import AdmissionConfig, Admitted, Kind
from protocol.assignment import task_seed
from protocol.audit_sample import sample_ticket, sampled
from protocol.body_pull import PullConfig
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.identity import Identity, peer_id_from_b58, peer_id_to_b58
from protocol.rollout import make_record, open_record
from protocol.verified import Status, VerifiedRule
from protocol.wire import RolloutBody, RolloutRecord, Verdict

VERSION = 5  # everyone runs at this policy version (S = 2: version 2 and below is stale)
AUDIT_FRACTION = 0.5  # the validator's default (`--audit-fraction`)
CREDIT_WINDOW_S = 12.0  # the trainer's body pull window: a header unserved this long is skipped


def true_reward(body: RolloutBody) -> float:
    """The stand-in for re-scoring a task: fixed by the body, ~23% solved."""
    return 1.0 if content_id(encode(body))[0] < 59 else 0.0


def manifest(run: str, validator: str) -> Any:
    return dataclasses.replace(
        net_manifest(run), validator_keys=(peer_id_from_b58(validator),) if validator else ()
    )


def honest_record(ident: Identity, m: Any, counter: int, seq: int, *, lie: bool = False,
                  version: int = VERSION, run_id: str | None = None, rng: random.Random,
                  claim: float | None = None) -> bytes:
    """A synthetic record claiming its true reward (or lying: claiming the opposite, or
    `claim` whatever the truth)."""
    base = synthetic_record(ident, m, counter, n_prompt=16, n_completion=64, seq=seq, rng=rng)
    rec = decode(RolloutRecord, base)
    # The task seed derives from the run, the counter and the signer's key
    # (admission refuses any other as `not_bound`), and the body was sampled with it.
    seed = task_seed(m.seed, counter, ident.peer_id)
    body = dataclasses.replace(decode(RolloutBody, rec.body), sampling_seed=seed)
    reward = true_reward(body)
    if lie:
        reward = 1.0 - reward
    if claim is not None:
        reward = claim
    return make_record(
        ident, body, dataset=m.datasets[0].name, task_index=counter, counter=counter,
        task_seed=seed, reward=reward, run_id=run_id or m.run_id,
        policy_version=version, seq=seq, timestamp_ms=int(time.time() * 1000),
    )


class _Counting:
    """The trainer's view: the real Collector plus when each rollout was made."""

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.collector = Collector(peer.admission.authority, VerifiedRule(quorum=1), WorkLedger(),
                                   pull_window_s=CREDIT_WINDOW_S)  # fmt: skip
        self.made: dict[bytes, tuple[str, float, int, bytes]] = {}  # rid -> producer, t, counter, digest
        self.admitted_by_signer: Counter[str] = Counter()
        self.admitted_ahead: Counter[str] = Counter()  # rollouts of versions above ours

    def on_deliver(self, item: Admitted) -> None:
        signer = peer_id_to_b58(item.envelope.signer)
        self.admitted_by_signer[signer] += 1
        for bad in self.collector.on_deliver(item):
            self.peer.report(bad, -20.0, "withheld assignment counters")
        if item.kind is Kind.ROLLOUT_RECORD:
            for bad in self.collector.on_rescored(item.content_id, true_reward(item.obj.body), item.received_at):
                self.peer.report(bad, penalties.FALSE_CLAIM.cost, "claimed reward differs from the re-score",
                                 penalties.FALSE_CLAIM.name)  # fmt: skip
        if item.kind in (Kind.ROLLOUT_HEADER, Kind.ROLLOUT_RECORD):
            self.admitted_ahead[signer] += item.envelope.policy_version > self.peer.admission.version
        if item.kind in (Kind.ROLLOUT_HEADER, Kind.ROLLOUT_RECORD):
            h = item.obj.header if item.kind is Kind.ROLLOUT_RECORD else item.obj
            self.made[item.content_id] = (
                peer_id_to_b58(item.envelope.signer), item.envelope.timestamp_ms / 1000.0,
                h.counter, h.body_digest,
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
            credit[p] = {"credited": self.collector.credited_reward(peer_id_from_b58(p)),
                         "first": span.first if span else None, "last": span.last if span else None,
                         **(dataclasses.asdict(s) if s is not None else {})}
        return {
            "verified": verified, "headers": headers, "usable": dict(usable),
            "double_counted": sum(n - 1 for n in units.values()) + sum(n - 1 for n in bodies.values()),
            "admitted_by_signer": {p: self.admitted_by_signer[p] for p in ids},
            "scores": {p: scores.score(p, now) for p in ids},
            "banned": {p: scores.is_banned(p, now) for p in ids},
            "counted_reward": reward,
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
        connections = len(host._lh.get_network().get_connections())
    except Exception:  # noqa: BLE001 - a bench figure, not the peer's business
        connections = -1
    return {
        "rss_mb_now": _rss_mb("VmRSS:"), "connections": connections,
        "peers": host.connected_peers(),
        "scores": {p: sc.score(p, now) for p in ids},
        "banned": {p: sc.is_banned(p, now) for p in ids},
        "admitted": {p: counting.admitted_by_signer[p] if counting else 0 for p in ids},
        "refused": {r or "": n for (_d, o, r), n in peer.store.ledger_summary("in").items()
                    if o == "rejected"},
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


async def _audit_loop(peer: Any, receive: Any) -> None:
    async for ro, ticket in receive:
        passed = ro.header.reward == true_reward(ro.body)
        v = Verdict(rollout_id=ro.rollout_id, producer=ro.envelope.signer, passed=passed,
                    reason="ok" if passed else "reward_mismatch",
                    reward_rescored=true_reward(ro.body), metrics=(), sample_ticket=ticket)
        await peer.publish_verdict(v)
        if not passed:
            peer.report(ro.envelope.signer, -20.0, "failed audit: reward_mismatch")


async def main(args: argparse.Namespace) -> None:
    ident = Identity.from_private_bytes(bytes.fromhex(args.key)) if args.key else Identity.generate()
    m = manifest(args.run, args.validator)
    cfg = PeerConfig(
        manifest=m, identity=ident, data_dir=Path(args.data_dir), roles=(args.role,),
        bootstrap=tuple(args.bootstrap), pull_bodies=args.role in ("trainer", "validator"),
        policy_version=VERSION,
        host=HostSettings(peer_dead_after_s=6.0, max_connections=args.max_connections),
        admission=AdmissionConfig(publishes_versions=args.role == "trainer"),
        pull=PullConfig(window_s=CREDIT_WINDOW_S) if args.role == "trainer" else PullConfig(),
    )
    with trio.move_on_after(args.max_life):
        async with open_peer(cfg) as peer, trio.open_nursery() as nursery:
            counting = _Counting(peer) if args.role == "trainer" else None
            if counting is not None:
                peer.on_deliver(counting.on_deliver)
            if args.role == "validator":
                send, receive = trio.open_memory_channel[Any](4096)
                peer.on_deliver(lambda item: _validate_sync(peer, send, item, args.audit_fraction))
                nursery.start_soon(_audit_loop, peer, receive)
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
                        reply(counting.report(ids))
                    else:
                        now = time.time()
                        sc = peer.admission.scores
                        reply({"banned": {p: sc.is_banned(p, now) for p in ids}, "rss_mb": _rss_mb(),
                              "scores": {p: sc.score(p, now) for p in ids}, "sampled": sampled_at})
                elif kind == "probe":
                    reply(_probe(peer, counting, cmd.get("ids", [])))
                elif kind == "attack":
                    from bench._attacks import attack

                    reply(await attack(cmd, m, Path(args.data_dir)))
                elif kind == "quit":
                    break
            nursery.cancel_scope.cancel()
    reply({"closed": True})


def _validate_sync(peer: Any, send: Any, item: Admitted, fraction: float) -> None:
    if item.kind is not Kind.ROLLOUT_RECORD:
        return
    ticket = sample_ticket(peer.identity, peer.run_id, item.content_id)
    if sampled(ticket, fraction):
        ro = item.obj
        sampled_at.append((ro.rollout_id.hex(), ro.envelope.timestamp_ms / 1000.0,
                           peer_id_to_b58(ro.envelope.signer)))
        try:
            send.send_nowait((item.obj, ticket))
        except trio.WouldBlock:
            pass


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--run", default="adversary")
    parser.add_argument("--role", default="inference")
    parser.add_argument("--key", default="")
    parser.add_argument("--validator", default="", help="the run's validator key (base58)")
    parser.add_argument("--bootstrap", nargs="*", default=[])
    parser.add_argument("--max-life", type=float, default=900.0)
    parser.add_argument("--max-connections", type=int, default=HostSettings.max_connections)
    parser.add_argument("--audit-fraction", type=float, default=AUDIT_FRACTION)
    args = parser.parse_args()
    sys.setrecursionlimit(10_000)
    trio.run(main, args)


if __name__ == "__main__":
    cli()
