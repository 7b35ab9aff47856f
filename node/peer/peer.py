"""One running peer of a run: the IO shell around `protocol.admission`.

One way in: every event for admission (a gossip message from the GossipSub topic
validator, a pulled record, a role's report, a tick, a peer connecting, what a restart
restores) goes through `Peer.submit`, and one executor (`Peer._run`) carries out the
actions in the order admission returned them. A `Store` goes to the batched writer
(`node.store.writer`) and the actions after it run only once the item is durable
(Store-then-Forward), or, if the write fails, `StoreFailed` goes back to admission;
`Forward` makes the gossip validator accept (`protocol.forwarding`); `Deliver` reaches
the roles (an admitted header queues its body pull); `Reject` reaches counters, the log
and the ledger; `Disconnect`, `Ban` (stored first) and `Unban` reach the host.

The gossip validator answers with admission's verdict at once; a message still being
written is accepted `Later` (`node.host.gossip`): the host forwards it once it is durable,
so the validator never waits on the disk and GossipSub's 5 s budget is never at stake (a
write slower than `STORE_WAIT_S` still delivers, the message is only not forwarded from
here). A `HeaderBatch`'s headers are submitted together, so their
writes share one transaction. Bodies are pulled by `node.peer.body_puller` (rules:
`protocol.body_pull`); catch-up and the body server live in `node.peer.services`.
Everything lives inside `open_peer()`; leaving it drains the outbox, saves scores and
closes the host and the store.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import trio

from node.exchange import rollouts as rollout_exchange
from node.exchange import shards as shard_exchange
from node.exchange import sync as sync_exchange
from node.host.host import AGENT, Later, Misbehaviour, PeerEvent, SwarmHost, open_host
from node.host.reachability import open_reachability
from node.host.relay import open_relay
from node.peer.body_puller import BodyPuller
from node.peer.config import PACE_MARGIN, PeerConfig, SeqCounter
from node.peer.discovery import Discovery
from node.peer.dropped_by import DroppedBy
from node.peer.gossip import BATCH_TOPICS, TOPIC_KINDS, Outbox, topic_name
from node.peer.nat_upkeep import NatUpkeep
from node.peer.ports import Handled
from node.peer.services import BodyServer, CatchUpDriver, ask_newest, bad_request_event
from node.peer.stats import p99_ms, rtt_median_ms
from node.peer.upkeep import Upkeep
from node.store.ledger_writer import LedgerWriter
from node.store.store import RolloutRow, Store, StoreError, VerdictRow
from node.store.writer import PendingWrite, StoreWriter
from node.weights.store import WeightsStore
from node.weights.sync import WeightSync
from protocol import admission as adm
from protocol import catch_up as cu
from protocol.admission import (
    Admission,
    Admitted,
    Ban,
    Deliver,
    Disconnect,
    Forward,
    Kind,
    Known,
    MessageReceived,
    Misbehaved,
    PeerConnected,
    Reject,
    RunRules,
    StoreFailed,
    Unban,
    VersionChanged,
)
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import seal
from protocol.errors import RemoteProtocolError
from protocol.forwarding import GossipVerdict, batch_verdict
from protocol.identity import peer_id_to_b58
from protocol.peer_score import PeerScores
from protocol.rollout import check_body, open_header
from protocol.version_claims import AskNewest
from protocol.wire import (
    HeaderBatch,
    PeerHello,
    ProducerClaim,
    RolloutRecord,
    Verdict,
    WireObject,
)

log = logging.getLogger("swarm.peer")

ADMITTED_QUEUE = 4096
STORE_WAIT_S = 20.0  # a gossip message whose write takes longer is not forwarded from here
RESTORED_PULLS = 4096  # owed pulls queued again at start
VALIDATOR_WAITS_KEPT = 4096  # recent gossip validator waits, for the p99 in stats()


class Peer:
    """A joined peer (build one with `open_peer()`); roles drive it through:

    `produce(record)`, `publish_verdict(verdict)`, `on_deliver(callback)`, `report()`,
    `stats()`, plus `host`, `store`, `admission`, `discovery`, `identity`, `manifest`.
    It satisfies every protocol of `node.peer.ports`; its drivers (body puller, catch-up,
    body server, upkeep) are handed the pieces they use, not the peer.
    """

    def __init__(
        self,
        cfg: PeerConfig,
        host: SwarmHost,
        store: Store,
        admission: Admission,
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
            host,
            cfg.publish_rate_per_s,
            max_batch=cfg.header_batch,
            batch_topics={
                topic_name(self.run_id, t): topic_name(self.run_id, b)
                for t, b in BATCH_TOPICS.items()
            },
            item_rate_per_s=PACE_MARGIN * min(limits.signer_rate, limits.sender_rate),
            item_burst=PACE_MARGIN * min(limits.signer_burst, limits.sender_burst),
        )
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()
        self.dropped_by = DroppedBy()  # peers that keep closing our connections
        self.bootstrap_results: list[tuple[str, bool, str]] = []
        self.drained = 0  # queued messages published while stopping
        self.started_at = time.time()
        self.validator_waits: deque[float] = deque(maxlen=VALIDATOR_WAITS_KEPT)
        self.store_waits: deque[float] = deque(maxlen=VALIDATOR_WAITS_KEPT)  # accepted `Later`
        self._callbacks: list[Callable[[Admitted], None]] = []
        self._late_callbacks: list[Callable[[Admitted], None]] = []
        self.ledger = LedgerWriter(store, admission.scores, ADMITTED_QUEUE)
        self.upkeep = Upkeep(
            self,
            store,
            self.ledger.save_scores,
            self,
            cfg.manifest.max_staleness,
            cfg.pull.window_s,
            admission.config.dedup_ttl_s,
            cfg.store_max_bytes,
            self.counters,
        )
        self._nursery: trio.Nursery | None = None
        self.nat: NatUpkeep | None = None  # reachability and relays (set by open_peer)
        self.writer = StoreWriter(store, cfg.identity.peer_id, ADMITTED_QUEUE, self.counters)
        self.discovery = Discovery(
            host, self.run_id, self._hello_bytes, max_peers=cfg.max_peers, on_hello=self._on_hello
        )
        self.puller = (
            BodyPuller(
                host, self.run_id, self, store, self.discovery.book.known, self.counters, cfg.pull
            )
            if cfg.pull_bodies
            else None
        )
        self.catch_up = CatchUpDriver(
            host,
            self.run_id,
            store,
            cfg.identity.peer_id,
            cfg.pull_bodies,
            self,
            self,
            cfg.manifest.max_staleness,
            self.spawn,
            self.bad_request,
            self.counters,
        )
        self.body_server = BodyServer(self.run_id, store, self.counters, self.bad_request)
        self.topics = {name: topic_name(self.run_id, name) for name in TOPIC_KINDS}
        host.set_stream_handler(rollout_exchange.protocol_id(self.run_id), self.body_server.serve)
        host.set_stream_handler(sync_exchange.protocol_id(self.run_id), self.catch_up.serve)
        self.weights: WeightSync | None = None
        if weights_store is not None:
            self.weights = WeightSync(self, weights_store, cfg.weights)
            host.set_stream_handler(shard_exchange.protocol_id(self.run_id), self.weights.serve)
            self.on_deliver(self.weights.on_admitted)
        host.on_peer_event(self._on_peer_event)
        host.on_misbehaviour(self._on_misbehaviour)
        host.set_connection_scorer(lambda p: admission.scores.score(p, time.time()))

    # -- public ---------------------------------------------------------------------------

    def on_deliver(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every admitted item; runs on the event loop, must not block."""
        self._callbacks.append(callback)

    def on_late(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every authentic rollout refused only as too stale."""
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
            rows.append(
                RolloutRow(
                    rollout_id=rollout_id,
                    run_id=env.run_id,
                    producer=env.signer,
                    policy_version=env.policy_version,
                    header=rec.header,
                    body=rec.body,
                    received_at=time.time(),
                )
            )
        await trio.to_thread.run_sync(self.store.put_produced_many, rows)
        self.counters["produced"] += len(rows)
        await self.outbox.put_many(self.topics["rollouts"], [r.header for r in rows])
        return [r.rollout_id for r in rows]

    def seal(self, obj: WireObject) -> bytes:
        """`obj` in an envelope signed by this peer, with the next sequence number."""
        return seal(
            self.identity,
            obj,
            run_id=self.run_id,
            policy_version=self.policy_version,
            seq=self.seq.next(),
            timestamp_ms=int(time.time() * 1000),
        )

    async def publish_verdict(self, verdict: Verdict) -> bytes:
        """Sign, store and gossip a verdict; returns its id."""
        data = self.seal(verdict)
        vid = content_id(data)
        row = VerdictRow(
            vid,
            verdict.rollout_id,
            self.identity.peer_id,
            bool(verdict.passed),
            data,
            time.time(),
            verdict.reason,
        )
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

    def report(
        self, peer: bytes | str, penalty: float, reason: str, offence: str | None = None
    ) -> None:
        """A role found fault with `peer` (e.g. a failed audit): score it down by `penalty`
        (<= 0) through admission, which bans it below the threshold; `offence` names it in
        `protocol.penalties` (the ledger's reason)."""
        self.submit(Misbehaved(_b58(peer), penalty, reason, time.time(), offence=offence))

    def bad_request(self, peer: str, reason: str) -> None:
        """A peer sent a malformed request on one of our stream protocols."""
        self.rejects["bad_request"] += 1
        self.submit(bad_request_event(peer, reason))

    def set_policy_version(self, version: int) -> None:
        """Our current policy version (the newest installed): staleness is judged from it."""
        if version != self.policy_version:
            self.policy_version = version
            self.submit(VersionChanged(version, time.time()))

    def want_body(
        self, rollout_id: bytes, sources: Sequence[str], origin: tuple[bytes, str] | None = None
    ) -> None:
        """Pull the body of `rollout_id` (a no-op for peers that do not pull bodies)."""
        if self.puller is not None:
            self.puller.want(rollout_id, sources, origin)

    def body_wanted(self, rollout_id: bytes) -> bool:
        """Whether a pull of `rollout_id` is pending."""
        return self.puller is not None and self.puller.wanted(rollout_id)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start `fn(*args)` in the peer's nursery (nothing new starts while stopping)."""
        if self._nursery is None or self.host.closing:
            return
        self._nursery.start_soon(fn, *args)

    def stats(self) -> dict[str, object]:
        """The peer's figures for `status.json` and metrics."""
        return {
            "peer_id": self.host.peer_id,
            "roles": list(self.cfg.roles),
            "run": self.run_id,
            "policy_version": self.policy_version,
            "max_staleness": self.manifest.max_staleness,
            "peers": len(self.host.connected_peers()),
            "known_peers": len(self.discovery.book),
            "banned": self.host.banned_count(),
            "dropped_by": self.dropped_by.status(time.time()),
            "counters": dict(self.counters),
            "rejected": dict(self.rejects),
            "outbox_pending": self.outbox.pending(),
            "header_batches": self.outbox.stats.batches,
            "header_batch_mean": (
                round(self.outbox.stats.batched / self.outbox.stats.batches, 2)
                if self.outbox.stats.batches
                else None
            ),
            "pull_pending": self.puller.pending() if self.puller is not None else 0,
            "store_pending": self.writer.pending(),
            "validator_wait_ms_p99": p99_ms(self.validator_waits),
            "forward_after_store_ms_p99": p99_ms(self.store_waits),
            "delivery": dict(self.catch_up.delivery),
            "uptime_s": round(time.time() - self.started_at, 1),
            "rtt_ms_median": rtt_median_ms(self.host),
            "weights": self.weights.status() if self.weights is not None else None,
            **(self.nat.stats() if self.nat is not None else {}),
        }

    # -- the one way in, and the one executor -------------------------------------------

    def submit(self, event: adm.Event) -> Handled:
        """Hand one event to admission and carry out its actions."""
        handled = Handled(self.admission.handle(event))
        self._run(handled.actions, handled)
        return handled

    async def admit(
        self,
        sender: str,
        kind: Kind,
        data: bytes,
        origin: str | None = None,
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
                rest = actions[i + 1 :]

                def then(
                    ok: bool, item: Admitted = action.item, rest: Sequence[adm.Action] = rest
                ) -> None:
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
        elif isinstance(action, adm.Penalized):
            self.rejects[action.reason] += 1
            log.info(
                "%s pays %g for %s (%s): %s",
                str(action.peer)[:16],
                action.penalty,
                action.reason,
                action.stage,
                action.detail,
            )
            self.ledger.put(action)
        elif isinstance(action, Disconnect):
            self.spawn(self.host.disconnect, action.peer, f"admission: {action.reason}")
        elif isinstance(action, Ban):
            self.host.goodbyes.expect(str(action.peer))  # its disconnects wait for the goodbye
            last = [
                a.reason
                for a in handled.actions
                if isinstance(a, Disconnect) and a.peer == action.peer
            ]
            self.spawn(self._ban, action, str(last[0]) if last else "-")
        elif isinstance(action, Unban):
            self.host.unban(str(action.peer))
        elif isinstance(action, AskNewest):
            self.spawn(ask_newest, self.host, self.run_id, self, self.weights is not None, action)
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
            log.info(
                "refused %s from %s: %s %s (%+g)",
                action.kind or "message",
                str(action.peer)[:16],
                action.reason,
                action.detail,
                action.penalty,
            )
            self.ledger.put(action)

    def _deliver(self, item: Admitted) -> None:
        if item.kind is Kind.ROLLOUT_HEADER:
            self.want_body(
                item.content_id,
                [_b58(item.signer), str(item.sender)],
                origin=(item.signer, str(item.sender)),
            )
        for callback in list(self._callbacks):
            callback(item)

    async def _ban(self, action: Ban, last: str) -> None:
        self.counters["bans"] += 1
        # Stored before it takes effect: a stop during the host's disconnect keeps it.
        with contextlib.suppress(StoreError):
            await trio.to_thread.run_sync(self.store.save_peer, action.record)
        await self.host.ban(
            str(action.peer),
            max(1.0, action.until - time.time()),
            f"score below threshold after {action.record.offences} offences, the last {last}",
        )

    # -- gossip validators ----------------------------------------------------------------

    def _validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool | Later]]:
        """GossipSub's validator: admission's answer at once; a message whose write is
        still pending is accepted `Later`, once it is durable (Store-then-Forward)."""

        async def check(sender: str, data: bytes, origin: str) -> bool | Later:
            t0 = time.monotonic()
            self.counters[f"in_{kind}"] += 1
            handled = self.submit(MessageReceived(sender, kind, data, time.time(), origin))
            return self._answer(t0, [handled], lambda: handled.verdict)

        return check

    def _batch_validator(self, kind: Kind) -> Callable[[str, bytes, str], Awaitable[bool | Later]]:
        """A `HeaderBatch`: each header admitted on its own, exactly as if it came alone,
        all submitted together (their writes share a transaction); the batch gets one
        answer (`protocol.forwarding.batch_verdict`). Broken framing goes to admission
        whole (it fails there as a malformed message of `kind`)."""

        async def check(sender: str, data: bytes, origin: str) -> bool | Later:
            t0 = time.monotonic()
            try:
                batch = decode(HeaderBatch, data)
            except RemoteProtocolError:
                self.submit(MessageReceived(sender, kind, data, time.time(), origin))
                return False
            self.counters["in_header_batch"] += 1
            self.counters[f"in_{kind}"] += len(batch.headers)
            now = time.time()
            handled = [
                self.submit(MessageReceived(sender, kind, item, now, origin))
                for item in batch.headers
            ]
            return self._answer(t0, handled, lambda: batch_verdict(h.verdict for h in handled))

        return check

    def _answer(
        self, t0: float, handled: list[Handled], verdict: Callable[[], GossipVerdict]
    ) -> bool | Later:
        """The validator's answer now, or `Later` when a write is still pending (or when any
        of the messages will be judged bad: then the answer is False at once)."""
        self.validator_waits.append(time.monotonic() - t0)
        if all(h.done.is_set() for h in handled) or verdict() is GossipVerdict.REJECT:
            return verdict() is GossipVerdict.ACCEPT

        async def stored() -> bool:
            t1 = time.monotonic()
            with trio.move_on_after(STORE_WAIT_S):
                for h in handled:
                    await h.done.wait()
            self.store_waits.append(time.monotonic() - t1)
            if not all(h.done.is_set() for h in handled):
                self.counters["forward_store_late"] += 1
            return verdict() is GossipVerdict.ACCEPT

        return Later(stored)

    # -- peers ----------------------------------------------------------------------------

    def _hello_bytes(self) -> bytes:
        hello = PeerHello(
            roles=tuple(self.cfg.roles),
            policy_version=self.policy_version,
            listen_addrs=tuple(self.nat.own_addrs() if self.nat else self.host.listen_addrs()[:16]),
            agent=AGENT,
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
        self.dropped_by.on_event(event.kind, event.peer, event.reason, time.time(), event.until)
        if event.kind == "connected":
            self.submit(PeerConnected(event.peer, time.time()))
            self.catch_up.handle(cu.PeerJoined(event.peer, time.time()))
        else:
            self.catch_up.handle(cu.PeerLeft(event.peer, time.time()))
            if self.weights is not None:
                self.weights.on_peer_gone(event.peer)

    def _on_misbehaviour(self, m: Misbehaviour) -> None:
        """The host counted a peer past a GossipSub control limit (and dropped the excess)."""
        self.submit(Misbehaved(m.peer, m.penalty, m.detail, time.time(), offence=m.reason))


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
        # From the first message on, at the newest version we hold (a restarted trainer
        # refuses rollouts of versions above its own: it must know them before any arrive).
        installed = await trio.to_thread.run_sync(weights_store.installed)
        admission = Admission(
            RunRules.from_manifest(cfg.manifest),
            cfg.admission,
            version=max([cfg.policy_version, *installed]),
            scores=PeerScores(records=records),
        )
        async with (
            open_host(cfg.identity.private_bytes(), list(cfg.listen), cfg.host) as host,
            open_relay(host, cfg.relay if "relay" in cfg.roles else None) as relay,
            open_reachability(host) as reach,
        ):
            peer = Peer(cfg, host, store, admission, weights_store)
            peer.nat = NatUpkeep(host, relay, reach, cfg.bootstrap, greet=peer.discovery.greet)
            await _restore(peer, now)
            for rec in await trio.to_thread.run_sync(store.active_bans, now):
                await host.ban(
                    str(rec.peer), max(1.0, rec.banned_until - now), "ban kept from before restart"
                )
            async with trio.open_nursery() as nursery:
                peer._nursery = nursery
                await _subscribe(peer, nursery)
                for loop in (
                    peer.outbox.run,
                    peer.writer.run,
                    peer.ledger.run,
                    peer.upkeep.run,
                    peer.catch_up.run,
                ):
                    nursery.start_soon(loop)
                if peer.puller is not None:
                    nursery.start_soon(peer.puller.run)
                if peer.weights is not None:
                    nursery.start_soon(peer.weights.run)
                if cfg.bootstrap:
                    peer.bootstrap_results = await peer.discovery.dial(list(cfg.bootstrap))
                nursery.start_soon(peer.discovery.redial_loop)
                nursery.start_soon(peer.nat.run)
                try:
                    yield peer
                finally:
                    # Stopping loses no queued work: publish what the outbox holds, bounded.
                    with trio.move_on_after(cfg.drain_timeout_s) as scope:
                        scope.shield = True
                        peer.drained = await peer.outbox.drain()
                    with trio.move_on_after(5) as scope:
                        scope.shield = True
                        await peer.ledger.save_scores()
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
    headers, records, verdicts = await trio.to_thread.run_sync(
        peer.store.known_since, now - ttl, limit
    )
    for kind, ids in (
        (Kind.ROLLOUT_HEADER, headers + records),
        (Kind.ROLLOUT_RECORD, records),
        (Kind.VERDICT, verdicts),
    ):
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
