"""The application heartbeat of the `node.host.host` adapter: the standard ping
`/ipfs/ping/1.0.0` to each peer every `heartbeat_interval_s`, a peer silent for
`peer_dead_after_s` disconnected (a SIGSTOPped peer would otherwise block writes to it
forever); and our answer to a remote's ping, under deadlines.

A peer's silence is counted net of the time this process's own trio loop did not run
(`LoopStalls`): a node that loaded a model, wrote a checkpoint in the loop's thread or was
not scheduled on a busy machine did not hear the answers that came meanwhile, and must not
drop every peer when it wakes up."""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from typing import Any, Protocol

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from node.host.framed_stream import FramedStream, HostError
from node.host.peers import PeerTable
from node.host.settings import HostSettings

log = logging.getLogger("swarm.host")

PING_PROTOCOL = TProtocol("/ipfs/ping/1.0.0")  # the standard ping, which every libp2p peer answers
PING_BYTES = 32
STALL_TICK_S = 0.25
STALL_MIN_S = 0.5  # a tick this late (beyond its period) is a stall of our loop
STALL_LOG_S = 2.0


class LoopStalls:
    """When this process's trio loop did not run: a tick every `STALL_TICK_S` (`run`); a
    tick late by over `STALL_MIN_S` records a stall. Bounded to the last 64 stalls."""

    def __init__(self) -> None:
        self.last_tick = time.monotonic()
        self._stalls: deque[tuple[float, float]] = deque(maxlen=64)  # (ended, seconds)

    async def run(self) -> None:
        """Tick until cancelled, recording each stall of the loop."""
        while True:
            await trio.sleep(STALL_TICK_S)
            now = time.monotonic()
            late = now - self.last_tick - STALL_TICK_S
            if late > STALL_MIN_S:
                self._stalls.append((now, late))
                if late > STALL_LOG_S:
                    log.info("this process stood still for %.1f s (not held against peers)", late)
            self.last_tick = now

    def since(self, start: float, now: float) -> float:
        """Seconds our loop stood still after `start` (monotonic), one going on now included
        (this task may run before the ticker notices it)."""
        done = sum(min(late, ended - start) for ended, late in self._stalls if ended > start)
        going_on = now - self.last_tick - STALL_TICK_S
        return done + (going_on if going_on > STALL_MIN_S else 0.0)


class Disconnector(Protocol):
    """What the heartbeat calls to drop a silent peer (the host)."""

    async def disconnect(self, peer: str, reason: str = "") -> None: ...


class Heartbeat:
    """Liveness of the host's peers: one ping loop per peer (`ping_loop`), our ping answers
    (`handle_ping`), and the stalls of our own loop (`stalls`, run by the host).

    It reads and updates the host's `PeerTable` (last pong, round trip) and opens ping
    streams on the py-libp2p host `lh`; a peer silent too long goes through `dropper`.
    """

    def __init__(
        self, settings: HostSettings, lh: Any, peers: PeerTable, dropper: Disconnector
    ) -> None:
        self.settings = settings
        self._lh = lh
        self._peers = peers
        self._dropper = dropper
        self._pingers: set[str] = set()
        self.stalls = LoopStalls()  # our own loop's stalls do not count as a peer's silence

    def pinging(self, peer: str) -> bool:
        """Whether a ping loop for `peer` is running."""
        return peer in self._pingers

    async def handle_ping(self, stream: Any) -> None:
        """The standard ping's answer: echo each 32 bytes (under deadlines, unlike the
        library's own handler, which this replaces)."""
        framed = FramedStream(stream, stream.muxed_conn.peer_id.to_base58(), self.settings)
        deadline = self.settings.peer_dead_after_s * 3
        try:
            while True:
                with trio.fail_after(deadline):
                    nonce = await framed.read_exactly(PING_BYTES)
                await framed.write_raw(nonce)
        except (HostError, trio.TooSlowError):
            pass
        finally:
            await framed.reset()

    async def ping_loop(self, peer: str) -> None:
        """Ping `peer` every `heartbeat_interval_s`; drop it after `peer_dead_after_s` silent."""
        self._pingers.add(peer)
        s = self.settings
        framed: FramedStream | None = None
        try:
            while (state := self._peers.get(peer)) is not None and not state.dropping:
                now = time.monotonic()
                silent = now - state.last_pong - self.stalls.since(state.last_pong, now)
                remaining = s.peer_dead_after_s - silent
                if remaining <= 0:
                    await self._dropper.disconnect(
                        peer, f"no heartbeat answer for {s.peer_dead_after_s:g} s"
                    )
                    return
                with trio.move_on_after(
                    min(remaining, max(s.heartbeat_interval_s * 2, 1.0))
                ) as scope:
                    try:
                        if framed is None:
                            raw = await self._lh.new_stream(ID.from_base58(peer), [PING_PROTOCOL])
                            framed = FramedStream(raw, peer, s)
                        nonce = secrets.token_bytes(PING_BYTES)
                        sent = time.monotonic()
                        await framed.write_raw(nonce)
                        echo = await framed.read_exactly(PING_BYTES)
                        if echo == nonce:
                            state.last_pong = time.monotonic()
                            state.rtt_s = state.last_pong - sent
                        else:  # out of step: start a fresh stream
                            await framed.reset()
                            framed = None
                    except (HostError, trio.TooSlowError):
                        framed = None
                    except trio.Cancelled:
                        raise
                    except Exception:  # new_stream on a closing connection
                        framed = None
                if scope.cancelled_caught and framed is not None:
                    # A late echo would arrive on this stream and put it out of step.
                    await framed.reset()
                    framed = None
                await trio.sleep(s.heartbeat_interval_s)
        finally:
            self._pingers.discard(peer)
            if framed is not None:
                await framed.reset()
