"""Multiaddrs given on the command line (`--listen`, `--bootstrap`, `--join`), checked
before any network IO so that a typo is a one-line error naming the flag."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from node.errors import CommandError


def check_addrs(addrs: Sequence[str], what: str, need_peer: bool) -> list[str]:
    """`addrs` checked as multiaddrs (`what` names the flag in errors); with `need_peer`,
    each must end in /p2p/<peer id>."""
    import multiaddr  # deferred: heavy import

    out = []
    for a in addrs:
        try:
            multiaddr.Multiaddr(a)
        except Exception as exc:
            raise CommandError(f"{what} {a!r} is not a multiaddr ({exc})") from None
        if need_peer and "/p2p/" not in a:
            raise CommandError(f"{what} {a!r} must end in /p2p/<peer id>")
        out.append(a)
    return out


def check_listen(addrs: Sequence[str]) -> list[str]:
    """Listen addresses the node can bind: `/ip4/<address>/tcp/<port>` or
    `/ip6/<address>/tcp/<port>` (port 0: any free port), nothing after the port; the node
    listens on TCP only."""
    out = []
    for a in check_addrs(addrs, "--listen", need_peer=False):
        parts = a.strip("/").split("/")
        ok = (
            len(parts) == 4
            and parts[0] in ("ip4", "ip6")
            and parts[2] == "tcp"
            and parts[3].isdigit()
        )
        if ok:
            try:
                ipaddress.ip_address(parts[1])
            except ValueError:
                ok = False
        if not ok or not 0 <= int(parts[3]) <= 65535:
            raise CommandError(
                f"--listen {a!r}: cannot listen there; give /ip4/<address>/tcp/<port> or "
                "/ip6/<address>/tcp/<port> (port 0: any free port; the node listens on TCP only)"
            )
        out.append(a)
    return out


def loopback_note(listen: Sequence[str], peers: Sequence[str]) -> str | None:
    """Why peers elsewhere could not dial a node listening on `listen` that joins `peers`:
    every listen address is a loopback one while some peer is not on this machine; None
    when that is not so."""

    def loopback(addr: str) -> bool:
        parts = addr.strip("/").split("/")
        try:
            return len(parts) > 1 and ipaddress.ip_address(parts[1]).is_loopback
        except ValueError:
            return False

    if not listen or not all(loopback(a) for a in listen):
        return None
    if not any(not loopback(p) for p in peers):
        return None
    return (
        "listening on loopback only: peers on other machines cannot dial this node (it can "
        "still dial out, and a relay can carry it); listen on all interfaces with "
        "--listen /ip4/0.0.0.0/tcp/<port>"
    )
