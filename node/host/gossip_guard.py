"""GossipSub control traffic limited per peer, and the peer reported when it exceeds a limit.

Part of the `node.host.host` adapter: `SwarmHost` builds its GossipSub router and pubsub from
`GuardedGossipSub` / `GuardedPubsub`, and every excess becomes one `Misbehaviour` for the
host's `on_misbehaviour` callbacks (at most one per peer, reason and window, so a flood
of control messages is not also a flood of reports). What is counted, per peer, over a
fixed window of `window_s` seconds:

- GRAFT and PRUNE entries together (`max_graft_prune`): past the limit the rest of the
  window's GRAFTs and PRUNEs are dropped before the library sees them.
- IHAVE message ids (`max_ihave_ids`) and IWANT message ids (`max_iwant_ids`): likewise;
  an IWANT we answer costs us a message each, an IHAVE costs a lookup each.
- Topics subscribed at once (`max_topics`): a subscription past it is ignored.
- An RPC over the library's inbound size limit (1 MiB: a gossip message over ~1,048,000
  bytes) is dropped by the library with the stream; here it is also reported
  (`reason="oversize_rpc"`, through `node.host.libp2p_patches.OVERSIZE_REPORT`).

The notice carries a penalty (`PENALTIES`), a reason and a detail; what to do with it
(score, admission, ban) is the caller's decision: the host takes no action of its own
beyond the drops above.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub

from node.host.libp2p_patches import OVERSIZE_REPORT
from protocol import penalties

log = logging.getLogger("swarm.host")

# The score change each reason carries (<= 0), from the network's penalty table.
PENALTIES: dict[str, float] = {
    o.name: o.cost
    for o in (
        penalties.GRAFT_PRUNE_FLOOD,
        penalties.IHAVE_FLOOD,
        penalties.IWANT_FLOOD,
        penalties.TOO_MANY_TOPICS,
        penalties.OVERSIZE_RPC,
    )
}


@dataclass(frozen=True)
class Misbehaviour:
    """A peer exceeded a GossipSub limit; `penalty` is `PENALTIES[reason]`."""

    peer: str  # base58 peer id
    penalty: float
    reason: str  # a key of PENALTIES
    detail: str = ""


@dataclass(frozen=True)
class ControlLimits:
    """Per-peer GossipSub control budgets (see the module docstring)."""

    window_s: float = 10.0
    max_graft_prune: int = 200
    max_ihave_ids: int = 10_000
    max_iwant_ids: int = 10_000
    max_topics: int = 100


@dataclass
class _Window:
    started: float
    counts: dict[str, int] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)


Report = Callable[[Misbehaviour], None]


class _Budget:
    """Fixed-window counters per peer and kind, and the once-per-window report."""

    def __init__(self, limits: ControlLimits, report: Report) -> None:
        self.limits = limits
        self.report = report
        self._windows: dict[ID, _Window] = {}

    def _window(self, peer: ID) -> _Window:
        now = time.monotonic()
        w = self._windows.get(peer)
        if w is None or now - w.started >= self.limits.window_s:
            if len(self._windows) > 4096:  # bounded: forget windows long over
                cutoff = now - self.limits.window_s
                self._windows = {p: x for p, x in self._windows.items() if x.started > cutoff}
            w = self._windows[peer] = _Window(started=now)
        return w

    def take(self, peer: ID, kind: str, n: int, limit: int, reason: str) -> bool:
        """Count `n` of `kind`; False (and one report per window) if over `limit`."""
        if n <= 0:
            return True
        w = self._window(peer)
        total = w.counts.get(kind, 0) + n
        w.counts[kind] = total
        if total <= limit:
            return True
        self.flag(peer, reason, f"{total} {kind} in {self.limits.window_s:g} s (limit {limit})", w)
        return False

    def flag(self, peer: ID, reason: str, detail: str, w: _Window | None = None) -> None:
        w = w or self._window(peer)
        if reason in w.reported:
            return
        w.reported.add(reason)
        notice = Misbehaviour(peer.to_base58(), PENALTIES[reason], reason, detail)
        log.info("peer %s misbehaved: %s (%s)", notice.peer[:12], reason, detail)
        try:
            self.report(notice)
        except Exception:  # a listener's bug must not kill the pubsub reader
            log.exception("misbehaviour listener failed")

    def forget(self, peer: ID) -> None:
        self._windows.pop(peer, None)


class GuardedGossipSub(GossipSub):
    """GossipSub whose inbound GRAFT/PRUNE/IHAVE/IWANT are budgeted per peer."""

    def __init__(self, *args: Any, budget: _Budget, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget = budget

    async def handle_rpc(self, rpc: Any, sender_peer_id: ID) -> None:
        """Drop the control entries over the sender's budgets, then handle the rest."""
        control = rpc.control
        b, lim = self.budget, self.budget.limits
        grafts = len(control.graft) + len(control.prune)
        if not b.take(
            sender_peer_id, "graft_prune", grafts, lim.max_graft_prune, "graft_prune_flood"
        ):
            control.ClearField("graft")
            control.ClearField("prune")
        ihave = sum(len(i.messageIDs) for i in control.ihave)
        if not b.take(sender_peer_id, "ihave", ihave, lim.max_ihave_ids, "ihave_flood"):
            control.ClearField("ihave")
        iwant = sum(len(i.messageIDs) for i in control.iwant)
        if not b.take(sender_peer_id, "iwant", iwant, lim.max_iwant_ids, "iwant_flood"):
            control.ClearField("iwant")
        await super().handle_rpc(rpc, sender_peer_id)


class GuardedPubsub(Pubsub):
    """Pubsub that reports a peer subscribing to more than `max_topics` topics at once
    (the library ignores the excess silently) and an oversize RPC, and that a remote's
    garbage or a ban race cannot crash:

    - A GossipSub RPC that is not protobuf raises `DecodeError` out of the library's
      stream reader, which takes the host down: here that stream is reset instead (the
      peer's other streams and the host go on). Safe: the library drops the stream on
      every other read error too.
    - Banning a peer whose pubsub stream went away meanwhile raised `KeyError` in the
      library's blacklist teardown (`del self.peers[peer_id]` after an await): here the
      peer is popped, so a peer already gone is simply forgotten.
    """

    def __init__(self, *args: Any, budget: _Budget, **kwargs: Any) -> None:
        kwargs.setdefault("max_subscriptions_per_peer", budget.limits.max_topics)
        super().__init__(*args, **kwargs)
        self.budget = budget

    async def continuously_read_stream(self, stream: Any) -> None:
        """The library's reader, with oversize RPCs reported and garbage ending the stream."""
        peer = stream.muxed_conn.peer_id
        detail_prefix = "inbound RPC over the size limit"
        token = OVERSIZE_REPORT.set(
            lambda detail: self.budget.flag(peer, "oversize_rpc", f"{detail_prefix}: {detail}")
        )
        try:
            await super().continuously_read_stream(stream)
        except DecodeError:
            log.info("GossipSub RPC that is not protobuf; stream reset")
            with contextlib.suppress(Exception):
                await stream.reset()
        finally:
            OVERSIZE_REPORT.reset(token)

    async def _teardown_if_connected(self, peer_id: ID) -> None:
        stream = self.peers.get(peer_id)
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.reset()
            self.peers.pop(peer_id, None)
        self._forget_all_subscriptions(peer_id)

    def handle_subscription(self, origin_id: ID, sub_message: Any) -> None:
        """The library's handling, with a subscription past `max_topics` reported."""
        topic = sub_message.topicid
        was_new = sub_message.subscribe and origin_id not in self.peer_topics.get(topic, ())
        super().handle_subscription(origin_id, sub_message)
        if was_new and origin_id not in self.peer_topics.get(topic, ()):
            self.budget.flag(
                origin_id,
                "too_many_topics",
                f"subscription to {topic[:64]!r} past {self.budget.limits.max_topics} topics",
            )


def new_budget(limits: ControlLimits, report: Report) -> _Budget:
    """The per-peer control budgets shared by a host's `GuardedGossipSub` and `GuardedPubsub`."""
    return _Budget(limits, report)
