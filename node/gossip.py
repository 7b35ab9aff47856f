"""Per-run gossip topics and a paced outbox, over `node.host.SwarmHost`.

Topics (one run never sees another's traffic):

    swarm-rl/<run>/rollouts/1   signed rollout headers (`Kind.ROLLOUT_HEADER`)
    swarm-rl/<run>/verdicts/1   signed validator verdicts (`Kind.VERDICT`)
    swarm-rl/<run>/weights/1    signed weight announcements (`Kind.WEIGHT_ANNOUNCE`)
    swarm-rl/<run>/fraud/1      fraud evidence (`Kind.FRAUD_EVIDENCE`)
    swarm-rl/<run>/delegations/1  trainer-signed grants of the right to judge (`Kind.DELEGATION`)

Every message on a topic is exactly one signed envelope of that topic's kind; the
receiving side runs it through `protocol.admission` as a GossipSub topic validator, so a
message that fails is neither delivered nor forwarded.

Pacing: receivers rate-limit each signer (`AdmissionConfig.signer_rate`, 20/s) and each
sender; a busy worker must stay below that or its own messages get refused. The
`Outbox` is a bounded queue per topic drained by one task at `rate_per_s` (token bucket
with a small burst); a full queue (32 by default: a few seconds of backlog) makes `put()`
wait, so a producer slows down to what the network takes instead of anything being dropped
or announced late.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from node.host import HostClosed, SwarmHost
from protocol.admission import Kind

TOPIC_KINDS: dict[str, Kind] = {
    "rollouts": Kind.ROLLOUT_HEADER,
    "verdicts": Kind.VERDICT,
    "weights": Kind.WEIGHT_ANNOUNCE,
    "fraud": Kind.FRAUD_EVIDENCE,
    "delegations": Kind.DELEGATION,
}


def topic_name(run_id: str, name: str) -> str:
    """The GossipSub topic of `name` (a key of `TOPIC_KINDS`) in run `run_id`."""
    if name not in TOPIC_KINDS:
        raise ValueError(f"unknown topic {name!r}; known: {sorted(TOPIC_KINDS)}")
    return f"swarm-rl/{run_id}/{name}/1"


def run_topics(run_id: str) -> dict[str, Kind]:
    """Topic name -> the one kind of message it carries."""
    return {topic_name(run_id, n): k for n, k in TOPIC_KINDS.items()}


@dataclass
class OutboxStats:
    queued: int = 0
    published: int = 0
    failed: int = 0


class Outbox:
    """A paced, bounded publisher for one host (see the module docstring).

    Resource handling: `run()` is a long-running task; cancel its scope to stop it. At
    shutdown `drain()` publishes what is still queued (bounded by the caller); anything
    left after that is reported by `pending()` (the store already holds it). Error handling: a `HostClosed` ends `run()`;
    a `MessageTooLarge` is a bug of ours and propagates.
    """

    def __init__(self, host: SwarmHost, rate_per_s: float, burst: int = 4, capacity: int = 32) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self._host = host
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self._send, self._receive = trio.open_memory_channel[tuple[str, bytes]](capacity)
        self.stats = OutboxStats()

    async def put(self, topic: str, data: bytes) -> None:
        """Queue one message; waits while the queue is full (back-pressure, no drop)."""
        if len(data) > self._host.settings.max_gossip_bytes:
            raise ValueError(f"gossip message of {len(data)} bytes is over the limit")
        await self._send.send((topic, data))
        self.stats.queued += 1

    def pending(self) -> int:
        return self._receive.statistics().current_buffer_used

    async def drain(self) -> int:
        """Publish everything still queued, paced at `rate_per_s`, whether or not `run()`
        still runs; returns how many this call sent. The caller bounds the wait (shutdown:
        `PeerConfig.drain_timeout_s`); a `HostClosed` ends it early."""
        sent = 0
        while True:
            try:
                topic, data = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return sent
            try:
                await self._host.publish(topic, data)
            except HostClosed:
                return sent
            self.stats.published += 1
            sent += 1
            await trio.sleep(1.0 / self.rate_per_s)

    async def run(self) -> None:
        tokens = float(self.burst)
        last = trio.current_time()
        async for topic, data in self._receive:
            now = trio.current_time()
            tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
            last = now
            if tokens < 1.0:
                await trio.sleep((1.0 - tokens) / self.rate_per_s)
                tokens, last = 1.0, trio.current_time()
            tokens -= 1.0
            try:
                await self._host.publish(topic, data)
                self.stats.published += 1
            except HostClosed:
                return
