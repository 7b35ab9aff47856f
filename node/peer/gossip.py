"""Per-run gossip topics and a paced outbox, over `node.host.host.SwarmHost`.

Topics (one run never sees another's traffic):

    swarm-rl/<run>/rollouts/1   signed rollout headers (`Kind.ROLLOUT_HEADER`)
    swarm-rl/<run>/verdicts/1   signed validator verdicts (`Kind.VERDICT`)
    swarm-rl/<run>/weights/1    signed weight announcements (`Kind.WEIGHT_ANNOUNCE`)
    swarm-rl/<run>/fraud/1      fraud evidence (`Kind.FRAUD_EVIDENCE`)
    swarm-rl/<run>/delegations/1  trainer-signed grants of the right to judge (`Kind.DELEGATION`)
    swarm-rl/<run>/producer-claims/1  a validator's claim over a producer's window of
                                records (`Kind.PRODUCER_CLAIM`, `verify.producer`)
    swarm-rl/<run>/equivocation/1  evidence that a key of the run signed two conflicting
                                objects of one slot (`Kind.EQUIVOCATION`,
                                `protocol.equivocation`)
    swarm-rl/<run>/header-batches/1  `HeaderBatch`: several signed rollout headers

Every message on a topic is exactly one signed envelope of that topic's kind (a batch:
several, each admitted on its own); the receiving side runs it through
`protocol.admission` as a GossipSub topic validator, so a message that fails is neither
delivered nor forwarded (a batch is forwarded only when every header in it was admitted).

Pacing: receivers rate-limit each signer (`AdmissionConfig.signer_rate`, 20/s) and each
sender, dropping (free) what is over. The `Outbox` is a bounded queue per topic drained by
one task at `rate_per_s` messages (token bucket with a small burst) and `item_rate_per_s`
items (a batch of n headers counts n; the peer sets it below the signer rate); a full queue (32 by default: a few seconds of backlog) makes `put()`
wait, so a producer slows down to what the network takes instead of anything being dropped
or announced late.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from node.host.host import HostClosed, SwarmHost
from protocol.admission import Kind
from protocol.codec import encode
from protocol.wire import MAX_HEADER_BATCH, HeaderBatch

TOPIC_KINDS: dict[str, Kind] = {
    "rollouts": Kind.ROLLOUT_HEADER,
    "verdicts": Kind.VERDICT,
    "weights": Kind.WEIGHT_ANNOUNCE,
    "fraud": Kind.FRAUD_EVIDENCE,
    "delegations": Kind.DELEGATION,
    "producer-claims": Kind.PRODUCER_CLAIM,
    "equivocation": Kind.EQUIVOCATION,
}


# Topics whose messages may also travel batched: topic -> the topic of its `HeaderBatch`es.
BATCH_TOPICS: dict[str, str] = {"rollouts": "header-batches"}


def topic_name(run_id: str, name: str) -> str:
    """The GossipSub topic of `name` (a key of `TOPIC_KINDS`, or a batch topic) in a run."""
    if name not in TOPIC_KINDS and name not in BATCH_TOPICS.values():
        raise ValueError(f"unknown topic {name!r}; known: {sorted(TOPIC_KINDS)}")
    return f"swarm-rl/{run_id}/{name}/1"


def run_topics(run_id: str) -> dict[str, Kind]:
    """Topic name -> the one kind of message it carries."""
    return {topic_name(run_id, n): k for n, k in TOPIC_KINDS.items()}


@dataclass
class OutboxStats:
    """What an `Outbox` queued and published so far."""

    queued: int = 0
    published: int = 0  # items (a batch of n headers counts n)
    failed: int = 0
    batches: int = 0  # header batches published
    batched: int = 0  # headers published inside them


class Outbox:
    """A paced, bounded publisher for one host (see the module docstring).

    Header batching: with `batch_topics` = {topic: batch topic} and `max_batch` > 1, the
    items queued for `topic` at the moment one is sent go out together (up to `max_batch`)
    as one `HeaderBatch` on the batch topic; a busy producer is then limited by its compute,
    not by the message pacing, while a quiet one still sends each header at once.

    Resource handling: `run()` is a long-running task; cancel its scope to stop it. At
    shutdown `drain()` publishes what is still queued (bounded by the caller); anything
    left after that is reported by `pending()` (the store already holds it). Error
    handling: a `HostClosed` ends `run()`; a `MessageTooLarge` is a bug of ours and
    propagates.
    """

    def __init__(
        self,
        host: SwarmHost,
        rate_per_s: float,
        burst: int = 4,
        capacity: int = 32,
        batch_topics: dict[str, str] | None = None,
        max_batch: int = 1,
        item_rate_per_s: float = math.inf,
        item_burst: float = math.inf,
    ) -> None:
        """`rate_per_s`/`burst` pace gossip messages; `item_rate_per_s`/`item_burst` pace
        the items inside them (a batch of n headers counts n), to stay within what peers
        admit from one producer (their `signer_rate`)."""
        if rate_per_s <= 0 or item_rate_per_s <= 0:
            raise ValueError("rate_per_s and item_rate_per_s must be positive")
        if not 1 <= max_batch <= MAX_HEADER_BATCH:
            raise ValueError(f"max_batch must be in [1, {MAX_HEADER_BATCH}]")
        self._host = host
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.max_batch = max_batch
        self.item_rate_per_s = item_rate_per_s
        self.item_burst = max(float(max_batch), item_burst)
        self._item_tokens = self.item_burst
        self._item_last: float | None = None
        self._batch_topics = dict(batch_topics or {})
        self._send, self._receive = trio.open_memory_channel[tuple[str, bytes]](capacity)
        self._held: deque[tuple[str, bytes]] = deque()  # taken while batching, sent next
        self._busy = False  # run() holds an item it has not published yet
        self.stats = OutboxStats()

    async def put(self, topic: str, data: bytes) -> None:
        """Queue one message; waits while the queue is full (back-pressure, no drop)."""
        if len(data) > self._host.settings.max_gossip_bytes:
            raise ValueError(f"gossip message of {len(data)} bytes is over the limit")
        await self._send.send((topic, data))
        self.stats.queued += 1

    async def put_many(self, topic: str, items: Sequence[bytes]) -> None:
        """Queue several messages at once (a worker's generation batch): they reach the
        queue together, so that they can leave in one batch; waits only when it is full."""
        for data in items:
            if len(data) > self._host.settings.max_gossip_bytes:
                raise ValueError(f"gossip message of {len(data)} bytes is over the limit")
        for data in items:
            try:
                self._send.send_nowait((topic, data))
            except trio.WouldBlock:
                await self._send.send((topic, data))
            self.stats.queued += 1

    def set_max_batch(self, n: int) -> None:
        """Change the batch bound (1: one header per message) while running."""
        if not 1 <= n <= MAX_HEADER_BATCH:
            raise ValueError(f"max_batch must be in [1, {MAX_HEADER_BATCH}]")
        self.max_batch = n

    def pending(self) -> int:
        """Items queued and not published yet."""
        return self._receive.statistics().current_buffer_used + len(self._held)

    def _take_nowait(self) -> tuple[str, bytes] | None:
        if self._held:
            return self._held.popleft()
        try:
            return self._receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return None

    def _message(self, first: tuple[str, bytes]) -> tuple[str, bytes, int]:
        """(topic, payload, items): `first` alone, or a batch of what is queued for its topic."""
        topic, data = first
        batch_topic = self._batch_topics.get(topic)
        if batch_topic is None or self.max_batch == 1:
            return topic, data, 1
        items = [data]
        others: list[tuple[str, bytes]] = []
        while len(items) < self.max_batch and (nxt := self._take_nowait()) is not None:
            if nxt[0] == topic:
                items.append(nxt[1])
            else:
                others.append(nxt)
        self._held.extendleft(reversed(others))
        return batch_topic, encode(HeaderBatch(headers=tuple(items))), len(items)

    async def _pace_items(self, n: int) -> None:
        """Wait until `n` items fit the item bucket, then take them."""
        if math.isinf(self.item_rate_per_s):
            return
        now = trio.current_time()
        if self._item_last is not None:
            self._item_tokens = min(
                self.item_burst, self._item_tokens + (now - self._item_last) * self.item_rate_per_s
            )
        self._item_last = now
        if self._item_tokens < n:
            await trio.sleep((n - self._item_tokens) / self.item_rate_per_s)
            self._item_tokens, self._item_last = float(n), trio.current_time()
        self._item_tokens -= n

    async def _publish(self, first: tuple[str, bytes]) -> int:
        topic, payload, n = self._message(first)
        await self._pace_items(n)
        await self._host.publish(topic, payload)
        self.stats.published += n
        if topic in self._batch_topics.values():
            self.stats.batches += 1
            self.stats.batched += n
        return n

    async def drain(self) -> int:
        """Publish everything still queued, paced at `rate_per_s`, whether or not `run()`
        still runs; returns how many items this call sent. The caller bounds the wait
        (shutdown: `PeerConfig.drain_timeout_s`); a `HostClosed` ends it early."""
        sent = 0
        while (item := self._take_nowait()) is not None:
            try:
                sent += await self._publish(item)
            except HostClosed:
                return sent
            await trio.sleep(1.0 / self.rate_per_s)
        while self._busy:  # the item `run()` holds (pacing or publishing) goes out too
            await trio.sleep(0.02)
        return sent

    async def run(self) -> None:
        """Publish queued items paced at `rate_per_s` (with `burst`), until cancelled."""
        tokens = float(self.burst)
        last = trio.current_time()
        while True:
            item = self._held.popleft() if self._held else await self._receive.receive()
            self._busy = True
            now = trio.current_time()
            tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
            last = now
            if tokens < 1.0:
                await trio.sleep((1.0 - tokens) / self.rate_per_s)
                tokens, last = 1.0, trio.current_time()
            tokens -= 1.0
            try:
                await self._publish(item)
            except HostClosed:
                return
            finally:
                self._busy = False
