"""What a peer tells us over libp2p identify (`/ipfs/id/1.0.0`, which every py-libp2p host
serves): our address as it observed it, and the protocols it runs (a relay lists the
circuit relay v2 hop protocol). What `node.reachability` reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.identify import parse_identify_response
from libp2p.peer.id import ID

from node.host.host import SwarmHost

IDENTIFY_TIMEOUT_S = 5.0
MAX_IDENTIFY_BYTES = 64 * 1024
MAX_PROTOCOLS = 256  # of one answer, kept


@dataclass
class Identified:
    """One peer's identify answer (empty when it gave none)."""

    observed: str | None = None  # our address as the peer sees it
    protocols: list[str] = field(default_factory=list)


async def identify(host: SwarmHost, peer: str) -> Identified:
    """Ask connected `peer` over identify; an empty `Identified` when it did not answer."""
    with trio.move_on_after(IDENTIFY_TIMEOUT_S):
        try:
            stream = await host.libp2p.new_stream(ID.from_base58(peer), [IDENTIFY])
        except Exception:  # the library raises several types; no identify is the answer
            return Identified()
        data = b""
        try:
            while len(data) < MAX_IDENTIFY_BYTES:
                chunk = await stream.read(MAX_IDENTIFY_BYTES)
                if not chunk:
                    break
                data += chunk
        except Exception:  # a closed or reset stream ends the answer
            pass
        finally:
            with trio.move_on_after(1):
                await stream.close()
        try:
            answer = parse_identify_response(data)
        except Exception:  # a malformed answer says nothing
            return Identified()
        found = Identified(protocols=[str(p)[:200] for p in list(answer.protocols)[:MAX_PROTOCOLS]])
        try:
            found.observed = (
                str(multiaddr.Multiaddr(answer.observed_addr)) if answer.observed_addr else None
            )
        except Exception:  # a malformed address says nothing
            pass
        return found
    return Identified()


async def observed_addr(host: SwarmHost, peer: str) -> str | None:
    """Our address as `peer` observed it (identify), or None when it did not say."""
    return (await identify(host, peer)).observed
