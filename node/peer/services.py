"""What a peer serves and asks besides gossip: rollout bodies to pullers, catch-up
(`protocol.catch_up`: which rollouts a neighbour holds, receipts for a worker's own work),
the worker's delivery accounting, and asking a peer to back a version it claimed
(`protocol.version_claims`). IO only; the rules live in `protocol/`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from typing import Any, cast

import trio

from node.exchange import rollouts as rollout_exchange
from node.exchange import shards as shard_exchange
from node.exchange import sync as sync_exchange
from node.host.host import PeerError, SwarmHost
from node.peer.ports import Admit, BadRequests, BodyWants, Spawn, VersionView
from node.store.store import Store, StoreError
from protocol import catch_up as cu
from protocol import penalties
from protocol.admission import Kind, Misbehaved, NewestShown
from protocol.codec import encode
from protocol.peer_score import PeerId
from protocol.version_claims import AskNewest
from protocol.wire import RolloutRecord

log = logging.getLogger("swarm.peer")

CATCH_UP_TICK_S = 1.0
DELIVERY_CHECK_S = 5.0
ASK_NEWEST_S = 10.0  # a sender backs a future version it handed us within this


class BodyServer:
    """Serves `/swarm-rl/<run>/rollout/1`: the bodies we hold, a few streams per peer."""

    def __init__(
        self, run_id: str, store: Store, counters: Counter[str], bad_request: BadRequests
    ) -> None:
        self.store = store
        self.counters = counters

        def sent(n: int) -> None:
            counters["served"] += n

        def refused(_peer: str) -> None:
            counters["serve_refused"] += 1

        self._server = rollout_exchange.server(run_id, self._lookup, sent, bad_request, refused)

    def _lookup_sync(self, ids: list[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for rid in ids:
            row = self.store.get_rollout(rid)
            if row is None or row.body is None:
                out.append(None)
            else:
                out.append(encode(RolloutRecord(header=row.header, body=row.body)))
        return out

    async def _lookup(self, ids: list[bytes]) -> list[bytes | None]:
        return await trio.to_thread.run_sync(self._lookup_sync, ids)

    async def serve(self, stream: Any) -> None:
        """Answer one inbound body stream."""
        await self._server(stream)


class CatchUpDriver:
    """Drives `protocol.catch_up` for one peer: asks neighbours what they hold, pulls what
    we lack, serves the same question, records receipts, accounts a worker's delivery.

    `delivery` holds the latest accounting of our own rollouts (for status)."""

    def __init__(
        self,
        host: SwarmHost,
        run_id: str,
        store: Store,
        producer: bytes,
        pull_bodies: bool,
        bodies: BodyWants,
        version: VersionView,
        max_staleness: int,
        spawn: Spawn,
        bad_request: BadRequests,
        counters: Counter[str],
    ) -> None:
        self.host = host
        self.run_id = run_id
        self.store = store
        self.pull_bodies = pull_bodies
        self.bodies = bodies
        self.version = version
        self.max_staleness = max_staleness
        self.spawn = spawn
        self.bad_request = bad_request
        self.counters = counters
        self.delivery: dict[str, int] = {}
        self.machine = cu.CatchUp(pulls=pull_bodies, producer=producer)

        async def lookup(since: float, min_version: int, producer: bytes | None, limit: int) -> Any:
            return await trio.to_thread.run_sync(
                store.held_since, since, min_version, producer, limit
            )

        def offered(n: int) -> None:
            counters["catch_up_served"] += n

        self._server = sync_exchange.server(run_id, lookup, offered, bad_request)

    def handle(self, event: cu.Event) -> None:
        """Feed one event to the machine and carry out its actions."""
        for a in self.machine.handle(event):
            if isinstance(a, cu.Ask):
                self.spawn(self._ask, a)
            elif isinstance(a, cu.Pull):
                self.counters["catch_up_offered"] += len(a.ids)
                for rid in a.ids:
                    self.bodies.want_body(rid, [a.peer])
            elif isinstance(a, cu.Receipt):
                self.spawn(self._receipt, a)

    async def _ask(self, a: cu.Ask) -> None:
        try:
            ids, ats, more = await sync_exchange.ask(
                self.host,
                a.peer,
                self.run_id,
                a.since,
                a.min_version,
                a.producer,
                self.machine.config.page,
            )
        except PeerError as exc:
            log.info("catch-up with %s failed: %s", a.peer[:12], exc)
            self.counters["catch_up_errors"] += 1
            self.handle(cu.Failed(a.peer, time.time()))
            return
        if self.pull_bodies:
            have = await trio.to_thread.run_sync(self.store.bodies_held, ids)
            held = tuple(i in have or self.bodies.body_wanted(i) for i in ids)
        else:
            held = (False,) * len(ids)
        self.handle(cu.Answered(a.peer, ids, ats, more, held, time.time()))

    async def _receipt(self, r: cu.Receipt) -> None:
        with contextlib.suppress(StoreError):
            n = await trio.to_thread.run_sync(self.store.mark_delivered, r.ids, r.peer, time.time())
            self.counters["receipts"] += n

    async def serve(self, stream: Any) -> None:
        """Answer one inbound catch-up question."""
        await self._server(stream)

    async def run(self) -> None:
        """Tick the machine every second; a worker also accounts its rollouts (delivered,
        pending, too stale) every `DELIVERY_CHECK_S`."""
        last_check = -math.inf
        while True:
            now = time.time()
            self.handle(cu.Tick(now, self.version.policy_version, self.max_staleness))
            if time.monotonic() - last_check >= DELIVERY_CHECK_S:
                last_check = time.monotonic()
                with contextlib.suppress(StoreError):
                    await trio.to_thread.run_sync(self._account_delivery, now)
            await trio.sleep(CATCH_UP_TICK_S)

    def _account_delivery(self, now: float) -> None:
        """(In a thread.) Mark our unacknowledged rollouts past the staleness bound."""
        store, version = self.store, self.version.policy_version
        verdict = cu.classify(store.undelivered_own(), (), version, self.max_staleness)
        if verdict.too_stale:
            reason = f"no trainer holds it and it is older than version {version} - S"
            store.mark_too_stale(sorted(verdict.too_stale), reason, now)
        self.delivery = {
            **store.delivery_status(),
            **store.own_work(version, self.max_staleness),
        }


def bad_request_event(peer: str, reason: str) -> Misbehaved:
    """The admission event charging `peer` for a malformed stream request."""
    return Misbehaved(
        peer, penalties.BAD_REQUEST.cost, reason, time.time(), offence=penalties.BAD_REQUEST.name
    )


async def ask_newest(
    host: SwarmHost, run_id: str, admission: Admit, takes_weights: bool, ask: AskNewest
) -> None:
    """Ask a peer that claimed a version we do not know to back it with its newest
    manifest (`protocol.version_claims`); a backed claim sends the weights after it
    (when this peer takes weights at all, `takes_weights`)."""
    who, env, answered = str(ask.peer), None, False
    with trio.move_on_after(ASK_NEWEST_S):
        try:
            env = await shard_exchange.fetch_newest(host, who, run_id)
            answered = True
        except PeerError as exc:
            log.debug("peer: %s did not back its version claim: %s", who[:12], exc)
    handled = admission.submit(NewestShown(cast(PeerId, ask.peer), env, time.time(), answered))
    # Only a backing manifest goes on to the weights (an unbacked answer was charged
    # once already, and is not opened a second time).
    if env is not None and takes_weights and not handled.actions:
        await admission.admit(who, Kind.WEIGHT_MANIFEST, env)
