"""What a node can tell about how others reach it: the addresses peers observe it at
(libp2p identify), whether it is publicly reachable, the relay it uses.

`node.host_identify.observed_addr(host, peer)` asks one connected peer over identify;
`describe(...)` turns what is known into plain lines for `swarm-node doctor`. Today a node
learns its observed addresses only; reachability checks by dial-back and relays add their
facts to `Reachability` and their lines to `describe`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass
class Reachability:
    """What a node knows about its reachability (see the module docstring)."""

    listen: list[str]
    observed: dict[str, str] = field(default_factory=dict)  # peer -> our address as it sees it
    relay: str | None = None  # the relay in use, None: none configured


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
