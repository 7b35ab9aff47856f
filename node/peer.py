"""One running peer of a run: the IO shell around `protocol.admission`.

One way in: every event for admission (a gossip message from the GossipSub topic
validator, a pulled record, a role's report, a tick, a peer connecting, what a restart
restores) goes through `Peer.submit`, and one executor (`Peer._run`) carries out the
returned actions in the order admission returned them:

    Store      -> the batched writer (`node.store_writer`); the actions after it run
                  only once the item is durable (Store-then-Forward), or, if the write
                  fails, `StoreFailed` goes back to admission and the rest is dropped
    Forward    -> the gossip validator answers accept (`protocol.forwarding`)
    Deliver    -> the role's callbacks; an admitted header queues its body pull
    Reject     -> counters, the log and the ledger (with its reason)
    Disconnect / Ban / Unban -> the host (a ban is stored before it takes effect)
    AskNewest  -> ask the peer to back a version it claimed

The gossip validator waits for its message's actions (bounded by `STORE_WAIT_S`, under
py-libp2p's 5 s limit); a write that takes longer still completes and delivers, only
the message is not forwarded from here. The headers of a `HeaderBatch` are submitted
together, so their writes share one transaction.

Bodies are pulled by `node.body_puller` (rules: `protocol.body_pull`), catch-up and the
body server live in `node.peer_services` (rules: `protocol.catch_up`). Everything lives
inside `open_peer()`; leaving it drains the outbox, saves scores, cancels the loops and
closes the host and the store. A remote fault never raises out of a loop: it becomes a
`Reject` (score change), a failed pull (retried, bounded) or a dropped peer.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from node import rollout_exchange, shard_exchange, sync_exchange
from node.body_puller import BodyPuller
from node.discovery import Discovery
from node.dropped_by import DroppedBy
from node.gossip import BATCH_TOPICS, TOPIC_KINDS, Outbox, topic_name
from node.host import AGENT, HostSettings, PeerError, PeerEvent, SwarmHost, open_host
from node.peer_services import BodyServer, CatchUpDriver, bad_request_event
from node.store import RolloutRow, Store, StoreError, VerdictRow
from node.store_writer import PendingWrite, StoreWriter
from node.weights_store import WeightsStore
from node.weights_sync import WeightSettings, WeightSync
from protocol import admission as adm
from protocol import body_pull as bp
from protocol import catch_up as cu
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Admitted,
    Ban,
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
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.errors import RemoteProtocolError
from protocol.forwarding import GossipVerdict, batch_verdict, verdict_of
from protocol.identity import Identity, peer_id_to_b58
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

ADMITTED_QUEUE = 4096
PACE_MARGIN = 0.8  # share of the peers' per-producer rate and burst a node publishes at
SCORE_SAVE_INTERVAL_S = 15.0  # rewards; a penalty is saved with its ledger line
ASK_NEWEST_S = 10.0  # a sender backs a future version it handed us within this
STORE_WAIT_S = 4.0  # under py-libp2p's 5 s limit on an async topic validator
RESTORED_PULLS = 4096  # owed pulls queued again at start
VALIDATOR_WAITS_KEPT = 4096
BODYLESS_CHECK_S = 5.0  # how often headers past the pull window are forgotten  # recent gossip validator waits, for the p99 in stats()


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
    pull: bp.PullConfig = field(default_factory=bp.PullConfig)
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
class Handled:
    """What became of one event handed to admission (`Peer.submit`). `done` is set once
    every action ran (after the store write, if there was one)."""

    actions: list[adm.Action]
    done: trio.Event = field(default_factory=trio.Event)
    forward: bool = False
    admitted: bool = False  # delivered to the roles
    duplicate: bool = False
    store_failed: bool = False

    @property
    def accepted(self) -> bool:
        """Forwarded or delivered: admission took it."""
        return self.forward or self.admitted

    @property
    def verdict(self) -> GossipVerdict:
        """Accept / ignore / reject at the GossipSub boundary; a message whose write has
        not finished (or failed) is ignored here, never rejected."""
        v = verdict_of(self.actions)
        if v is GossipVerdict.ACCEPT and (self.store_failed or not self.done.is_set()):
            return GossipVerdict.IGNORE
        return v


class Peer:
    """A joined peer (build one with `open_peer()`); roles drive it through:

    `produce(record)`, `publish_verdict(verdict)`, `on_deliver(callback)`, `report()`,
    `stats()`, plus `host`, `store`, `admission`, `discovery`, `identity`, `manifest`.
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
        # Peers admit at most `signer_rate` items a second from one producer (their
        # admission settings, assumed to be ours): publish a margin below it.
        limits = admission.config
        self.outbox = Outbox(
            host, cfg.publish_rate_per_s, max_batch=cfg.header_batch,
            batch_topics={topic_name(self.run_id, t): topic_name(self.run_id, b)
                          for t, b in BATCH_TOPICS.items()},
            item_rate_per_s=PACE_MARGIN * min(limits.signer_rate, limits.sender_rate),
            item_burst=PACE_MARGIN * min(limits.signer_burst, limits.sender_burst),
        )
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()
        self.dropped_by = DroppedBy()  # peers that keep closing our connections
        self.bootstrap_results: list[tuple[str, bool, str]] = []
        self.drained = 0  # queued messages published while stopping
        self.started_at = time.time()
        self.delivery: dict[str, int] = {}
        self.validator_waits: deque[float] = deque(maxlen=VALIDATOR_WAITS_KEPT)
        self._callbacks: list[Callable[[Admitted], None]] = []
        self._late_callbacks: list[Callable[[Admitted], None]] = []
        self._ledger_send, self._ledger_recv = trio.open_memory_channel[tuple[Reject, float]](ADMITTED_QUEUE)
        self._nursery: trio.Nursery | None = None
        self.writer = StoreWriter(store, cfg.identity.peer_id, ADMITTED_QUEUE, self.counters)
        self.puller = BodyPuller(self, cfg.pull) if cfg.pull_bodies else None
        self.catch_up = CatchUpDriver(self)
        self.body_server = BodyServer(self)
        self.discovery = Discovery(
            host, self.run_id, self._hello_bytes, max_peers=cfg.max_peers, on_hello=self._on_hello
        )
        self.topics = {name: topic_name(self.run_id, name) for name in TOPIC_KINDS}
        host.set_stream_handler(rollout_exchange.protocol_id(self.run_id), self.body_server.serve)
        host.set_stream_handler(sync_exchange.protocol_id(self.run_id), self.catch_up.serve)
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
            # Our own bytes, checked as anyone will check them (a failure is our bug).
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

    async def publish_delegation(self, validator: bytes, granted: bool) -> bytes:
        """Grant (or revoke) `validator` the right to judge; only a trainer key's counts."""
        data = self.seal(Delegation(validator=validator, granted=granted))
        await self.admit(self.host.peer_id, Kind.DELEGATION, data)  # applies to us as well
        await self.outbox.put(self.topics["delegations"], data)
        return content_id(data)

    def report(self, peer: bytes | str, penalty: float, reason: str) -> None:
        """A role found fault with `peer` (e.g. a failed audit): score it down by `penalty`
        (<= 0) through admission, which bans it below the threshold."""
        self.submit(Misbehaved(_b58(peer), penalty, reason, time.time()))

    def bad_request(self, peer: str, reason: str) -> None:
        """A peer sent a malformed request on one of our stream protocols."""
        self.rejects["bad_request"] += 1
        self.submit(bad_request_event(peer, reason))

    def set_policy_version(self, version: int) -> None:
        """Our current policy version (the newest installed): staleness is judged from it."""
        if version != self.policy_version:
            self.policy_version = version
            self.submit(VersionChanged(version, time.time()))

    def want_body(self, rollout_id: bytes, sources: Sequence[str],
                  origin: tuple[bytes, str] | None = None) -> None:
        """Pull the body of `rollout_id` (a no-op for peers that do not pull bodies)."""
        if self.puller is not None:
            self.puller.want(rollout_id, sources, origin)

    def body_wanted(self, rollout_id: bytes) -> bool:
        return self.puller is not None and self.puller.wanted(rollout_id)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start `fn(*args)` in the peer's nursery (nothing new starts while stopping)."""
        if self._nursery is None or self.host._closing:
            return
        self._nursery.start_soon(fn, *args)

    def stats(self) -> dict[str, object]:
        waits = sorted(self.validator_waits)
        return {
            "peer_id": self.host.peer_id,
            "roles": list(self.cfg.roles),
            "run": self.run_id,
            "policy_version": self.policy_version,
            "peers": len(self.host.connected_peers()),
            "known_peers": len(self.discovery.book),
            "banned": self.host.banned_count(),
            "dropped_by": self.dropped_by.status(time.time()),
            "counters": dict(self.counters),
            "rejected": dict(self.rejects),
            "outbox_pending": self.outbox.pending(),
            "header_batches": self.outbox.stats.batches,
            "header_batch_mean": (round(self.outbox.stats.batched / self.outbox.stats.batches, 2)
                                  if self.outbox.stats.batches else None),
            "pull_pending": self.puller.pending() if self.puller is not None else 0,
            "store_pending": self.writer.pending(),
            "validator_wait_ms_p99": (round(waits[int(0.99 * (len(waits) - 1))] * 1000, 2)
                                      if waits else None),
            "delivery": dict(self.delivery),
            "uptime_s": round(time.time() - self.started_at, 1),
            "rtt_ms_median": self._rtt_median_ms(),
            "weights": self.weights.status() if self.weights is not None else None,
        }

    def _rtt_median_ms(self) -> float | None:
        rtts = sorted(r for p in self.host.connected_peers() if (r := self.host.peer_rtt(p)) == r)
        return round(rtts[len(rtts) // 2] * 1000, 3) if rtts else None

    # -- the one way in, and the one executor -------------------------------------------

    def submit(self, event: adm.Event) -> Handled:
        """Hand one event to admission and carry out its actions (see the module doc)."""
        handled = Handled(self.admission.handle(event))
        self._run(handled.actions, handled)
        return handled

    async def admit(
        self, sender: str, kind: Kind, data: bytes, origin: str | None = None,
        wait_s: float | None = None,
    ) -> Handled:
        """Admit a message from `sender` and wait until its actions ran (at most `wait_s`:
        the actions after a slow write still run when it completes)."""
        self.counters[f"in_{kind}"] += 1
        handled = self.submit(MessageReceived(sender, kind, data, time.time(), origin))
        with trio.move_on_after(float("inf") if wait_s is None else wait_s):
            await handled.done.wait()
        return handled

    def _run(self, actions: Sequence[adm.Action], handled: Handled) -> None:
        for i, action in enumerate(actions):
            if isinstance(action, adm.Store):
                rest = actions[i + 1:]

                def then(ok: bool, item: Admitted = action.item, rest: Sequence[adm.Action] = rest) -> None:
                    if ok:
                        self._run(rest, handled)
                        return
                    handled.store_failed = True
                    self.submit(StoreFailed(item, time.time()))
                    handled.done.set()

                if not self.writer.put(PendingWrite(action.item, then)):
                    then(False)
                return
            self._act(action, handled)
        handled.done.set()

    def _act(self, action: adm.Action, handled: Handled) -> None:
        if isinstance(action, Forward):
            handled.forward = True
        elif isinstance(action, Deliver):
            handled.admitted = True
            self._deliver(action.item)
        elif isinstance(action, Reject):
            self._rejected(action, handled)
        elif isinstance(action, Disconnect):
            self.spawn(self.host.disconnect, action.peer, f"admission: {action.reason}")
        elif isinstance(action, Ban):
            self.spawn(self._ban, action)
        elif isinstance(action, Unban):
            self.host.unban(str(action.peer))
        elif isinstance(action, AskNewest):
            self.spawn(self._ask_newest, action)
        else:
            raise AssertionError(f"no executor for {type(action).__name__}")

    def _rejected(self, action: Reject, handled: Handled) -> None:
        self.rejects[str(action.reason)] += 1
        if action.reason == "duplicate":
            handled.duplicate = True
        if action.late is not None:
            for callback in list(self._late_callbacks):
                callback(action.late)
        if action.penalty < 0:
            log.info("refused %s from %s: %s %s (%+g)", action.kind or "message",
                     str(action.peer)[:16], action.reason, action.detail, action.penalty)
            with contextlib.suppress(trio.WouldBlock):
                self._ledger_send.send_nowait((action, time.time()))

    def _deliver(self, item: Admitted) -> None:
        if item.kind is Kind.ROLLOUT_HEADER:
            self.want_body(item.content_id, [_b58(item.signer), str(item.sender)],
                           origin=(item.signer, str(item.sender)))
        for callback in list(self._callbacks):
            callback(item)

    async def _ban(self, action: Ban) -> None:
        self.counters["bans"] += 1
        # Stored before it takes effect: the host's ban awaits a disconnect, and a stop
        # arriving there would otherwise leave a ban in force that a restart forgets.
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peer, action.record)
        await self.host.ban(str(action.peer), max(1.0, action.until - time.time()), "score below threshold")

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
        handled = self.submit(NewestShown(ask.peer, env, time.time(), answered))
        # Only a backing manifest goes on to the weights (an unbacked answer was charged
        # once already, and is not opened a second time).
        if env is not None and self.weights is not None and not handled.actions:
            await self.admit(peer, Kind.WEIGHT_MANIFEST, env)

    # -- gossip validators ----------------------------------------------------------------

    def _validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool]]:
        async def check(sender: str, data: bytes, origin: str) -> bool:
            t0 = time.monotonic()
            handled = await self.admit(sender, kind, data, origin, wait_s=STORE_WAIT_S)
            self._waited(t0, [handled])
            return handled.verdict is GossipVerdict.ACCEPT

        return check

    def _batch_validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool]]:
        """A `HeaderBatch`: each header admitted on its own, exactly as if it came alone,
        all submitted before any is awaited (their writes share a transaction); the batch
        gets one answer (`protocol.forwarding.batch_verdict`). Broken framing goes to
        admission whole (it fails there as a malformed message of `kind`)."""

        async def check(sender: str, data: bytes, origin: str) -> bool:
            t0 = time.monotonic()
            try:
                batch = decode(HeaderBatch, data)
            except RemoteProtocolError:
                await self.admit(sender, kind, data, origin, wait_s=STORE_WAIT_S)
                return False
            self.counters["in_header_batch"] += 1
            self.counters[f"in_{kind}"] += len(batch.headers)
            now = time.time()
            handled = [self.submit(MessageReceived(sender, kind, item, now, origin))
                       for item in batch.headers]
            with trio.move_on_after(STORE_WAIT_S):
                for h in handled:
                    await h.done.wait()
            self._waited(t0, handled)
            return batch_verdict(h.verdict for h in handled) is GossipVerdict.ACCEPT

        return check

    def _waited(self, t0: float, handled: list[Handled]) -> None:
        self.validator_waits.append(time.monotonic() - t0)
        if not all(h.done.is_set() for h in handled):
            self.counters["validator_store_late"] += 1

    # -- peers ----------------------------------------------------------------------------

    def _hello_bytes(self) -> bytes:
        hello = PeerHello(
            roles=tuple(self.cfg.roles), policy_version=self.policy_version,
            listen_addrs=tuple(self.host.listen_addrs()[:16]), agent=AGENT,
        )
        return self.seal(hello)

    def _on_hello(self, peer: str, hello: PeerHello) -> None:
        self.counters["hellos"] += 1
        trainer = "trainer" in hello.roles
        self.catch_up.handle(cu.PeerJoined(peer, time.time(), receipts_from=trainer))
        if self.weights is not None:
            self.weights.on_hello(peer, hello.policy_version)

    def _on_peer_event(self, event: PeerEvent) -> None:
        self.counters[f"peer_{event.kind}"] += 1
        if event.kind == "disconnected":  # the remote closed it (ours are "dropped")
            if self.dropped_by.closed(event.peer, time.time(), event.reason):
                log.warning(
                    "peer %s keeps closing our connections (%d in %g s; last: %s): it may "
                    "have banned us or find us over its limits", event.peer,
                    self.dropped_by.threshold, self.dropped_by.window_s, event.reason or "-",
                )
        elif event.kind == "banned":
            self.dropped_by.forget(event.peer)
        if event.kind == "connected":
            self.submit(PeerConnected(event.peer, time.time()))
            self.catch_up.handle(cu.PeerJoined(event.peer, time.time()))
        else:
            self.catch_up.handle(cu.PeerLeft(event.peer, time.time()))
            if self.weights is not None:
                self.weights.on_peer_gone(event.peer)

    # -- loops ----------------------------------------------------------------------------

    async def _save_scores(self) -> None:
        snapshot = self.admission.scores.snapshot(time.time())
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peers, snapshot)

    async def _tick_loop(self) -> None:
        last_save = last_expiry = time.monotonic()
        window_s = self.cfg.pull.window_s
        while True:
            await trio.sleep(1.0)
            now = time.time()
            self.submit(Tick(now))
            if time.monotonic() - last_save > SCORE_SAVE_INTERVAL_S:
                last_save = time.monotonic()
                await self._save_scores()
            if time.monotonic() - last_expiry > min(BODYLESS_CHECK_S, window_s):
                last_expiry = time.monotonic()
                with contextlib.suppress(StoreError):
                    # A header whose body nobody served within the pull window is forgotten.
                    n = await trio.to_thread.run_sync(self.store.expire_bodyless, now - window_s)
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


def _b58(peer: bytes | str) -> str:
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
                await _subscribe(peer, nursery)
                for loop in (peer.outbox.run, peer.writer.run, peer._ledger_loop, peer._tick_loop,
                             peer.catch_up.run):
                    nursery.start_soon(loop)
                if peer.puller is not None:
                    nursery.start_soon(peer.puller.run)
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
                        await peer._save_scores()
                    nursery.cancel_scope.cancel()
    finally:
        store.close()
        if weights_store is not None:
            weights_store.close()


async def _subscribe(peer: Peer, nursery: trio.Nursery) -> None:
    for name, kind in TOPIC_KINDS.items():
        channel = await peer.host.subscribe(peer.topics[name], validator=peer._validator(kind))
        nursery.start_soon(_discard, channel)  # delivery happens via admission
    for name, batch in BATCH_TOPICS.items():
        channel = await peer.host.subscribe(
            topic_name(peer.run_id, batch), validator=peer._batch_validator(TOPIC_KINDS[name])
        )
        nursery.start_soon(_discard, channel)


async def _restore(peer: Peer, now: float) -> None:
    """Rebuild what lived only in memory before a restart: dedup memory, known signers
    and owed pulls (headers stored without a body)."""
    ttl = peer.admission.config.dedup_ttl_s
    limit = peer.admission.config.dedup_entries
    headers, records, verdicts = await trio.to_thread.run_sync(peer.store.known_since, now - ttl, limit)
    for kind, ids in ((Kind.ROLLOUT_HEADER, headers + records), (Kind.ROLLOUT_RECORD, records),
                      (Kind.VERDICT, verdicts)):
        peer.submit(Known(kind, tuple(ids), now))
    # Producers and validators we stored are not new identities after a restart.
    signers = await trio.to_thread.run_sync(
        peer.store.known_signers, now - ttl, peer.admission.config.max_signers
    )
    peer.submit(Known(Kind.ROLLOUT_HEADER, (), now, signers=tuple(signers)))
    if peer.puller is not None:
        for row in await trio.to_thread.run_sync(peer.store.missing_bodies, RESTORED_PULLS):
            sources = [_b58(row.producer)] + ([str(row.source_peer)] if row.source_peer else [])
            peer.want_body(row.rollout_id, sources)
        peer.counters["pulls_restored"] = peer.puller.pending()


async def _discard(channel: trio.MemoryReceiveChannel) -> None:  # type: ignore[type-arg]
    async for _ in channel:
        pass
