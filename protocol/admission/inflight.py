"""A message on its way through the stages (`InFlight`), a stage's refusal of it (`Refused`),
and the small pure questions the stages ask about peers and work (who relayed what, which
unit of work a rollout is).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.admission.kinds import KindRule, Opened
from protocol.admission.messages import Admitted
from protocol.admission.vocabulary import Kind, Reason, Stage
from protocol.identity import peer_id_to_b58
from protocol.peer_score import PeerId
from protocol.rollout import OpenedRollout
from protocol.version_claims import AskNewest
from protocol.wire import RolloutHeader

__all__ = [
    "InFlight",
    "Refused",
    "as_peer_form",
    "relaying",
    "rollout_header",
    "same_peer",
    "work_key",
]


class Refused(Exception):
    """A stage refused the message; `Admission.handle` turns it into actions (it never
    escapes). `penalty` None: the reason's default cost; `blame_signer`: the content proves
    its signer's fault (it is remembered, and the signer pays whoever relayed it);
    `wasteful`: free for a relay only within its allowance of blameless refusals; `ask`:
    a question the sender can answer to back its claim; `late`: see `Reject.late`."""

    def __init__(
        self,
        stage: Stage,
        reason: Reason,
        detail: str,
        penalty: float | None = None,
        signer: bytes | None = None,
        blame_signer: bool = False,
        wasteful: bool = False,
        ask: AskNewest | None = None,
    ) -> None:
        super().__init__(detail)
        self.stage, self.reason, self.detail = stage, reason, detail
        self.penalty, self.signer, self.blame_signer = penalty, signer, blame_signer
        self.wasteful = wasteful
        self.ask = ask
        self.late: Admitted | None = None


@dataclass(slots=True)
class InFlight:
    """A message on its way through the stages (DECODE fills `opened`)."""

    peer: PeerId
    now: float
    kind: Kind
    rule: KindRule
    data: bytes | bytearray | memoryview
    opened: Opened | None = None
    origin: PeerId | None = None


def relaying(sender: PeerId, origin: PeerId | None, signer: bytes) -> bool:
    """Whether `sender` handed us `signer`'s message as a relay: it is not the signer, and
    not the gossip message's publisher either. An honest node publishes only what it signed
    itself, so the publisher of another key's message is its author, and gets none of the
    leniency relays get for faults that depend on the receiver's view."""
    return not same_peer(sender, signer) and not (origin is not None and origin == sender)


def same_peer(sender: PeerId, signer: bytes) -> bool:
    """Whether the sender is the signer: peer ids as bytes, or as base58 text (`12D3KooW...`)."""
    if isinstance(sender, str):
        return sender == peer_id_to_b58(signer)
    return sender == signer


def as_peer_form(like: PeerId, peer_id: bytes) -> PeerId:
    """A signer's peer id in the form senders are given in (text or bytes)."""
    return peer_id_to_b58(peer_id) if isinstance(like, str) else peer_id


def rollout_header(op: Opened) -> RolloutHeader:
    """The `RolloutHeader` of an opened rollout header or record."""
    obj = op.obj
    return obj.header if isinstance(obj, OpenedRollout) else obj


def work_key(op: Opened) -> tuple[int, bytes]:
    """(counter, body digest) of an opened rollout header or record. The policy version is
    not part of the unit: one counter is one task whatever version a rollout claims."""
    header = rollout_header(op)
    return header.counter, header.body_digest
