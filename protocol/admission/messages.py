"""Admission's events (what comes in, with the time) and actions (what the caller carries out).

All frozen dataclasses; `verdict_of` reads a message's actions as a gossip router's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.admission.vocabulary import Kind, Reason, Stage
from protocol.equivocation import Equivocation
from protocol.peer_score import PeerId, PeerRecord
from protocol.version_claims import AskNewest
from protocol.wire import Envelope

__all__ = [
    "Action",
    "Admitted",
    "Ban",
    "BodyMissing",
    "Deliver",
    "Disconnect",
    "Equivocated",
    "Event",
    "Forward",
    "Known",
    "MessageReceived",
    "Misbehaved",
    "NewestShown",
    "PeerConnected",
    "Penalized",
    "Reject",
    "Store",
    "StoreFailed",
    "Tick",
    "Unban",
    "VersionChanged",
    "verdict_of",
]


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """`peer` handed us `data` (for gossip: the hop that forwarded it). `origin`, when the
    transport knows it, is the gossip message's publisher, authenticated by the message's
    own signature (GossipSub strict signing): a relay forwards with the origin unchanged."""

    peer: PeerId
    kind: Kind | str
    data: bytes
    now: float
    origin: PeerId | None = None


@dataclass(frozen=True, slots=True)
class VersionChanged:
    """Our policy version is now `version` (versions only rise in practice; any is taken)."""

    version: int
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: lift ended bans (-> `Unban`) and expire caches."""

    now: float


@dataclass(frozen=True, slots=True)
class PeerConnected:
    """`peer` connected: -> `Disconnect` if it is banned."""

    peer: PeerId
    now: float


@dataclass(frozen=True, slots=True)
class Misbehaved:
    """A role found fault with `peer`: `penalty` (<= 0) is the score change, `reason` the
    role's words for it, `offence` its name in `protocol.penalties` (the ledger's reason;
    "misbehaved" when not given)."""

    peer: PeerId
    penalty: float
    reason: str
    now: float
    offence: str | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A message that passed every check."""

    kind: Kind
    content_id: bytes
    sender: PeerId
    envelope: Envelope
    obj: Any
    data: bytes
    received_at: float
    header: bytes | None = None
    body: bytes | None = None

    @property
    def signer(self) -> bytes:
        """The key that signed the item's envelope."""
        return self.envelope.signer

    @property
    def policy_version(self) -> int:
        """The policy version the item's envelope claims."""
        return self.envelope.policy_version


@dataclass(frozen=True, slots=True)
class StoreFailed:
    """The node could not store an admitted item: forget it so a copy can be admitted later."""

    item: Admitted
    now: float


@dataclass(frozen=True, slots=True)
class Known:
    """Items already stored (loaded at start): their copies are duplicates, their signers not new."""

    kind: Kind
    ids: tuple[bytes, ...]
    now: float
    signers: tuple[bytes, ...] = ()  # signers of stored items: not new identities


@dataclass(frozen=True, slots=True)
class BodyMissing:
    """The node gave up pulling the body of an admitted header (no source served it).

    `answered`: how many times a source answered without the body (or with a bad one).
    0 means every attempt failed to connect (a source restarting, say): no evidence
    against anyone, nobody pays (the header stays owed and expires if it never comes)."""

    rollout_id: bytes
    signer: bytes
    sender: PeerId
    now: float
    answered: int = 1


@dataclass(frozen=True, slots=True)
class NewestShown:
    """The answer to an `AskNewest`: the signed manifest envelope `peer` sent as the newest
    it holds (None: it said it holds none). `answered=False`: no answer came (could not
    connect, timed out): no evidence, nobody pays."""

    peer: PeerId
    envelope: bytes | None
    now: float
    answered: bool = True


Event = (
    MessageReceived
    | VersionChanged
    | Tick
    | PeerConnected
    | Misbehaved
    | StoreFailed
    | Known
    | BodyMissing
    | NewestShown
)


@dataclass(frozen=True, slots=True)
class Reject:
    """A message refused. `penalty` is the score change applied to `peer` (<= 0)."""

    peer: PeerId
    reason: Reason
    penalty: float
    stage: Stage
    detail: str = ""
    kind: str | None = None
    # A STALE refusal of an authentic rollout (signature checked): it was published, only
    # late, so work accounting counts its counter (`protocol.accounting`), not a gap.
    late: Admitted | None = None

    @property
    def verdict(self) -> str:
        """Gossipsub's word for it: "reject" (a fault) or "ignore" (drop, no blame)."""
        return "reject" if self.penalty < 0 else "ignore"


@dataclass(frozen=True, slots=True)
class Penalized:
    """A score change (`penalty` < 0) charged to `peer` other than the sender's own refusal
    (a `Reject` reports that): a role's finding (`Misbehaved`), a body nobody served, the
    signer of double work someone else relayed. Log it and write it to the ledger, like a
    `Reject` (it has the same fields: `reason` is the offence's name in `protocol.penalties`,
    `stage` where it was found, "role" for a role's finding)."""

    peer: PeerId
    reason: str
    penalty: float
    stage: str
    detail: str = ""
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class Store:
    """Store the admitted item (kinds with STORE)."""

    item: Admitted


@dataclass(frozen=True, slots=True)
class Forward:
    """Let the gossip router propagate the admitted item (gossiped kinds)."""

    item: Admitted


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the admitted item to the local role."""

    item: Admitted


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the connection to `peer`."""

    peer: PeerId
    reason: Reason


@dataclass(frozen=True, slots=True)
class Ban:
    """`peer` is banned until `until`; persist `record` so the ban survives a restart."""

    peer: PeerId
    until: float
    record: PeerRecord  # persist this (node.store.store.Store.save_peer)


@dataclass(frozen=True, slots=True)
class Unban:
    """`peer`'s ban ended."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class Equivocated:
    """New evidence that a key of the run signed two conflicting objects of one slot
    (`protocol.equivocation`): keep it (status, ledger); gossip it when `found_here` (we
    saw both objects ourselves; evidence received by gossip is forwarded as it is)."""

    evidence: Equivocation
    found_here: bool


Action = (
    Reject
    | Penalized
    | Store
    | Forward
    | Deliver
    | Disconnect
    | Ban
    | Unban
    | AskNewest
    | Equivocated
)


def verdict_of(actions: list[Action]) -> str:
    """What a message's actions mean to the gossip router: "accept" (admitted: deliver and
    forward), "reject" (its sender was charged: a fault no honest peer passes on; counts
    against the sender in gossipsub's score), or "ignore" (drop, do not forward, no blame:
    a copy, over a rate, what only our view refuses, a fault of a signer it only relayed)."""
    for action in actions:
        if isinstance(action, Store | Forward | Deliver):
            return "accept"
        if isinstance(action, Reject):
            return action.verdict
    return "ignore"
