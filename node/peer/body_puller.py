"""Pulling rollout bodies: the IO side of `protocol.body_pull`.

The schedule decides whom to ask and when, and whom a missing body costs; this module
asks (`node.exchange.rollouts.pull`, several ids a request, a few requests at once), runs
each pulled record through the peer's admission, and tells the schedule what came of it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import trio

from node.exchange import rollouts as rollout_exchange
from node.host.host import PeerError, PeerUnreachable, SwarmHost
from node.peer.ports import Admit
from node.store.store import Store, StoreError
from protocol import body_pull as bp
from protocol import penalties
from protocol.admission import BodyMissing, Kind, Misbehaved
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.errors import RemoteProtocolError
from protocol.peer_score import PeerId
from protocol.wire import RolloutRecord

log = logging.getLogger("swarm.peer")

CONCURRENT_FETCHES = 3
IDLE_WAKE_S = 1.0  # looks at the schedule at least this often (parked pulls, new peers)


class BodyPuller:
    """Every body pull of one peer (started by `Peer` for roles that pull bodies).

    `admit` takes each pulled record (and the charges and give-ups of the schedule),
    `store` says which bodies are held already, `known_peers()` lists the peers the
    address book can reach besides the connected ones."""

    def __init__(
        self,
        host: SwarmHost,
        run_id: str,
        admit: Admit,
        store: Store,
        known_peers: Callable[[], Iterable[str]],
        counters: Counter[str],
        config: bp.PullConfig | None = None,
    ) -> None:
        self.host = host
        self.run_id = run_id
        self.admission = admit
        self.store = store
        self.known_peers = known_peers
        self.schedule = bp.PullSchedule(config or bp.PullConfig())
        self.counters = counters
        self._wake = trio.Event()
        self._fetches = trio.Semaphore(CONCURRENT_FETCHES)

    def want(
        self, rollout_id: bytes, sources: Sequence[str], origin: tuple[bytes, str] | None = None
    ) -> None:
        """Pull `rollout_id` from `sources` (ourselves left out); `origin` (signer, sender)
        is told to admission if nobody serves it."""
        me = self.host.peer_id
        sources = tuple(s for s in dict.fromkeys(sources) if s and s != me)
        self.schedule.handle(bp.Want(rollout_id, sources, time.time(), origin))
        self._wake.set()

    def pending(self) -> int:
        """How many pulls are scheduled."""
        return len(self.schedule)

    def wanted(self, rollout_id: bytes) -> bool:
        """Whether a pull of `rollout_id` is scheduled."""
        return rollout_id in self.schedule

    async def run(self) -> None:
        """Carry out the schedule until cancelled, at least every `IDLE_WAKE_S`."""
        async with trio.open_nursery() as nursery:
            while True:
                now = time.time()
                due = bp.Due(
                    now,
                    frozenset(self.host.connected_peers()),
                    frozenset(self.known_peers()),
                )
                self._carry_out(self.schedule.handle(due), nursery)
                nxt = self.schedule.next_due()
                wait = IDLE_WAKE_S if nxt is None else min(IDLE_WAKE_S, max(0.01, nxt - now))
                with trio.move_on_after(wait):
                    await self._wake.wait()
                self._wake = trio.Event()

    def _carry_out(self, actions: list[bp.Action], nursery: trio.Nursery | None) -> None:
        for a in actions:
            if isinstance(a, bp.Fetch):
                assert nursery is not None, "fetches come only from Due"
                nursery.start_soon(self._fetch, a)
            elif isinstance(a, bp.Charge):
                self.counters[f"pull_charge_{a.offence}"] += 1
                cost = penalties.BY_NAME[a.offence].cost
                self.admission.submit(
                    Misbehaved(str(a.peer), cost, "body pull", time.time(), offence=a.offence)
                )
            elif isinstance(a, bp.GiveUp):
                self.counters["pull_gave_up"] += 1
                if a.origin is not None:
                    signer, sender = a.origin
                    event = BodyMissing(
                        cast(bytes, a.rollout_id),
                        cast(bytes, signer),
                        cast(PeerId, sender),
                        a.now,
                        a.answered,
                    )
                    self.admission.submit(event)
            elif isinstance(a, bp.Done):
                self.counters["pull_done"] += 1

    def _answer(self, rid: bytes, source: str, outcome: bp.Outcome) -> None:
        self._carry_out(self.schedule.handle(bp.Answered(rid, source, outcome, time.time())), None)
        self._wake.set()

    async def _fetch(self, f: bp.Fetch) -> None:
        source, ids = str(f.source), cast(list[bytes], list(f.ids))
        async with self._fetches:
            try:
                held = await trio.to_thread.run_sync(self.store.bodies_held, ids)
            except StoreError:
                held = set()
            for rid in ids:
                if rid in held:
                    self.counters["pull_skipped_held"] += 1
                    self._answer(rid, source, bp.Outcome.HELD)
            ids = [rid for rid in ids if rid not in held]
            if not ids:
                return
            try:
                records = await rollout_exchange.pull(self.host, source, self.run_id, ids)
            except PeerUnreachable as exc:
                self._failed(source, ids, bp.Outcome.UNREACHABLE, exc)
                return
            except PeerError as exc:  # timed out on an open stream, or an oversized frame
                self._failed(source, ids, bp.Outcome.SILENT, exc)
                return
            async with trio.open_nursery() as nursery:  # the records' stores share a batch
                for rid, rec in zip(ids, records, strict=True):
                    nursery.start_soon(self._take, source, rid, rec)

    def _failed(self, source: str, ids: list[bytes], outcome: bp.Outcome, exc: Exception) -> None:
        log.info("pull from %s failed: %s", source[:12], exc)
        self.counters["pull_errors"] += 1
        for rid in ids:
            self._answer(rid, source, outcome)

    async def _take(self, source: str, rid: bytes, rec: bytes | None) -> None:
        if rec is None:
            self._answer(rid, source, bp.Outcome.EMPTY)
            return
        if _record_id(rec) != rid:
            self._answer(rid, source, bp.Outcome.WRONG_RECORD)
            return
        self.counters["pulled"] += 1
        handled = await self.admission.admit(source, Kind.ROLLOUT_RECORD, rec)
        if handled.admitted or handled.duplicate:
            outcome = bp.Outcome.SERVED
        elif handled.store_failed:
            outcome = bp.Outcome.LOCAL_FAILURE
        else:
            outcome = bp.Outcome.BAD_BODY
        self._answer(rid, source, outcome)


def _record_id(record: bytes) -> bytes | None:
    """The rollout id of record bytes (None when they are not a record)."""
    try:
        return content_id(decode(RolloutRecord, record).header)
    except RemoteProtocolError:
        return None
