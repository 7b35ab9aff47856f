"""What a node can tell about how others reach it, in plain lines for `swarm-node doctor`:
the addresses peers observe it at (identify), whether it is publicly reachable (AutoNAT
dial-backs by the peers asked, and how many agreed: `protocol.reachability`), and the relay it uses or would
use (a relay announces the circuit relay v2 hop protocol through identify).

`describe(r)` returns (level, text) pairs, level one of `ok`, `info`, `warn`, `FAIL`; a
`FAIL` line's cause is `NO_RELAY`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_RELAY = "no relay"


@dataclass
class Reachability:
    """What a node knows about its reachability (see the module docstring)."""

    listen: list[str]
    observed: dict[str, str] = field(default_factory=dict)  # peer -> our address as it sees it
    dial_back: str = "unknown"  # AutoNAT's verdict: public | private | unknown (not asked)
    asked: list[str] = field(default_factory=list)  # the peers asked to dial us back
    agreed: int = 0  # answers that agreed with the verdict
    answered: int = 0  # answers that were a verdict (dialled back, or dial failed)
    proven: int = 0  # dial-backs seen to arrive (a new connection from the peer)
    relays: dict[str, str] = field(default_factory=dict)  # relay peer -> its address
    relay: str | None = None  # the relay in use (a running node), None: none


def _short(peer: str) -> str:
    return f"{peer[:12]}..."


def describe(r: Reachability) -> list[tuple[str, str]]:
    """(level, text): observed addresses, publicly reachable or not, the relay."""
    lines: list[tuple[str, str]] = []
    if r.observed:
        for peer, addr in sorted(r.observed.items()):
            lines.append(
                ("info", f"observed address: {addr} (as {_short(peer)} sees us, by identify)")
            )
    else:
        lines.append(("info", "observed address: none yet (no peer told us by identify)"))
    lines.append(_reachable_line(r))
    lines.append(_relay_line(r))
    return lines


def _reachable_line(r: Reachability) -> tuple[str, str]:
    asked = ", ".join(_short(p) for p in r.asked)
    agreed = (
        f"{r.agreed} of {r.answered} answers agreed, {len(r.asked)} peers asked "
        f"({asked}), {r.proven} dial-backs seen to arrive (AutoNAT)"
    )
    if r.dial_back == "public":
        return "ok", f"reachable: publicly reachable: {agreed}"
    if r.dial_back == "private":
        return "info", (
            f"reachable: not publicly reachable: {agreed}: behind a NAT or a firewall; "
            "other peers reach this node through a relay"
        )
    if not r.asked:
        return "warn", "reachable: unknown: no peer answered to dial us back"
    return "warn", f"reachable: unknown: no agreement: {agreed}"


def _relay_line(r: Reachability) -> tuple[str, str]:
    if r.relay:
        return "ok", f"relay: in use: {r.relay}"
    first = next(iter(sorted(r.relays.values())), None)
    if r.dial_back == "public":
        offer = f"; on offer: {first}" if first else ""
        return "ok", f"relay: none needed (publicly reachable){offer}"
    if first and r.dial_back == "private":
        return "ok", (
            f"relay: would use {first} (announced through identify); peers would reach "
            "this node at its /p2p-circuit address"
        )
    if first:
        return (
            "info",
            f"relay: would use {first} if not publicly reachable (announced through identify)",
        )
    if r.dial_back == "private":
        return "FAIL", (
            f"relay: {NO_RELAY}: not publicly reachable and no bootstrap peer announces a "
            "relay (circuit relay v2 hop, by identify): no peer could reach this node; "
            "join through a peer started with --role relay"
        )
    return "info", "relay: none announced by the bootstrap peers"
