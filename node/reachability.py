"""What a node can tell about how others reach it: the addresses peers observe it at
(libp2p identify), whether it is publicly reachable, the relay it uses.

`observed_addr(host, peer)` asks one connected peer over identify; `describe(...)` turns
what is known into plain lines for `swarm-node doctor`. Today a node learns its observed
addresses only; reachability checks by dial-back and relays add their facts to
`Reachability` and their lines to `describe`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import multiaddr
import trio

from node.host import SwarmHost

IDENTIFY_TIMEOUT_S = 5.0
MAX_IDENTIFY_BYTES = 64 * 1024


@dataclass
class Reachability:
    """What a node knows about its reachability (see the module docstring)."""

    listen: list[str]
    observed: dict[str, str] = field(default_factory=dict)  # peer -> our address as it sees it
    relay: str | None = None  # the relay in use, None: none configured


async def observed_addr(host: SwarmHost, peer: str) -> str | None:
    """Our address as `peer` observed it (identify), or None when it did not say."""
    from libp2p.identity.identify.identify import ID as IDENTIFY
    from libp2p.identity.identify.identify import parse_identify_response
    from libp2p.peer.id import ID

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


def _is_public(addr: str) -> bool | None:
    parts = addr.strip("/").split("/")
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[1])
    except ValueError:
        return None
    return ip.is_global


def describe(r: Reachability) -> list[str]:
    """Plain lines: observed addresses, public or not, the relay in use."""
    lines = []
    if r.observed:
        for peer, addr in sorted(r.observed.items()):
            lines.append(f"observed address: {addr} (as {peer[:12]}... sees us, by identify)")
    else:
        lines.append("observed address: none yet (no peer told us by identify)")
    seen = set(r.observed.values())
    public = [a for a in seen if _is_public(a)]
    if public:
        lines.append(f"reachability: peers see a public address ({', '.join(sorted(public))}); "
                     "not checked by dial-back")
    elif seen:
        lines.append("reachability: peers see only private or loopback addresses: reachable "
                     "inside this network; not checked by dial-back")
    else:
        lines.append("reachability: unknown")
    lines.append(f"relay: {r.relay}" if r.relay else "relay: no relay configured")
    return lines
