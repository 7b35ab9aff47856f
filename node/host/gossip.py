"""Gossip of the `node.host.host` adapter: subscribe with validators, publish size-checked,
mesh-waited and paced.

What GossipSub does by default, and what `Gossip` does about it:

- The per-peer outbound queue holds 32 RPCs and drops when full -> `publish()` paces: it
  waits (bounded) until every live peer's queue is below `outbound_high_water`.
- A peer receives its own publishes -> filtered on the origin id.
- Publishing before the remote joined our mesh reaches no one -> `publish()` waits
  (bounded) until every subscribed peer is in the topic mesh.
- Messages over ~1 MiB are silently dropped -> `publish()` rejects anything over
  `max_gossip_bytes` with `MessageTooLarge`.
- The subscription queue holds 32 messages and drops with a warning -> a queue of
  `SUBSCRIPTION_QUEUE` (`node.host.libp2p_patches.enlarge_subscription_queue`) and a
  reader task that drains it at once.

A message our validator refused, ignored or accepted `Later` is marked seen, as go-libp2p
marks every message it validated: py-libp2p marks only accepted ones and remembers failed
validations in a cache of 1,000 messages, which a busy peer turns over in seconds, so each
IHAVE for such a message would draw an IWANT and its copy would come back through admission,
charging the peer that answered for handing over a copy again (`tests/test_node_gossip_seen.py`)."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from libp2p.peer.id import ID

from node.host.framed_stream import MessageTooLarge
from node.host.libp2p_patches import SUBSCRIPTION_QUEUE
from node.host.peers import PeerTable
from node.host.settings import HostSettings

log = logging.getLogger("swarm.host")

FORWARD_LATER_S = 30.0  # a message accepted `Later` is forwarded within this, or never


class Later:
    """A validator's answer for a message it accepts only once something holds (the node:
    once the message is durable): the host drops the library's copy at once, so the
    validator never holds GossipSub up, and forwards the message itself when `wait()`
    returns True. Until then copies of it from other peers reach the validator again (the
    node's admission refuses them as duplicates, at no cost to anyone)."""

    def __init__(self, wait: Callable[[], Awaitable[bool]]) -> None:
        self.wait = wait


# validator(forwarder, data, origin): the hop that handed us the message, its bytes, and the
# gossip message's publisher (its `from`, authenticated by strict signing), all base58;
# it answers True (forward), False (drop) or `Later`.
Validator = Callable[[str, bytes, str], bool] | Callable[[str, bytes, str], Awaitable[bool | Later]]


@dataclass(frozen=True)
class GossipMessage:
    """A message delivered on a subscribed topic (never one of our own)."""

    topic: str
    data: bytes
    origin: str  # base58 peer id of the publisher (the GossipSub `from` field)
    received_at: float  # time.time() at delivery


class GossipHost(Protocol):
    """What gossip calls back on the host."""

    @property
    def closing(self) -> bool: ...

    def check_open(self) -> None: ...

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...


class Gossip:
    """Topics of one host: subscriptions with validators and paced publishing over the
    py-libp2p `pubsub` and its GossipSub `router`; the host's `PeerTable` says who is live
    (and gets touched when a peer forwards us a message)."""

    def __init__(
        self,
        settings: HostSettings,
        local_id: ID,
        pubsub: Any,
        router: Any,
        peers: PeerTable,
        host: GossipHost,
    ) -> None:
        self.settings = settings
        self._me = local_id
        self._pubsub = pubsub
        self._gossipsub = router
        self._peers = peers
        self._host = host
        self._validators: dict[str, Validator] = {}
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    async def subscribe(
        self, topic: str, validator: Validator | None = None
    ) -> trio.MemoryReceiveChannel[GossipMessage]:
        """Join `topic`; returns a channel of other peers' messages.

        `validator(forwarder, data, origin) -> bool` runs before a message is delivered or
        forwarded (GossipSub topic validation): a False stops it at this hop. `origin` is
        the message's publisher (its `from`, whose signature GossipSub checked first). It may be a
        coroutine function, which may answer `Later` (forwarded when its condition holds);
        GossipSub gives a validator 5 s, then drops the message.
        """
        self._host.check_open()
        if validator is not None:
            self._validators[topic] = validator
            if inspect.iscoroutinefunction(validator):

                async def check_async(forwarder: ID, msg: Any) -> bool:
                    if forwarder == self._me:
                        return True
                    self._peers.touch(forwarder.to_base58())
                    origin = ID(bytes(msg.from_id)).to_base58()
                    answer = await validator(forwarder.to_base58(), bytes(msg.data), origin)
                    if isinstance(answer, Later):
                        self._host.spawn(self._forward_later, forwarder, msg, answer)
                    if answer is not True:
                        self._pubsub._mark_msg_seen(msg)  # never asked for again
                    return answer is True

                self._pubsub.set_topic_validator(topic, check_async, True)
            else:

                def check(forwarder: ID, msg: Any) -> bool:
                    if forwarder == self._me:
                        return True
                    self._peers.touch(forwarder.to_base58())
                    origin = ID(bytes(msg.from_id)).to_base58()
                    if validator(forwarder.to_base58(), bytes(msg.data), origin):
                        return True
                    self._pubsub._mark_msg_seen(msg)  # never asked for again
                    return False

                self._pubsub.set_topic_validator(topic, check, False)
        subscription = await self._pubsub.subscribe(topic)
        send, receive = trio.open_memory_channel[GossipMessage](SUBSCRIPTION_QUEUE)
        self._host.spawn(self._drain_subscription, topic, subscription, send)
        return receive

    async def _forward_later(self, forwarder: ID, msg: Any, later: Later) -> None:
        """Forward a message its validator accepted `Later`, as GossipSub would have: mark it
        seen, then hand it to the router for the mesh (never back to `forwarder`)."""
        ok = False
        with trio.move_on_after(FORWARD_LATER_S):
            ok = await later.wait()
        if not ok or self._host.closing:
            return
        self._pubsub._mark_msg_seen(msg)
        try:
            await self._pubsub.router.publish(forwarder, msg)
        except Exception as exc:  # a peer gone mid-send: the mesh is the library's to mend
            log.debug("forwarding a stored message failed: %s", exc)

    async def _drain_subscription(
        self, topic: str, subscription: Any, send: trio.MemorySendChannel[GossipMessage]
    ) -> None:
        me = self._me.to_bytes()
        async with send:
            while True:
                msg = await subscription.get()
                if bytes(msg.from_id) == me:  # our own publish, echoed back
                    continue
                item = GossipMessage(
                    topic, bytes(msg.data), ID(bytes(msg.from_id)).to_base58(), time.time()
                )
                try:
                    send.send_nowait(item)
                except trio.WouldBlock:
                    log.warning("application is not reading topic %s; message dropped", topic)
                except trio.BrokenResourceError:
                    return

    def topic_peers(self, topic: str) -> list[str]:
        """Live peers that told us they subscribe to `topic`."""
        live = set(self._peers.live())
        return sorted(
            p.to_base58() for p in self._pubsub.peer_topics.get(topic, ()) if p.to_base58() in live
        )

    async def wait_for_topic_peers(self, topic: str, n: int, timeout_s: float) -> int:
        """Wait (bounded) until at least `n` live peers subscribe to `topic`; returns the count."""
        with trio.move_on_after(timeout_s):
            while len(self.topic_peers(topic)) < n:
                await trio.sleep(0.05)
        return len(self.topic_peers(topic))

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish `data` on `topic`: size-checked, mesh-waited and paced.

        Raises `MessageTooLarge` (caller error) or `HostClosed`; never drops silently on
        our side. A peer whose queue stays full past `pace_max_wait_s` (frozen) is left
        to the heartbeat.
        """
        if len(data) > self.settings.max_gossip_bytes:
            raise MessageTooLarge(
                f"gossip message of {len(data)} bytes exceeds the {self.settings.max_gossip_bytes} "
                "byte limit (GossipSub drops larger ones silently); send the bulk over a stream"
            )
        self._host.check_open()
        self._in_flight += 1
        self._idle = trio.Event() if self._in_flight == 1 else self._idle
        try:
            await self._wait_for_mesh(topic)
            await self._pace()
            await self._pubsub.publish(topic, data)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def _wait_for_mesh(self, topic: str) -> None:
        """Wait (bounded) until each recently connected peer joined our mesh for `topic`:
        a peer whose subscription has not arrived yet would not get the message at all."""
        s = self.settings
        with trio.move_on_after(s.mesh_wait_s):
            while True:
                mesh = self._gossipsub.mesh.get(topic, set())
                if len(mesh) >= s.gossip_degree:
                    return
                now = time.monotonic()
                pending = False
                for peer, state in self._peers.items():
                    if state.dropping or now - state.connected_at >= s.mesh_wait_s:
                        continue
                    if ID.from_base58(peer) not in mesh:
                        pending = True
                        break
                if not pending:
                    return
                await trio.sleep(0.05)

    async def _pace(self) -> None:
        """Wait (bounded) until no live peer's outbound queue is at `outbound_high_water`."""
        s = self.settings
        with trio.move_on_after(s.pace_max_wait_s):
            while True:
                now = time.monotonic()
                busy = False
                for peer in self._peers.live():
                    state = self._peers.get(peer)
                    if state is None or now - state.last_pong > 2 * s.heartbeat_interval_s + 0.5:
                        continue  # suspect: do not let a frozen peer stall everyone
                    queue = self._pubsub.peer_queues.get(ID.from_base58(peer))
                    if queue is not None and len(queue) >= s.outbound_high_water:
                        busy = True
                        break
                if not busy:
                    return
                await trio.sleep(0.005)

    async def wait_idle(self) -> None:
        """Return once no publish is in flight and every peer's outbound queue is empty
        (the host bounds it at shutdown)."""
        await self._idle.wait()
        # Give the per-peer sender tasks a moment to write what is queued.
        while any(len(q) for q in self._pubsub.peer_queues.values()):
            await trio.sleep(0.02)
