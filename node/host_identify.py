"""Our address as a peer observed it, asked over libp2p identify (`/ipfs/id/1.0.0`, which
every py-libp2p host serves): what `node.reachability` reports."""

from __future__ import annotations

import multiaddr
import trio
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.identify import parse_identify_response
from libp2p.peer.id import ID

from node.host import SwarmHost

IDENTIFY_TIMEOUT_S = 5.0
MAX_IDENTIFY_BYTES = 64 * 1024


async def observed_addr(host: SwarmHost, peer: str) -> str | None:
    """Our address as `peer` observed it (identify), or None when it did not say."""
    with trio.move_on_after(IDENTIFY_TIMEOUT_S):
        try:
            stream = await host._lh.new_stream(ID.from_base58(peer), [IDENTIFY])
        except Exception:  # the library raises several types; no identify is the answer
            return None
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
            raw = parse_identify_response(data).observed_addr
            return str(multiaddr.Multiaddr(raw)) if raw else None
        except Exception:  # a malformed answer says nothing
            return None
    return None
