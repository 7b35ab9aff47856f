"""One running peer of a run: host + admission + store + gossip + body exchange + discovery.

This is the IO shell around `protocol.admission`: bytes arrive (a gossip message through
the GossipSub topic validator, or a record pulled over `/swarm-rl/<run>/rollout/1`), go in
as `MessageReceived(sender, kind, data, now)`, and the returned actions are carried out
here by one pump (`Peer._execute`), in the order admission returned them: `Store` ->
`node.store.Store` (batched with other peers' items in a worker thread, one fsync per
batch) and *awaited*, so nothing is forwarded or delivered before it is durable; if the
write fails, `StoreFailed` goes back to admission and the rest of that list is skipped;
`Forward` -> the (async) GossipSub validator answers True so GossipSub forwards it,
`Deliver` -> the role's callbacks, `Reject` -> counters and the ledger,
`Disconnect`/`Ban`/`Unban` -> the host (bans are persisted and reloaded at start, so they
survive a restart). Roles report misbehaviour through `Peer.report`.

Flow of a rollout: the producer stores its record (`produce()`, acknowledged once the
fsync returned), then gossips the signed header on the run's rollouts topic (paced by the
`Outbox`). A receiver admits and stores the header, and, if it pulls bodies (validators,
trainers, relays), fetches the record from the producer or the forwarding peer, admits
it as `Kind.ROLLOUT_RECORD` (the body must match the signed digest) and stores the body.

Nothing produced is lost to the network (`protocol.catch_up` holds the rules): a peer that
pulls bodies asks each neighbour, when it joins and every few seconds, which rollouts it
holds (`node.sync_exchange`) and pulls the ones it lacks through admission; a worker asks
trainers which of its own rollouts they hold (receipts: `Store.delivery_status()` says
produced / delivered / pending / too stale). What was in memory at a crash is rebuilt
from the store at start: the dedup memory (so copies stay duplicates), the pulls still
owed (headers without a body), and peer scores, which are saved as soon as a penalty is
applied (with the ledger line that explains it).

Resource handling: everything lives inside `open_peer()`; leaving it cancels the loops,
drains and closes the host (port released) and closes the store. Error handling: a remote
fault never raises out of a loop: it becomes a `Reject` (score change), a failed pull
(retried from another source, bounded), or a dropped peer. Store failures are reported
back to admission (`StoreFailed`) so a later copy can be admitted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from node import rollout_exchange, shard_exchange, sync_exchange
from node.discovery import Discovery
from node.gossip import BATCH_TOPICS, TOPIC_KINDS, Outbox, topic_name
from node.host import AGENT, HostSettings, PeerError, PeerEvent, SwarmHost, open_host
from node.store import RolloutRow, Store, StoreError, VerdictRow
from node.weights_store import WeightsStore
from node.weights_sync import WeightSettings, WeightSync
from protocol import admission as adm
from protocol import catch_up as cu
from protocol import penalties
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Admitted,
    Ban,
    BodyMissing,
    Deliver,
    Disconnect,
    Forward,
    Kind,
    Known,
    MessageReceived,
    Misbehaved,
    NewestShown,
    PeerConnected,
    Reject,
    RunRules,
    StoreFailed,
    Tick,
    Unban,
    VersionChanged,
)
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.errors import RemoteProtocolError
from protocol.identity import Identity
from protocol.peer_score import PeerScores
from protocol.rollout import check_body, open_header
from protocol.version_claims import AskNewest
from protocol.wire import (
    MAX_HEADER_BATCH,
    Delegation,
    HeaderBatch,
    PeerHello,
    ProducerClaim,
    RolloutRecord,
    RunManifest,
    Verdict,
    WireObject,
)

log = logging.getLogger("swarm.peer")

PULL_WORKERS = 3
PULL_ATTEMPTS = 8
PULL_RETRY_S = 1.0
PARK_S = 1.0  # a pull whose every source is disconnected looks again this often
MAX_PARKS = 300  # ... for at most this many looks, then it spends attempts as usual
MAX_PARKED = 4096  # pulls waiting at once
ADMITTED_QUEUE = 4096
PULL_QUEUE = 8192
SCORE_SAVE_INTERVAL_S = 15.0  # rewards; a penalty is saved at once (with its ledger line)
CATCH_UP_TICK_S = 1.0
DELIVERY_CHECK_S = 5.0  # also: owed pulls (headers without a body) queued again
OWED_RETRY_BATCH = 256
BAD_REQUEST_PENALTY = penalties.BAD_REQUEST.cost
MAX_SERVE_STREAMS_PER_PEER = 4
PRODUCER_LACKS_BODY_PENALTY = penalties.PRODUCER_LACKS_BODY.cost
BODYLESS_TTL_S = 3600.0  # a header whose body never came is forgotten after this
ASK_NEWEST_S = 10.0  # a sender backs a future version it handed us within this
STORE_WAIT_S = 4.0  # under py-libp2p's 5 s limit on an async topic validator


@dataclass(frozen=True)
class PeerConfig:
    """What a peer needs to join a run."""

    manifest: RunManifest
    identity: Identity
    data_dir: Path
    roles: tuple[str, ...]
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: tuple[str, ...] = ()
    pull_bodies: bool = True
    publish_rate_per_s: float = 8.0
    max_peers: int = 64
    policy_version: int = 0
    host: HostSettings = field(default_factory=HostSettings)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    weights: WeightSettings = field(default_factory=WeightSettings)
    header_batch: int = MAX_HEADER_BATCH // 2  # headers per gossip message at most (1: no batching)
    drain_timeout_s: float = 15.0  # at stop: publish queued headers/verdicts for this long at most


class SeqCounter:
    """Envelope sequence numbers for one signer: dense (+1 per message), so receivers'
    `ReplayGuard` window (the last 4096 numbers) tolerates gossip reordering, and starting
    at `start_s * 4096` (start time in seconds), so a restarted peer continues above what it
    used before as long as it averaged under 4096 messages per second."""

    PER_SECOND = 4096

    def __init__(self, start_s: float | None = None) -> None:
        self._last = int(time.time() if start_s is None else start_s) * self.PER_SECOND

    def next(self) -> int:
        self._last += 1
        return self._last


@dataclass
class _Write:
    """One admitted item on its way to the store; `done` is set with `ok` when written."""

    item: Admitted
    done: trio.Event = field(default_factory=trio.Event)
    ok: bool = False


@dataclass
class _Pull:
    rollout_id: bytes
    sources: list[str]
    attempts: int = 0
    origin: tuple[bytes, str] | None = None  # (signer, sender) of the header, to blame
    parked: int = 0  # times it waited for a source to (re)connect (not an attempt)
    widened: bool = False  # other connected peers were added as sources
    answered: int = 0  # times a source answered without the body (or with a bad one)


class Peer:
    """A joined peer (build one with `open_peer()`); roles drive it through:

    `produce(record)`, `publish_verdict(verdict)`, `on_deliver(callback)`, `stats()`,
    plus `host`, `store`, `admission`, `discovery`, `identity`, `manifest`.
    """

    def __init__(
        self, cfg: PeerConfig, host: SwarmHost, store: Store, admission: Admission,
        weights_store: WeightsStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.manifest = cfg.manifest
        self.run_id = cfg.manifest.run_id
        self.identity = cfg.identity
        self.host = host
        self.store = store
        self.admission = admission
        self.policy_version = cfg.policy_version
        self.seq = SeqCounter()
        self.outbox = Outbox(
            host, cfg.publish_rate_per_s, max_batch=cfg.header_batch,
            batch_topics={topic_name(self.run_id, t): topic_name(self.run_id, b)
                          for t, b in BATCH_TOPICS.items()},
        )
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()
        self.bootstrap_results: list[tuple[str, bool, str]] = []
        self.drained = 0  # queued messages published while stopping
        self.started_at = time.time()
        self._callbacks: list[Callable[[Admitted], None]] = []
        self._late_callbacks: list[Callable[[Admitted], None]] = []
        self._admitted_send, self._admitted_recv = trio.open_memory_channel[_Write](ADMITTED_QUEUE)
        self._pull_send, self._pull_recv = trio.open_memory_channel[_Pull](PULL_QUEUE)
        self._ledger_send, self._ledger_recv = trio.open_memory_channel[tuple[Reject, float]](ADMITTED_QUEUE)
        self._nursery: trio.Nursery | None = None
        self._serving: dict[str, int] = {}  # peer -> open body streams we serve
        self._pulling: set[bytes] = set()  # ids queued or being pulled
        self._parked = 0  # pulls waiting for a source to (re)connect, or for a retry
        self.catch_up = cu.CatchUp(pulls=cfg.pull_bodies, producer=cfg.identity.peer_id)
        self.delivery: dict[str, int] = {}
        self.discovery = Discovery(
            host, self.run_id, self._hello_bytes, max_peers=cfg.max_peers, on_hello=self._on_hello
        )
        self.topics = {name: topic_name(self.run_id, name) for name in TOPIC_KINDS}
        host.set_stream_handler(rollout_exchange.protocol_id(self.run_id), self._serve_rollouts)
        host.set_stream_handler(sync_exchange.protocol_id(self.run_id), self._serve_sync)
        self.weights: WeightSync | None = None
        if weights_store is not None:
            self.weights = WeightSync(self, weights_store, cfg.weights)
            host.set_stream_handler(shard_exchange.protocol_id(self.run_id), self.weights.serve)
            self.on_deliver(self.weights.on_admitted)
        host.on_peer_event(self._on_peer_event)

    # -- public ---------------------------------------------------------------------------

    def on_deliver(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every admitted rollout record (with body), header and
        verdict; it runs on the event loop and must not block (queue work instead)."""
        self._callbacks.append(callback)

    def on_late(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every authentic rollout refused as too stale
        (`Reject.late`: published, only late); same rules as `on_deliver`."""
        self._late_callbacks.append(callback)

    async def produce(self, record: bytes) -> bytes:
        """Store our own rollout record durably, then gossip its header; returns its id."""
        return (await self.produce_many([record]))[0]

    async def produce_many(self, records: Sequence[bytes]) -> list[bytes]:
        """`produce` for a generation batch: stored in one transaction, then the headers
        queued together (so they can leave in one gossip batch); returns their ids."""
        rows = []
        for record in records:
            # Our own bytes, checked as anyone will check them (a failure is our bug); the
            # record is decoded once (`open_record` would decode it a second time here).
            rec = decode(RolloutRecord, record)
            env, header, rollout_id = open_header(rec.header)
            check_body(header, rec.body)
            rows.append(RolloutRow(
                rollout_id=rollout_id,
                run_id=env.run_id,
                producer=env.signer,
                policy_version=env.policy_version,
                header=rec.header,
                body=rec.body,
                received_at=time.time(),
            ))  # fmt: skip
        await trio.to_thread.run_sync(self.store.put_produced_many, rows)
        self.counters["produced"] += len(rows)
        await self.outbox.put_many(self.topics["rollouts"], [r.header for r in rows])
        return [r.rollout_id for r in rows]

    def seal(self, obj: WireObject) -> bytes:
        return seal(
            self.identity, obj, run_id=self.run_id, policy_version=self.policy_version,
            seq=self.seq.next(), timestamp_ms=int(time.time() * 1000),
        )

    async def publish_verdict(self, verdict: Verdict) -> bytes:
        """Sign, store and gossip a verdict; returns its id."""
        data = self.seal(verdict)
        vid = content_id(data)
        row = VerdictRow(vid, verdict.rollout_id, self.identity.peer_id, bool(verdict.passed),
                         data, time.time(), verdict.reason)
        await trio.to_thread.run_sync(self.store.put_verdict, row)
        self.counters["verdicts_published"] += 1
        await self.outbox.put(self.topics["verdicts"], data)
        return vid

    async def publish_producer_claim(self, claim: ProducerClaim) -> bytes:
        """Sign and gossip a claim over a producer's window of records; returns its id."""
        data = self.seal(claim)
        self.counters["producer_claims_published"] += 1
        await self.outbox.put(self.topics["producer-claims"], data)
        return content_id(data)

    def report(self, peer: bytes | str, penalty: float, reason: str) -> None:
        """A role found fault with `peer` (e.g. a failed audit): score it down by `penalty`
        (<= 0) through admission, which bans it below the threshold."""
        self._apply(self.admission.handle(Misbehaved(_b58(peer), penalty, reason, time.time())))

    async def publish_delegation(self, validator: bytes, granted: bool) -> bytes:
        """Grant (or revoke) `validator` the right to judge; only a trainer key's counts."""
        data = self.seal(Delegation(validator=validator, granted=granted))
        await self._admit(self.host.peer_id, Kind.DELEGATION, data)  # applies to us as well
        await self.outbox.put(self.topics["delegations"], data)
        return content_id(data)
    def set_policy_version(self, version: int) -> None:
        """Our current policy version (the newest installed): staleness is judged from it."""
        if version != self.policy_version:
            self.policy_version = version
            self._apply(self.admission.handle(VersionChanged(version, time.time())))

    def stats(self) -> dict[str, object]:
        return {
            "peer_id": self.host.peer_id,
            "roles": list(self.cfg.roles),
            "run": self.run_id,
            "policy_version": self.policy_version,
            "peers": len(self.host.connected_peers()),
            "known_peers": len(self.discovery.book),
            "banned": self.host.banned_count(),
            "counters": dict(self.counters),
            "rejected": dict(self.rejects),
            "outbox_pending": self.outbox.pending(),
            "header_batches": self.outbox.stats.batches,
            "header_batch_mean": (round(self.outbox.stats.batched / self.outbox.stats.batches, 2)
                                  if self.outbox.stats.batches else None),
            "pull_pending": self._pull_recv.statistics().current_buffer_used,
            "delivery": dict(self.delivery),
            "uptime_s": round(time.time() - self.started_at, 1),
            "rtt_ms_median": self._rtt_median_ms(),
            "weights": self.weights.status() if self.weights is not None else None,
        }

    def _rtt_median_ms(self) -> float | None:
        rtts = sorted(r for p in self.host.connected_peers() if (r := self.host.peer_rtt(p)) == r)
        return round(rtts[len(rtts) // 2] * 1000, 3) if rtts else None

    # -- hello ----------------------------------------------------------------------------

    def _hello_bytes(self) -> bytes:
        hello = PeerHello(
            roles=tuple(self.cfg.roles), policy_version=self.policy_version,
            listen_addrs=tuple(self.host.listen_addrs()[:16]), agent=AGENT,
        )
        return self.seal(hello)

    def _on_hello(self, peer: str, hello: PeerHello) -> None:
        self.counters["hellos"] += 1
        trainer = "trainer" in hello.roles
        self._catch_up(self.catch_up.handle(cu.PeerJoined(peer, time.time(), receipts_from=trainer)))
        if self.weights is not None:
            self.weights.on_hello(peer, hello.policy_version)

    def _on_peer_event(self, event: PeerEvent) -> None:
        self.counters[f"peer_{event.kind}"] += 1
        if event.kind == "connected":
            self._apply(self.admission.handle(PeerConnected(event.peer, time.time())))
            self._catch_up(self.catch_up.handle(cu.PeerJoined(event.peer, time.time())))
        else:
            self.catch_up.handle(cu.PeerLeft(event.peer, time.time()))
            if self.weights is not None:
                self.weights.on_peer_gone(event.peer)

    # -- admission glue -------------------------------------------------------------------

    def _validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool]]:
        async def check(sender: str, data: bytes, origin: str) -> bool:
            return await self._admit(sender, kind, data, origin)

        return check

    def _batch_validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool]]:
        """A `HeaderBatch`: each header admitted on its own, exactly as if it came alone;
        the batch is forwarded only when every header in it was admitted. Broken framing
        goes to admission whole (it fails there as a malformed message of `kind`)."""

        async def check(sender: str, data: bytes, origin: str) -> bool:
            try:
                batch = decode(HeaderBatch, data)
            except RemoteProtocolError:
                await self._admit(sender, kind, data, origin)
                return False
            self.counters["in_header_batch"] += 1
            admitted = [await self._admit(sender, kind, item, origin) for item in batch.headers]
            return all(admitted)

        return check

    async def _admit(self, sender: str, kind: Kind, data: bytes, origin: str | None = None) -> bool:
        return (await self._admit_actions(sender, kind, data, origin))[0]

    async def _admit_actions(
        self, sender: str, kind: Kind, data: bytes, origin: str | None = None
    ) -> tuple[bool, list]:  # type: ignore[type-arg]
        now = time.time()
        self.counters[f"in_{kind}"] += 1
        actions = self.admission.handle(MessageReceived(sender, kind, data, now, origin))
        return await self._execute(actions), actions

    async def _execute(self, actions: list) -> bool:  # type: ignore[type-arg]
        """The one pump: carry out admission's actions in order; True when admitted.

        A `Store` is awaited (bounded by `STORE_WAIT_S`) before the next action runs, so a
        message is forwarded and delivered only once it is durable; a failed store goes
        back to admission (`StoreFailed`) and the rest of the list is skipped.
        """
        admitted = False
        for action in actions:
            if isinstance(action, adm.Store):
                if not await self._store(action.item):
                    self.admission.handle(StoreFailed(action.item, time.time()))
                    return False
            elif isinstance(action, Forward):
                admitted = True
            elif isinstance(action, Deliver):
                admitted = True
                self._deliver(action.item)
            else:
                self._apply((action,))
        return admitted

    def _apply(self, actions: Iterable[adm.Action]) -> None:
        """Carry out control actions (rejects, disconnects, bans); these never store."""
        for action in actions:
            if isinstance(action, Reject):
                self.rejects[str(action.reason)] += 1
                if action.late is not None:
                    for callback in list(self._late_callbacks):
                        callback(action.late)
                if action.penalty < 0:
                    with contextlib.suppress(trio.WouldBlock):
                        self._ledger_send.send_nowait((action, time.time()))
            elif isinstance(action, adm.Penalized):  # a charge other than a refusal: same ledger
                self.rejects[action.reason] += 1
                log.info("peer: %s pays %g for %s: %s", str(action.peer)[:12], action.penalty, action.reason, action.detail)
                with contextlib.suppress(trio.WouldBlock):
                    self._ledger_send.send_nowait((action, time.time()))  # type: ignore[arg-type]
            elif isinstance(action, Disconnect):
                self._spawn(self.host.disconnect, action.peer, f"admission: {action.reason}")
            elif isinstance(action, Ban):
                self._spawn(self._ban, action)
            elif isinstance(action, Unban):
                self.host.unban(str(action.peer))
            elif isinstance(action, AskNewest):
                self._spawn(self._ask_newest, action)
            else:
                raise AssertionError(f"{type(action).__name__} needs the pump (_execute)")

    async def _ask_newest(self, ask: AskNewest) -> None:
        """Ask a peer that handed us a version we have not heard of to back it with the
        newest manifest it holds (`protocol.version_claims`); a backed one tells us we are
        behind, so the weights follow it."""
        peer, env, answered = str(ask.peer), None, False
        with trio.move_on_after(ASK_NEWEST_S):
            try:
                env = await shard_exchange.fetch_newest(self.host, peer, self.run_id)
                answered = True
            except PeerError as exc:
                log.debug("peer: %s did not back its version claim: %s", peer[:12], exc)
        actions = self.admission.handle(NewestShown(ask.peer, env, time.time(), answered))
        self._apply(actions)
        # Only a backing manifest goes on to the weights (an unbacked answer was charged
        # once already, and is not opened a second time).
        if env is not None and self.weights is not None and not actions:
            await self._admit(peer, Kind.WEIGHT_MANIFEST, env)

    async def _store(self, item: Admitted) -> bool:
        """Hand `item` to the batched writer and wait until it is written (or not)."""
        w = _Write(item)
        try:
            self._admitted_send.send_nowait(w)
        except trio.WouldBlock:
            self.counters["overloaded_drops"] += 1
            return False
        with trio.move_on_after(STORE_WAIT_S):
            await w.done.wait()
        if not w.ok:
            self.counters["store_failed"] += 1
        return w.ok

    def _deliver(self, item: Admitted) -> None:
        if item.kind is Kind.ROLLOUT_HEADER and self.cfg.pull_bodies:
            self._want(item.content_id, [_b58(item.signer), str(item.sender)],
                       origin=(item.signer, str(item.sender)))
        for callback in list(self._callbacks):
            callback(item)

    def _spawn(self, fn: Callable, *args: object) -> None:  # type: ignore[type-arg]
        if self._nursery is None or self.host._closing:
            return  # shutting down: nothing new starts
        self._nursery.start_soon(fn, *args)

    async def _ban(self, action: Ban) -> None:
        self.counters["bans"] += 1
        # Stored before it takes effect: the host's ban awaits a disconnect, and a stop
        # arriving there would otherwise leave a ban in force that a restart forgets.
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peer, action.record)
        await self.host.ban(str(action.peer), max(1.0, action.until - time.time()), "score below threshold")

    # -- loops ----------------------------------------------------------------------------

    async def _process_loop(self) -> None:
        """The batched writer: store admitted items (one transaction, off the loop), then
        wake each item's pump (`_store`)."""
        own = self.identity.peer_id
        while True:
            batch = [await self._admitted_recv.receive()]
            while len(batch) < 64:
                try:
                    batch.append(self._admitted_recv.receive_nowait())
                except trio.WouldBlock:
                    break

            def write(items: list[_Write] = batch) -> list[bool]:
                """One transaction (one fsync) for the batch; item by item if it fails."""
                try:
                    self.store.put_admitted_many([w.item for w in items], own_peer=own)
                    return [True] * len(items)
                except (StoreError, ValueError) as exc:
                    log.warning("batch store failed (%s); storing one by one", exc)
                ok = []
                for w in items:
                    try:
                        self.store.put_admitted(w.item, own_peer=own)
                        ok.append(True)
                    except (StoreError, ValueError) as exc:
                        log.warning("store failed for %s: %s", w.item.kind, exc)
                        ok.append(False)
                return ok

            results = await trio.to_thread.run_sync(write)
            for w, ok in zip(batch, results, strict=True):
                if ok:
                    self.counters[f"stored_{w.item.kind}"] += 1
                w.ok = ok
                w.done.set()

    def _want(
        self, rollout_id: bytes, sources: list[str], origin: tuple[bytes, str] | None = None
    ) -> None:
        """Queue a body pull (once per id while it is queued or running)."""
        if rollout_id in self._pulling:
            return
        sources = [s for s in dict.fromkeys(sources) if s and s != self.host.peer_id]
        try:
            self._pull_send.send_nowait(_Pull(rollout_id, sources, origin=origin))
            self._pulling.add(rollout_id)
        except trio.WouldBlock:
            self.counters["pull_queue_full"] += 1  # catch-up offers it again later

    async def _pull_loop(self) -> None:
        """Fetch bodies for admitted headers; each pull bounded by the host's deadlines."""
        while True:
            first = await self._pull_recv.receive()
            batch = [first]
            while len(batch) < rollout_exchange.MAX_IDS_PER_REQUEST:
                try:
                    batch.append(self._pull_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            # A body we already hold is never fetched again (restart, catch-up, two announcers).
            held = await trio.to_thread.run_sync(self.store.bodies_held, [p.rollout_id for p in batch])
            for p in batch:
                if p.rollout_id in held:
                    self._pulling.discard(p.rollout_id)
                    self.counters["pull_skipped_held"] += 1
            batch = [p for p in batch if p.rollout_id not in held]
            by_source: dict[str, list[_Pull]] = {}
            live = set(self.host.connected_peers())
            for p in batch:
                # Only connected sources: dialing ids nobody can reach (a flood of headers
                # signed by fresh keys) would hold the pull workers for a dial timeout each.
                source = next((s for s in p.sources if s in live), "")
                if not source and not p.widened:
                    # The announcers are away: any connected peer may hold the body
                    # (validators, trainers, relays pull every body).
                    p.widened = True
                    others = [x for x in live if x not in p.sources]
                    random.shuffle(others)
                    p.sources += others[:3]
                    source = next((s for s in p.sources if s in live), "")
                if not source and self._may_park(p):
                    # Every source is away (restarting, say): wait for one without
                    # spending an attempt, so a pull outlives a restart of its source.
                    p.parked += 1
                    self.counters["pull_parked"] += 1
                    self._spawn(self._requeue_pull, p, PARK_S)
                    continue
                by_source.setdefault(source, []).append(p)
            async with trio.open_nursery() as nursery:  # a slow source delays only its own
                for source, pulls in by_source.items():
                    nursery.start_soon(self._pull_from, source, pulls)

    async def _pull_from(self, source: str, pulls: list[_Pull]) -> None:
        records: list[bytes | None]
        answered = False
        try:
            if not source:
                raise PeerError("-", "no source")
            records = await rollout_exchange.pull(self.host, source, self.run_id, [p.rollout_id for p in pulls])
            answered = True
        except PeerError as exc:
            log.info("pull from %s failed: %s", source[:12], exc)
            self.counters["pull_errors"] += 1
            records = [None] * len(pulls)
        async with trio.open_nursery() as nursery:  # stores of one batch share fsyncs
            for p, rec in zip(pulls, records, strict=True):
                nursery.start_soon(self._take_pulled, source, p, rec, answered)

    async def _take_pulled(self, source: str, p: _Pull, rec: bytes | None, answered: bool = False) -> None:
        """Admit one pulled record (or note the miss) and schedule a retry if needed."""
        if rec is None and answered and p.origin is not None and source == _b58(p.origin[0]):
            # The producer itself says it lacks a body it announced: producers store a
            # record before they gossip its header, so an honest one always has it.
            self.counters["producer_lacks_body"] += 1
            self.report(source, PRODUCER_LACKS_BODY_PENALTY, "announced a body it does not serve")
        if rec is None and answered:
            p.answered += 1
        if rec is not None and _record_id(rec) != p.rollout_id:
            # Not what we asked for (a re-signed copy, another rollout): the source pays.
            self.counters["pull_wrong_record"] += 1
            self.report(source, penalties.WRONG_RECORD.cost, "served another rollout than asked")
            rec = None
        if rec is not None:
            self.counters["pulled"] += 1
            admitted, actions = await self._admit_actions(source, Kind.ROLLOUT_RECORD, rec)
            if admitted or any(isinstance(a, Reject) and a.reason == "duplicate" for a in actions):
                self._pulling.discard(p.rollout_id)
                return
            # A bad body from this source (it paid for it in score): try another one.
            p.answered += 1
        p.attempts += 1
        if p.attempts >= PULL_ATTEMPTS:
            # The header stays (retried at restart) until it expires (`BODYLESS_TTL_S`);
            # a header nobody serves costs its signer and sender (a flood of them, more),
            # but only if some source answered: failed connections are no evidence.
            self.counters["pull_gave_up"] += 1
            self._pulling.discard(p.rollout_id)
            if p.origin is not None:
                signer, sender = p.origin
                self._apply(self.admission.handle(
                    BodyMissing(p.rollout_id, signer, sender, time.time(), p.answered)
                ))
            return
        # Rotate sources and retry later (the forwarder may not have the body yet);
        # after the announcers, any connected peer may hold it (relays, trainers).
        p.sources = p.sources[1:] + p.sources[:1]
        if p.attempts == 2:
            others = [x for x in self.host.connected_peers() if x not in p.sources]
            random.shuffle(others)
            p.sources += others[:3]
        self._spawn(self._retry_pull, p)

    async def _retry_pull(self, p: _Pull) -> None:
        await self._requeue_pull(p, min(8.0, PULL_RETRY_S * 2 ** (p.attempts - 1)))

    def _may_park(self, p: _Pull) -> bool:
        """Park only for a source we know how to reach (not a fresh key nobody can dial),
        a bounded number of times, and a bounded number of pulls at once."""
        return (
            bool(p.sources)
            and p.parked < MAX_PARKS
            and self._parked < MAX_PARKED
            and any(self.discovery.book.addrs(s) for s in p.sources)
        )

    async def _requeue_pull(self, p: _Pull, delay_s: float) -> None:
        self._parked += 1
        try:
            await trio.sleep(delay_s)
        finally:
            self._parked -= 1
        try:
            self._pull_send.send_nowait(p)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self._pulling.discard(p.rollout_id)

    # -- catch-up and receipts (rules: protocol.catch_up) ---------------------------------

    def _catch_up(self, actions: list[cu.Action]) -> None:
        for a in actions:
            if isinstance(a, cu.Ask):
                self._spawn(self._ask, a)
            elif isinstance(a, cu.Pull):
                self.counters["catch_up_offered"] += len(a.ids)
                for rid in a.ids:
                    self._want(rid, [a.peer])
            elif isinstance(a, cu.Receipt):
                self._spawn(self._receipt, a)

    async def _ask(self, a: cu.Ask) -> None:
        try:
            ids, ats, more = await sync_exchange.ask(
                self.host, a.peer, self.run_id, a.since, a.min_version, a.producer,
                self.catch_up.config.page,
            )
        except PeerError as exc:
            log.info("catch-up with %s failed: %s", a.peer[:12], exc)
            self.counters["catch_up_errors"] += 1
            self.catch_up.handle(cu.Failed(a.peer, time.time()))
            return
        if self.cfg.pull_bodies:
            have = await trio.to_thread.run_sync(self.store.bodies_held, ids)
            held = tuple(i in have or i in self._pulling for i in ids)
        else:
            held = (False,) * len(ids)
        self._catch_up(self.catch_up.handle(cu.Answered(a.peer, ids, ats, more, held, time.time())))

    async def _receipt(self, r: cu.Receipt) -> None:
        with contextlib.suppress(StoreError):
            n = await trio.to_thread.run_sync(self.store.mark_delivered, r.ids, r.peer, time.time())
            self.counters["receipts"] += n

    async def _serve_sync(self, stream) -> None:  # type: ignore[no-untyped-def]
        async def lookup(since: float, min_version: int, producer: bytes | None, limit: int):  # type: ignore[no-untyped-def]
            return await trio.to_thread.run_sync(self.store.held_since, since, min_version, producer, limit)

        try:
            self.counters["catch_up_served"] += await sync_exchange.serve(stream, lookup)
        except sync_exchange.BadRequest:
            self.rejects["bad_request"] += 1
            self._apply(self.admission.handle(
                Misbehaved(stream.peer, BAD_REQUEST_PENALTY, "bad catch-up request", time.time())
            ))
            self._spawn(self._save_scores)
            raise

    async def _catch_up_loop(self) -> None:
        """Drive `protocol.catch_up`; a worker also accounts its rollouts (delivered,
        pending, too stale) every `DELIVERY_CHECK_S`."""
        last_check = -math.inf
        while True:
            now = time.time()
            self._catch_up(self.catch_up.handle(
                cu.Tick(now, self.policy_version, self.manifest.max_staleness)
            ))
            if time.monotonic() - last_check >= DELIVERY_CHECK_S:
                last_check = time.monotonic()
                with contextlib.suppress(StoreError):
                    await trio.to_thread.run_sync(self._account_delivery, now)
                    if self.cfg.pull_bodies:
                        await self._retry_owed()
            await trio.sleep(CATCH_UP_TICK_S)

    async def _retry_owed(self) -> None:
        """Queue again the stored headers whose body pull gave up (a peer may have it now)."""
        rows = await trio.to_thread.run_sync(self.store.missing_bodies, OWED_RETRY_BATCH)
        for row in rows:
            if row.rollout_id not in self._pulling:
                self.counters["pulls_retried"] += 1
                sources = [_b58(row.producer)] + ([str(row.source_peer)] if row.source_peer else [])
                self._want(row.rollout_id, sources)

    def _account_delivery(self, now: float) -> None:
        """(In a thread.) Mark our unacknowledged rollouts past the staleness bound."""
        verdict = cu.classify(
            self.store.undelivered_own(), (), self.policy_version, self.manifest.max_staleness
        )
        if verdict.too_stale:
            reason = f"no trainer holds it and it is older than version {self.policy_version} - S"
            self.store.mark_too_stale(sorted(verdict.too_stale), reason, now)
        self.delivery = self.store.delivery_status()

    async def _save_scores(self) -> None:
        snapshot = self.admission.scores.snapshot(time.time())
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peers, snapshot)

    async def _serve_rollouts(self, stream) -> None:  # type: ignore[no-untyped-def]
        async def lookup(ids: list[bytes]) -> list[bytes | None]:
            def read() -> list[bytes | None]:
                out: list[bytes | None] = []
                for rid in ids:
                    row = self.store.get_rollout(rid)
                    if row is None or row.body is None:
                        out.append(None)
                    else:
                        out.append(encode(RolloutRecord(header=row.header, body=row.body)))
                return out

            return await trio.to_thread.run_sync(read)

        active = self._serving.get(stream.peer, 0)
        if active >= MAX_SERVE_STREAMS_PER_PEER:
            self.counters["serve_refused"] += 1
            await stream.reset()  # a peer gets a few body streams at a time, not the store
            return
        self._serving[stream.peer] = active + 1
        try:
            n = await rollout_exchange.serve(stream, lookup)
        except rollout_exchange.BadRequest as exc:
            self.rejects["bad_request"] += 1
            self._apply(self.admission.handle(
                Misbehaved(stream.peer, BAD_REQUEST_PENALTY, "bad rollout request", time.time())
            ))
            self._spawn(self._save_scores)
            raise exc
        finally:
            left = self._serving.get(stream.peer, 1) - 1
            if left > 0:
                self._serving[stream.peer] = left
            else:
                self._serving.pop(stream.peer, None)
        self.counters["served"] += n

    async def _tick_loop(self) -> None:
        last_save = time.monotonic()
        while True:
            await trio.sleep(1.0)
            now = time.time()
            self._apply(self.admission.handle(Tick(now)))
            if time.monotonic() - last_save > SCORE_SAVE_INTERVAL_S:
                last_save = time.monotonic()
                snapshot = self.admission.scores.snapshot(now)
                with contextlib.suppress(StoreError):
                    await trio.to_thread.run_sync(self.store.save_peers, snapshot)
                    n = await trio.to_thread.run_sync(self.store.expire_bodyless, now - BODYLESS_TTL_S)
                    self.counters["bodyless_expired"] += n

    async def _ledger_loop(self) -> None:
        while True:
            batch = [await self._ledger_recv.receive()]
            while len(batch) < 256:
                try:
                    batch.append(self._ledger_recv.receive_nowait())
                except trio.WouldBlock:
                    break

            # Scores first, then the lines that explain them: a crash never keeps a
            # penalty's ledger line but forgets the penalty.
            await self._save_scores()
            with contextlib.suppress(StoreError):
                await trio.to_thread.run_sync(self.store.log_rejects, batch)


def _record_id(record: bytes) -> bytes | None:
    """The rollout id of record bytes (None when they are not a record)."""
    try:
        return content_id(decode(RolloutRecord, record).header)
    except RemoteProtocolError:
        return None


def _b58(peer: bytes | str) -> str:
    from protocol.identity import peer_id_to_b58

    return peer if isinstance(peer, str) else peer_id_to_b58(peer)


@contextlib.asynccontextmanager
async def open_peer(cfg: PeerConfig) -> AsyncIterator[Peer]:
    """Open the store, start the host, load bans, subscribe, dial the bootstrap peers.

    `peer.bootstrap_results` holds (addr, ok, error) for each bootstrap address.
    """
    store = await trio.to_thread.run_sync(Store.open, cfg.data_dir)
    weights_store = None
    try:
        weights_store = await trio.to_thread.run_sync(WeightsStore.open, cfg.data_dir)
        now = time.time()
        records = await trio.to_thread.run_sync(store.load_peers)
        admission = Admission(
            RunRules.from_manifest(cfg.manifest), cfg.admission, version=cfg.policy_version,
            scores=PeerScores(records=records),
        )
        async with open_host(cfg.identity.private_bytes(), list(cfg.listen), cfg.host) as host:
            peer = Peer(cfg, host, store, admission, weights_store)
            await _restore(peer, now)
            for rec in await trio.to_thread.run_sync(store.active_bans, now):
                await host.ban(str(rec.peer), max(1.0, rec.banned_until - now), "ban kept from before restart")
            async with trio.open_nursery() as nursery:
                peer._nursery = nursery
                for name, kind in TOPIC_KINDS.items():
                    channel = await host.subscribe(peer.topics[name], validator=peer._validator(kind))
                    nursery.start_soon(_discard, channel)  # delivery happens via admission
                for name, batch in BATCH_TOPICS.items():
                    channel = await host.subscribe(
                        topic_name(peer.run_id, batch), validator=peer._batch_validator(TOPIC_KINDS[name])
                    )
                    nursery.start_soon(_discard, channel)  # delivery happens via admission
                nursery.start_soon(peer.outbox.run)
                nursery.start_soon(peer._process_loop)
                nursery.start_soon(peer._ledger_loop)
                nursery.start_soon(peer._tick_loop)
                nursery.start_soon(peer._catch_up_loop)
                for _ in range(PULL_WORKERS):
                    nursery.start_soon(peer._pull_loop)
                if peer.weights is not None:
                    nursery.start_soon(peer.weights.run)
                if cfg.bootstrap:
                    peer.bootstrap_results = await peer.discovery.dial(list(cfg.bootstrap))
                nursery.start_soon(peer.discovery.redial_loop)
                try:
                    yield peer
                finally:
                    # Stopping loses no queued work: publish what the outbox holds, bounded.
                    with trio.CancelScope(shield=True), trio.move_on_after(cfg.drain_timeout_s):
                        peer.drained = await peer.outbox.drain()
                    with trio.CancelScope(shield=True), trio.move_on_after(5):
                        snapshot = admission.scores.snapshot(time.time())
                        with contextlib.suppress(StoreError):
                            await trio.to_thread.run_sync(store.save_peers, snapshot)
                    nursery.cancel_scope.cancel()
    finally:
        store.close()
        if weights_store is not None:
            weights_store.close()


async def _restore(peer: Peer, now: float) -> None:
    """Rebuild what lived only in memory before a restart: dedup memory, known signers
    and owed pulls."""
    ttl = peer.admission.config.dedup_ttl_s
    limit = peer.admission.config.dedup_entries
    headers, records, verdicts = await trio.to_thread.run_sync(peer.store.known_since, now - ttl, limit)
    for kind, ids in ((Kind.ROLLOUT_HEADER, headers + records), (Kind.ROLLOUT_RECORD, records),
                      (Kind.VERDICT, verdicts)):
        peer.admission.handle(Known(kind, tuple(ids), now))
    # Producers and validators we stored are not new identities after a restart.
    signers = await trio.to_thread.run_sync(
        peer.store.known_signers, now - ttl, peer.admission.config.max_signers
    )
    peer.admission.handle(Known(Kind.ROLLOUT_HEADER, (), now, signers=tuple(signers)))
    if peer.cfg.pull_bodies:
        for row in await trio.to_thread.run_sync(peer.store.missing_bodies, PULL_QUEUE // 2):
            sources = [_b58(row.producer)] + ([str(row.source_peer)] if row.source_peer else [])
            peer._want(row.rollout_id, sources)
        peer.counters["pulls_restored"] = len(peer._pulling)


async def _discard(channel: trio.MemoryReceiveChannel) -> None:  # type: ignore[type-arg]
    async for _ in channel:
        pass
