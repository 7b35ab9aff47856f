"""Reachability of a `SwarmHost` behind NAT: AutoNAT dial-back, a relay slot when not
reachable, and DCUtR hole punching to turn relayed connections into direct ones.

Uses py-libp2p 0.8.1's `AutoNATService` and `DCUtRProtocol`. What we change and why
(each pinned by a test in `tests/test_node_nat.py`):

- The library's AutoNAT server answers a dial-back request with `host.connect()`, which
  returns at once when a connection to the asker exists -- and the asker is always
  connected, it sent the request on that connection. So every asker is told "reachable".
  `DialBackAutoNAT` dials the advertised address afresh (`network.dial_addr`, a new
  TCP + Noise + Yamux connection) and closes that connection after.
- The asker advertises its listen addresses and the addresses DCUtR predicts from what
  peers observed (the NAT's public address with our listen port); the server dials only
  those on the IP it sees the asker come from (the library's rule).
- The verdict is not the library's (which counted the first servers' answers): it is
  `protocol.reachability`'s, by agreement. `pick(peers, rng)` chooses whom to ask, at
  random and one per subnet; `check(servers)` asks them at once, each under its own
  deadline; a dial-back counts as proven when a new connection from that server opened
  during its query (`SwarmHost.connection_opened_at`: Noise authenticated the server, so
  it reached us); the round's `Outcome` is kept as `last`, and a server whose "dial
  failed" a proven dial-back contradicts is reported to the host's misbehaviour listeners
  (`misbehaved`).
- Our server answers a dial-back request it will not serve (the asker asked within
  `DIAL_BACK_EVERY_S`, or `DIAL_BACKS_AT_ONCE` are under way) with "refused", which is no
  verdict, never with "dial failed".

DCUtR runs as the library ships it: every 2 s it tries to upgrade each relayed
connection (dials from our listen port to the address the peer's NAT showed, both sides at
once) and closes the relayed connection once a direct one is verified; stream opens then
use the direct connection. Its dials are bounded by
`node.host.libp2p_patches.bound_hole_punch_dials` (`protocol.hole_punch`); a peer that made
us refuse some is reported to the host's misbehaviour listeners as `flooding`.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import trio
from libp2p.host.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from node.host.gossip_guard import Misbehaviour
from node.host.libp2p_patches import set_punch_reporter
from node.host.relay import connection_kinds
from protocol import penalties
from protocol import reachability as agreement

if TYPE_CHECKING:
    from node.host.host import SwarmHost

log = logging.getLogger("swarm.reachability")

DIAL_BACK_TIMEOUT_S = 3.0  # SYN retries at 1 s and 3 s; a NAT that drops the dial costs this
# What one asker may cost us: at most this many of its addresses dialed per request, one
# request per DIAL_BACK_EVERY_S (honest nodes ask every 2 min), and at most
# DIAL_BACKS_AT_ONCE dial-backs for all askers together; beyond, the answer is "not dialed".
DIAL_BACK_ADDRS = 4
DIAL_BACK_EVERY_S = 10.0
DIAL_BACKS_AT_ONCE = 8
MAX_ASKERS = 4096  # askers remembered for DIAL_BACK_EVERY_S


class DialBackAutoNAT(AutoNATService):
    """AutoNAT whose server side really dials back (see the module docstring), within the
    per-asker and overall bounds above."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._asked: dict[ID, float] = {}
        self._dialing = 0

    def _admit(self, peer_id: ID) -> bool:
        now = trio.current_time()
        if len(self._asked) >= MAX_ASKERS:
            self._asked = {p: t for p, t in self._asked.items() if now - t < DIAL_BACK_EVERY_S}
        last = self._asked.get(peer_id)
        if (
            (last is not None and now - last < DIAL_BACK_EVERY_S)
            or self._dialing >= DIAL_BACKS_AT_ONCE
            or len(self._asked) >= MAX_ASKERS
        ):
            return False
        self._asked[peer_id] = now
        return True

    async def _handle_dial(
        self, message: Message, observed_ip: str | None, is_relayed: bool
    ) -> Message:
        try:
            peer_id = ID(message.dial.peer.id)
        except Exception:  # a malformed id: the library's own answer
            return await super()._handle_dial(message, observed_ip, is_relayed)
        if not self._admit(peer_id):
            log.debug(
                "dial-back for %s refused: asked within %s s, or too many at once",
                peer_id,
                DIAL_BACK_EVERY_S,
            )
            response = Message()
            response.type = Message.DIAL_RESPONSE
            response.dialResponse.status = Message.E_DIAL_REFUSED
            response.dialResponse.statusText = "asked too often, or too many at once"
            return response
        self._dialing += 1
        try:
            return await super()._handle_dial(message, observed_ip, is_relayed)
        finally:
            self._dialing -= 1

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        return await self._dial_back(peer_id, addrs[:DIAL_BACK_ADDRS])

    async def _dial_back(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        network = self.host.get_network()
        for raw in addrs:
            try:
                with trio.fail_after(DIAL_BACK_TIMEOUT_S):
                    conn = await network.dial_addr(Multiaddr(raw), peer_id)
            except trio.Cancelled:
                raise
            except Exception as exc:
                log.debug("dial-back to %s at %s failed: %s", peer_id, Multiaddr(raw), exc)
                continue
            with trio.move_on_after(DIAL_BACK_TIMEOUT_S), contextlib.suppress(Exception):
                await conn.close()
            return bytes(raw)
        return None


class Reachability:
    """AutoNAT (client and server) and DCUtR on one host."""

    def __init__(self, host: SwarmHost, rules: agreement.ReachabilityRules | None = None) -> None:
        self._host = host
        self.rules = rules or agreement.ReachabilityRules()
        self.verdict = agreement.UNKNOWN
        self.last: agreement.Outcome | None = None  # the newest round's outcome
        self.autonat = DialBackAutoNAT(host.libp2p, serve=True, confirmations=1)
        self.dcutr = DCUtRProtocol(host.libp2p)
        set_punch_reporter(self.dcutr, self._punch_refused)

    def _punch_refused(self, peer: str, reason: str) -> None:
        """A peer's hole punch asked for dials we refused: it pays as a flood."""
        offence = penalties.FLOODING
        self._host.report_misbehaviour(
            Misbehaviour(peer, offence.cost, offence.name, f"hole punch: {reason}")
        )

    @property
    def status(self) -> str:
        """ "public", "private" or "unknown" (not asked yet, or no verdict)."""
        return self.verdict

    def pick(self, peers: Sequence[str], rng: random.Random | None = None) -> list[str]:
        """Whom to ask among connected `peers`: at random, one per subnet
        (`protocol.reachability.pick_servers`)."""
        candidates = [(p, self._ip_of(p)) for p in peers]
        return agreement.pick_servers(candidates, rng or random.Random(), self.rules)

    def _ip_of(self, peer: str) -> str | None:
        """The IP of a direct connection to `peer`, None when it has none."""
        with contextlib.suppress(Exception):
            conns = self._host.libp2p.get_network().connections.get(ID.from_base58(peer)) or []
            for conn in conns if isinstance(conns, list) else [conns]:
                for addr in conn.get_transport_addresses():
                    text = str(addr)
                    parts = text.strip("/").split("/")
                    if "/p2p-circuit" not in text and parts[0] in ("ip4", "ip6"):
                        return parts[1]
        return None

    async def check(self, servers: Sequence[str], timeout_s: float = 15.0) -> str:
        """Ask each connected peer in `servers` at once to dial us back, each within
        `timeout_s`; the verdict is the round's (`protocol.reachability.Round`), kept in
        `last`. Returns `status`."""
        asked = list(dict.fromkeys(servers))
        if not asked:
            return self.status
        advertised = await self._advertised()
        round_ = agreement.Round(tuple(asked), self.verdict, self.rules)

        async def ask(server: str) -> None:
            started = trio.current_time()
            try:
                with trio.fail_after(timeout_s):
                    status, _ = await self.autonat.query_server(ID.from_base58(server), advertised)
            except trio.Cancelled:
                raise
            except Exception as exc:  # no answer: no vote
                log.info("AutoNAT query to %s failed: %s", server[:12], exc)
                return
            if status == Message.OK:
                opened = self._host.connection_opened_at(server)
                proven = opened is not None and opened >= started
                round_.answer(agreement.Answer(server, True, proven))
            elif status == Message.E_DIAL_ERROR:
                round_.answer(agreement.Answer(server, False))

        async with trio.open_nursery() as nursery:
            for server in asked:
                nursery.start_soon(ask, server)
        outcome = round_.finish()
        offence = penalties.MISBEHAVED
        for charge in outcome.charges:
            self._host.report_misbehaviour(
                Misbehaviour(charge.peer, offence.cost, offence.name, f"AutoNAT: {charge.reason}")
            )
        self.verdict, self.last = outcome.verdict, outcome
        log.info(
            "reachability %s: %d of %d answers agreed (%d asked, %d dial-backs seen)",
            outcome.verdict,
            outcome.agreed,
            outcome.answered,
            outcome.asked,
            outcome.proven,
        )
        return self.status

    async def _advertised(self) -> list[bytes]:
        addrs = [
            a.decapsulate(Multiaddr(f"/p2p/{self._host.peer_id}")).to_bytes()
            for a in self._host.libp2p.get_addrs()
            if "/p2p-circuit" not in str(a)
        ]
        with contextlib.suppress(Exception):
            for raw in await self.dcutr._get_observed_addrs():
                if raw not in addrs:
                    addrs.append(raw)
        return addrs

    async def hole_punch(self, peer: str) -> bool:
        """Try DCUtR with `peer` now (it runs on its own every 2 s as well)."""
        return bool(await self.dcutr.initiate_hole_punch(ID.from_base58(peer)))

    def stats(self) -> dict[str, object]:
        """Status and metrics fields: the verdict and how many peers are direct or relayed."""
        kinds = connection_kinds(self._host)
        return {
            "reachability": self.status,
            "direct_peers": sum(1 for k in kinds.values() if k == "direct"),
            "relayed_peers": sum(1 for k in kinds.values() if k == "relayed"),
        }


@contextlib.asynccontextmanager
async def open_reachability(host: SwarmHost) -> AsyncIterator[Reachability]:
    """Serve AutoNAT and run DCUtR on `host` until exit."""
    reach = Reachability(host)
    async with background_trio_service(reach.dcutr):
        await reach.dcutr.event_started.wait()
        yield reach
