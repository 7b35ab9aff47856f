"""The host's table of live peers: when each connected, answered a ping, was last active,
its round-trip time, and whether it is on its way out.

Owned by `SwarmHost`; the heartbeat, gossip and connection limits read and update it
through the methods below. Pure bookkeeping: no IO, no library types.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass


def short(peer: str) -> str:
    """A peer id shortened for logs."""
    return peer[:12] + "..." if len(peer) > 12 else peer


@dataclass
class PeerState:
    """One live peer, times from `time.monotonic()`."""

    connected_at: float
    last_pong: float
    last_active: float = 0.0  # last application stream or gossip message
    rtt_s: float = math.nan
    dropping: bool = False


class PeerTable:
    """Peer id (base58) -> `PeerState` for every peer with a live connection."""

    def __init__(self) -> None:
        self._states: dict[str, PeerState] = {}

    def __contains__(self, peer: object) -> bool:
        return peer in self._states

    def get(self, peer: str) -> PeerState | None:
        """The state of `peer`, None when it is not in the table."""
        return self._states.get(peer)

    def items(self) -> list[tuple[str, PeerState]]:
        """A snapshot of (peer, state) pairs, safe to iterate while the table changes."""
        return list(self._states.items())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._states))

    def live(self) -> list[str]:
        """Peers with a live connection not on their way out, sorted."""
        return sorted(p for p, st in self._states.items() if not st.dropping)

    def add(self, peer: str) -> PeerState:
        """Record `peer` as connected now (replacing a state on its way out)."""
        now = time.monotonic()
        state = self._states[peer] = PeerState(connected_at=now, last_pong=now, last_active=now)
        return state

    def pop(self, peer: str) -> PeerState | None:
        """Forget `peer`; its state, or None when it was not in the table."""
        return self._states.pop(peer, None)

    def touch(self, peer: str) -> None:
        """`peer` was active just now (an application stream or a gossip message)."""
        state = self._states.get(peer)
        if state is not None:
            state.last_active = time.monotonic()

    def mark_dropping(self, peer: str) -> bool:
        """`peer` counts as gone from now on; True when it was live until now."""
        state = self._states.get(peer)
        if state is None or state.dropping:
            return False
        state.dropping = True
        return True

    def rtt(self, peer: str) -> float:
        """The last measured ping round trip to `peer`, NaN when none."""
        state = self._states.get(peer)
        return state.rtt_s if state else math.nan
