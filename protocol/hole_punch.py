"""Which addresses a hole punch may dial: the rule that keeps DCUtR from making this node a
tool for flooding someone else.

A DCUtR CONNECT message lists addresses the remote says are its own, and the library dials
every one of them, several rounds over. Nothing proves an address is the remote's, so a
peer could list a third party's addresses and have us dial them for free. This rule
admits each dial or refuses it, with the time passed in (`now`, seconds on one clock):

- A dial is for one peer within one punch (one CONNECT exchange, or one try of ours).
  Only a peer reached through a relay is punched to: a direct connection needs no punch.
- Only an IPv4/IPv6 TCP address with an address a peer can have: not unspecified,
  multicast, link-local or reserved; not loopback (this machine), unless the limits allow
  it (a network on loopback); never one of our own listen IPs.
- A punch dials at most `per_punch` addresses, of at most `ips_per_punch` distinct IPs.
- An address is dialled at most once within `address_every_s`, whoever asks: the
  library's retry rounds and later tries reach it again only after that.
- At most `per_ip` dials to one IP and `per_peer` dials for one peer within a window of
  `window_s`, whoever asks.
- Memory is bounded (`remembered` entries per table); when a table is full of entries
  still in force, new addresses are refused, never forgotten early.

Who pays: the remote, for a CONNECT listing more than `offered_max` addresses (the
library itself sends at most 20) and for dials refused past its own budget, at an
address dialled for another peer within the minute, or past an IP's budget
(`Refused.charge`). A refusal our own retries cause (an address this peer was dialled
at within the minute, the punch's own budget) or that depends only on our state (a full
table, a race with a direct connection) is free.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

NOT_RELAYED = "not relayed"
NOT_DIALABLE = "not a dialable address"
OWN_ADDRESS = "one of our own addresses"
PUNCH_SPENT = "the punch's dials are spent"
TOO_MANY_IPS = "too many IPs in one punch"
DIALLED_RECENTLY = "dialled within the minute"
ANOTHER_PEERS = "dialled for another peer within the minute"
IP_SPENT = "the IP's dials are spent"
PEER_SPENT = "the peer's dials are spent"
MEMORY_FULL = "too many addresses in force"
TOO_MANY_OFFERED = "more addresses offered than any implementation sends"

# Refusals the remote pays for (the others follow from our own state or retries).
CHARGED = frozenset({ANOTHER_PEERS, IP_SPENT, PEER_SPENT, TOO_MANY_OFFERED})


@dataclass(frozen=True, slots=True)
class HolePunchLimits:
    """The bounds of the rule (see the module docstring)."""

    per_punch: int = 8
    ips_per_punch: int = 3
    offered_max: int = 20
    address_every_s: float = 60.0
    window_s: float = 60.0
    per_ip: int = 16
    per_peer: int = 24
    remembered: int = 4096
    loopback: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """A dial not to make, and whether the remote pays for asking it (`CHARGED`)."""

    reason: str

    @property
    def charge(self) -> bool:
        """Whether the remote pays for this refusal."""
        return self.reason in CHARGED


@dataclass(slots=True)
class _Punch:
    peer: str
    dials: int = 0
    ips: set[str] | None = None


class HolePunchBudget:
    """The dials of all hole punches of one host (see the module docstring)."""

    def __init__(self, limits: HolePunchLimits | None = None) -> None:
        self.limits = limits or HolePunchLimits()
        self._punches: OrderedDict[int, _Punch] = OrderedDict()
        self._addresses: OrderedDict[tuple[str, int], tuple[str, float]] = OrderedDict()
        self._ips: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._peers: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.dials = 0  # dials admitted, all punches together
        self.refused = 0

    def offered(self, count: int) -> Refused | None:
        """A CONNECT listing `count` addresses: refused (charged) past `offered_max`; the
        caller then keeps only the first `offered_max`."""
        if count > self.limits.offered_max:
            return Refused(TOO_MANY_OFFERED)
        return None

    def admit(
        self,
        punch: int,
        peer: str,
        ip: str | None,
        port: int,
        now: float,
        *,
        relayed: bool,
        own_ips: frozenset[str] = frozenset(),
    ) -> Refused | None:
        """None: dial `ip`:`port` for `peer` within punch number `punch` (now counted);
        else why not. `ip` None: the address is not IP and TCP."""
        refusal = self._check(punch, peer, ip, port, now, relayed, own_ips)
        if refusal is not None:
            self.refused += 1
            return refusal
        assert ip is not None
        state = self._punch(punch, peer)
        state.dials += 1
        assert state.ips is not None
        state.ips.add(ip)
        self._addresses[(ip, port)] = (peer, now)
        self._addresses.move_to_end((ip, port))
        self._count(self._ips, ip, now)
        self._count(self._peers, peer, now)
        self.dials += 1
        return None

    def _check(
        self,
        punch: int,
        peer: str,
        ip: str | None,
        port: int,
        now: float,
        relayed: bool,
        own_ips: frozenset[str],
    ) -> Refused | None:
        lim = self.limits
        if not relayed:
            return Refused(NOT_RELAYED)
        if ip is None or not 0 < port < 65536 or not self._dialable(ip):
            return Refused(NOT_DIALABLE)
        if ip in own_ips:
            return Refused(OWN_ADDRESS)
        state = self._punches.get(punch)
        if state is not None and state.dials >= lim.per_punch:
            return Refused(PUNCH_SPENT)
        if state is not None and state.ips and ip not in state.ips:
            if len(state.ips) >= lim.ips_per_punch:
                return Refused(TOO_MANY_IPS)
        seen = self._addresses.get((ip, port))
        if seen is not None and now - seen[1] < lim.address_every_s:
            return Refused(DIALLED_RECENTLY if seen[0] == peer else ANOTHER_PEERS)
        if self._used(self._peers, peer, now) >= lim.per_peer:
            return Refused(PEER_SPENT)
        if self._used(self._ips, ip, now) >= lim.per_ip:
            return Refused(IP_SPENT)
        if seen is None and not self._room(now):
            return Refused(MEMORY_FULL)
        return None

    def _dialable(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if addr.is_loopback:
            return self.limits.loopback
        return not (
            addr.is_unspecified or addr.is_multicast or addr.is_link_local or addr.is_reserved
        )

    def _punch(self, punch: int, peer: str) -> _Punch:
        state = self._punches.get(punch)
        if state is None:
            state = self._punches[punch] = _Punch(peer, ips=set())
            while len(self._punches) > self.limits.remembered:
                self._punches.popitem(last=False)
        return state

    def _room(self, now: float) -> bool:
        """Whether one more address fits: entries past `address_every_s` are forgotten."""
        table = self._addresses
        while table and now - next(iter(table.values()))[1] >= self.limits.address_every_s:
            table.popitem(last=False)
        return len(table) < self.limits.remembered

    def _used(self, table: OrderedDict[str, tuple[float, int]], key: str, now: float) -> int:
        entry = table.get(key)
        if entry is None or now - entry[0] >= self.limits.window_s:
            return 0
        return entry[1]

    def _count(self, table: OrderedDict[str, tuple[float, int]], key: str, now: float) -> None:
        used = self._used(table, key, now)
        started = table[key][0] if used else now
        table[key] = (started, used + 1)
        table.move_to_end(key)
        while len(table) > self.limits.remembered:
            oldest_key, (oldest, _) = next(iter(table.items()))
            if now - oldest < self.limits.window_s:
                break  # still in force: kept (a full table refuses through `_room`)
            del table[oldest_key]
