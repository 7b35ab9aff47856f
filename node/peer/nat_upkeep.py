"""A node's reachability upkeep: ask peers whether we are reachable (AutoNAT: a few chosen
at random, one per subnet, and a verdict by agreement, `node.host.reachability`), and when
we are not, hold a slot on relays found among the connected peers.

A relay announces itself through identify: a peer running the relay service lists the
circuit relay v2 hop protocol, so any node connected to it (a bootstrap peer, a peer met
through discovery) knows it can reserve there, without configuration. Status and metrics
read `stats()`: `reachability`, `direct_peers`, `relayed_peers`, `relay_bytes`, ...
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import trio

from node.host.framed_stream import PeerError
from node.host.relay import RELAY_HOP_PROTOCOL, RelayEndpoint, RelayRefused

if TYPE_CHECKING:
    from node.host.host import SwarmHost
    from node.host.reachability import Reachability

log = logging.getLogger("swarm.nat")

CHECK_EVERY_S = 120.0  # re-ask peers whether we are reachable
FIRST_CHECK_AFTER_S = 3.0  # let identify finish on the bootstrap connections first
MAX_RELAYS = 2  # slots held at once
MAX_ANNOUNCE = 64  # peers told of a new relayed address


class NatUpkeep:
    """Owns the reachability loop of one node (started in the peer's nursery)."""

    def __init__(
        self,
        host: SwarmHost,
        relay: RelayEndpoint,
        reach: Reachability,
        bootstrap: Sequence[str],
        greet: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self._host = host
        self.relay = relay
        self.reach = reach
        self._bootstrap = list(bootstrap)
        self._greet = greet  # tells a connected peer our addresses again (discovery's hello)
        self._rng = random.Random()  # whom to ask: never predictable from peer ids

    def own_addrs(self) -> list[str]:
        """The addresses our hello announces: listen addresses, then relayed ones (a peer's
        address book puts the last one first, and shares that one)."""
        relayed = sorted(self.relay.reservations.values())[:MAX_RELAYS]
        return [*self._host.listen_addrs()[: 16 - len(relayed)], *relayed]

    def relays_known(self) -> list[str]:
        """Connected peers that announce the relay service (identify protocols)."""
        found = []
        for peer in self._host.connected_peers():
            if RELAY_HOP_PROTOCOL in self._host.peer_protocols(peer):
                found.append(peer)
        return found

    async def run(self) -> None:
        """Check reachability every `CHECK_EVERY_S`, until cancelled."""
        await trio.sleep(FIRST_CHECK_AFTER_S)
        while True:
            with trio.move_on_after(CHECK_EVERY_S / 2):
                await self.check_once()
            await trio.sleep(CHECK_EVERY_S)

    async def check_once(self) -> str:
        """Ask a few peers whether we are reachable; when we are not, reserve relay slots
        and announce them. Returns the reachability status."""
        servers = self.reach.pick(self._host.connected_peers(), self._rng)
        status = await self.reach.check(servers)
        if status != "private" or len(self.relay.reservations) >= MAX_RELAYS:
            return status
        for peer in self.relays_known():
            if peer in self.relay.reservations or len(self.relay.reservations) >= MAX_RELAYS:
                continue
            addr = self._addr_of(peer)
            if addr is None:
                continue
            try:
                relayed = await self.relay.reserve(addr)
                log.info("not reachable from outside: reachable at %s", relayed)
            except (RelayRefused, PeerError) as exc:
                log.info("relay %s refused a slot: %s", peer[:12], exc)
                continue
            await self._announce()
        return status

    async def _announce(self) -> None:
        """Greet every connected peer again, so they learn (and share) our relayed address."""
        if self._greet is None:
            return
        async with trio.open_nursery() as nursery:
            for peer in self._host.connected_peers()[:MAX_ANNOUNCE]:
                nursery.start_soon(self._greet, peer)

    def _addr_of(self, peer: str) -> str | None:
        for addr in self._bootstrap:
            if addr.endswith(f"/p2p/{peer}"):
                return addr
        for a in self._host.peer_addrs(peer):
            if "/p2p-circuit" not in a:
                return f"{a}/p2p/{peer}"
        return None

    def stats(self) -> dict[str, object]:
        """Reachability and relay figures for status and metrics."""
        return {**self.reach.stats(), **self.relay.stats()}
