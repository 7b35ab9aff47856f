"""Catch-up (anti-entropy) and delivery accounting: which rollouts to ask whom for, and
what became of our own. Pure rules: time passed in, actions returned, no IO.

Why: gossip offers a header once. What is published while a receiver is down, or sits in
a producer's outbox when it crashes, is never offered again; only asking closes the gap.

The exchange (carried by `node.exchange.sync`): a peer asks a neighbour "the rollouts you
hold with a body, received at or after `since` (your clock), made at policy version >=
`min_version`, optionally only those of `producer`", one page at a time, oldest first.

Two modes, one machine (`CatchUp`):

- PULL (validators, trainers, relays: peers that pull bodies). Every connected peer is
  asked, at once when it (re)joins (a hello from a peer already joined changes nothing)
  and then every `interval_s`. The offered ids this
  peer does not hold go out as `Pull(peer, ids)`; the node fetches them over the body
  stream and feeds them to admission as `Kind.ROLLOUT_RECORD`, exactly like a body pulled
  after a header: nothing bypasses the checks.
- RECEIPT (inference workers). Peers with the trainer role are asked for our own
  rollouts only (`producer` = us); the ids they hold come back as `Receipt(peer, ids)`:
  those rollouts are delivered. A worker's unacknowledged rollouts are thereby offered
  again to every puller that asks it (its answers list everything it stores), which is
  how a lost outbox is re-announced.

Watermarks: the first question to a peer starts at `since = 0` bounded by the staleness
window (`min_version = t - S`); after a page, the next `since` is the newest `at` in it;
when a round ends (`more` false) the next round starts `overlap_s` before that (items
admitted before a question may be committed after it). Every `full_every_s` a round starts
at 0 again (bounded by the staleness window): an id whose pull failed after its round is
offered again then, so a failure is never final. Watermarks are per peer, in that
peer's clock, kept in memory: after a restart the first round starts at 0 again, still
bounded by the staleness window.

Delivery accounting (`classify`): each of our own rollouts is delivered (a trainer holds
it), too stale (no receipt and older than `t - S`: no trainer may use it any more; kept
with its reason, never silently lost), or pending.

Public API: `CatchUpConfig`, `CatchUp(config, pulls)` with `.handle(event) -> list[Action]`;
events `PeerJoined(peer, now, receipts_from)`, `PeerLeft(peer, now)`, `Tick(now)`,
`Answered(peer, ids, ats, more, held, now)`, `Failed(peer, now)`; actions
`Ask(peer, since, min_version, producer)`, `Pull(peer, ids)`, `Receipt(peer, ids)`;
`classify(own, delivered, version, max_staleness) -> Delivery`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError

__all__ = [
    "Action",
    "Answered",
    "Ask",
    "CatchUp",
    "CatchUpConfig",
    "Delivery",
    "Event",
    "Failed",
    "PeerJoined",
    "PeerLeft",
    "Pull",
    "Receipt",
    "Tick",
    "classify",
]


@dataclass(frozen=True, slots=True)
class CatchUpConfig:
    """Timing and page sizes of catch-up rounds."""

    interval_s: float = 5.0  # a round per peer this often
    overlap_s: float = 60.0  # each round re-reads this much before the last watermark
    retry_s: float = 2.0  # after a failed question
    page: int = 1024  # ids per answer
    max_pages_per_round: int = 16
    full_every_s: float = 60.0  # a round from 0 this often (ids only: cheap)

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.overlap_s >= 0 and self.retry_s > 0):
            raise LocalProtocolError("CatchUpConfig: intervals must be positive")
        if not (1 <= self.page <= 4096 and self.max_pages_per_round >= 1):
            raise LocalProtocolError("CatchUpConfig: page in 1..4096, pages per round >= 1")


# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerJoined:
    """`peer` connected: catch up with it (and ask it for receipts if it is a trainer)."""

    peer: str
    now: float
    receipts_from: bool = False  # the peer is a trainer: ask it for receipts of our work


@dataclass(frozen=True, slots=True)
class PeerLeft:
    """`peer` disconnected: stop catching up with it."""

    peer: str
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; our current version `version` and the staleness bound `max_staleness`."""

    now: float
    version: int = 0  # our policy version t
    max_staleness: int = 0  # S


@dataclass(frozen=True, slots=True)
class Answered:
    """A page of `peer`'s answer: `ids[i]` received at `ats[i]` (its clock); `held[i]`
    says whether we already hold that body (the caller looks it up)."""

    peer: str
    ids: tuple[bytes, ...]
    ats: tuple[float, ...]
    more: bool
    held: tuple[bool, ...]
    now: float


@dataclass(frozen=True, slots=True)
class Failed:
    """The question to `peer` failed (no answer, a broken stream)."""

    peer: str
    now: float


Event = PeerJoined | PeerLeft | Tick | Answered | Failed


# -- actions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ask:
    """Ask `peer` for ids of rollouts since `since` of at least `min_version` (action)."""

    peer: str
    since: float
    min_version: int
    producer: bytes | None  # None: every producer (PULL); ours (RECEIPT)


@dataclass(frozen=True, slots=True)
class Pull:
    """Pull the records of `ids` from `peer` (action)."""

    peer: str
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Receipt:
    """`peer` (a trainer) holds these of our rollouts: they are delivered (action)."""

    peer: str
    ids: tuple[bytes, ...]


Action = Ask | Pull | Receipt


@dataclass(slots=True)
class _Peer:
    receipts: bool
    watermark: float = 0.0  # next round starts here (its clock)
    cursor: float = 0.0  # within a round: the next page starts here
    next_round: float = 0.0  # our clock
    last_full: float = 0.0  # our clock: when a round last started at 0
    asking: bool = False
    pages: int = 0


@dataclass
class CatchUp:
    """Per-peer catch-up state of one node (see the module docstring).

    `pulls`: this node pulls bodies (PULL mode for every peer). `producer`: our signer
    id, asked for in RECEIPT mode (None: we never ask for receipts).
    """

    config: CatchUpConfig = field(default_factory=CatchUpConfig)
    pulls: bool = True
    producer: bytes | None = None
    min_version: int = 0
    _peers: dict[str, _Peer] = field(default_factory=dict)

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; returns the actions to carry out, in order."""
        if isinstance(event, PeerJoined):
            return self._joined(event)
        if isinstance(event, PeerLeft):
            self._peers.pop(event.peer, None)
            return []
        if isinstance(event, Tick):
            return self._tick(event)
        if isinstance(event, Answered):
            return self._answered(event)
        if isinstance(event, Failed):
            p = self._peers.get(event.peer)
            if p is not None:
                p.asking, p.pages, p.next_round = False, 0, event.now + self.config.retry_s
            return []
        raise LocalProtocolError(f"CatchUp cannot handle {type(event).__name__}")

    def _mode_applies(self, p: _Peer) -> bool:
        return self.pulls or (p.receipts and self.producer is not None)

    def _ask(self, peer: str, p: _Peer) -> Ask:
        p.asking = True
        return Ask(peer, p.cursor, self.min_version, None if self.pulls else self.producer)

    def _joined(self, ev: PeerJoined) -> list[Action]:
        p = self._peers.get(ev.peer)
        if p is not None:
            # Already joined (a hello on a live connection): its rounds go on as they
            # were, unless it just turned out to be a trainer a worker asks for receipts.
            if p.receipts or not ev.receipts_from:
                return []
            p.receipts = True
        else:
            p = self._peers[ev.peer] = _Peer(ev.receipts_from)
        p.next_round = ev.now  # a (re)joined peer is asked at once, from 0
        p.watermark, p.last_full = 0.0, ev.now
        return self._tick(Tick(ev.now, self.min_version, 0))

    def _tick(self, ev: Tick) -> list[Action]:
        if isinstance(ev, Tick) and ev.max_staleness:
            self.min_version = max(0, ev.version - ev.max_staleness)
        out: list[Action] = []
        for peer, p in self._peers.items():
            if p.asking or ev.now < p.next_round or not self._mode_applies(p):
                continue
            if ev.now - p.last_full >= self.config.full_every_s:
                p.watermark, p.last_full = 0.0, ev.now
            p.cursor, p.pages = p.watermark, 0
            out.append(self._ask(peer, p))
        return out

    def _answered(self, ev: Answered) -> list[Action]:
        p = self._peers.get(ev.peer)
        if p is None or not p.asking:
            return []  # left meanwhile, or an answer we did not ask for
        if not (len(ev.ids) == len(ev.ats) == len(ev.held)):
            raise LocalProtocolError("Answered: ids, ats and held differ in length")
        out: list[Action] = []
        if self.pulls:
            missing = tuple(i for i, h in zip(ev.ids, ev.held, strict=True) if not h)
            if missing:
                out.append(Pull(ev.peer, missing))
        elif ev.ids:
            out.append(Receipt(ev.peer, tuple(ev.ids)))
        newest = max(ev.ats, default=p.cursor)
        p.pages += 1
        p.asking = False
        if ev.more and p.pages < self.config.max_pages_per_round and newest > p.cursor:
            p.cursor = newest
            out.append(self._ask(ev.peer, p))
            return out
        if ev.more:  # page budget spent (or a page of one instant): continue next tick
            p.watermark = newest
            p.next_round = ev.now
        else:
            p.watermark = max(p.watermark, newest - self.config.overlap_s)
            p.next_round = ev.now + self.config.interval_s
        return out


# -- delivery accounting ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """Our own rollouts split into delivered, too stale to train on, and pending."""

    delivered: frozenset[bytes]
    too_stale: frozenset[bytes]
    pending: frozenset[bytes]

    def counts(self) -> dict[str, int]:
        """How many rollouts are in each group, and produced in all."""
        return {
            "produced": len(self.delivered) + len(self.too_stale) + len(self.pending),
            "delivered": len(self.delivered),
            "pending": len(self.pending),
            "too_stale": len(self.too_stale),
        }


def classify(
    own: Iterable[tuple[bytes, int]], delivered: Iterable[bytes], version: int, max_staleness: int
) -> Delivery:
    """Our own rollouts `(id, policy_version)`: delivered (a trainer holds it), too stale
    (no receipt and `version - v > max_staleness`), or pending."""
    got = set(delivered)
    d, stale, pending = set(), set(), set()
    for rid, v in own:
        if rid in got:
            d.add(rid)
        elif version - v > max_staleness:
            stale.add(rid)
        else:
            pending.add(rid)
    return Delivery(frozenset(d), frozenset(stale), frozenset(pending))
