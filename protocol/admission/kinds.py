"""Per-kind rules: how each kind of message is opened and which stages it goes through.

`KindRule` says it for one kind, `KIND_RULES` for every kind; `Opened` is what an opener
returns. The openers decode and verify in one call (`protocol.envelope`, `protocol.rollout`)
and raise only `RemoteProtocolError` subclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.admission.vocabulary import PIPELINE, Kind, Stage
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import open_envelope
from protocol.equivocation import from_wire
from protocol.rollout import OpenedRollout, check_body, open_header
from protocol.wire import (
    Delegation,
    Envelope,
    EquivocationEvidence,
    FraudEvidence,
    ProducerClaim,
    RolloutHeader,
    RolloutRecord,
    Verdict,
    WeightManifest,
)

__all__ = [
    "ENVELOPE_SLACK",
    "KIND_RULES",
    "KindRule",
    "Opened",
    "envelope_opener",
    "open_equivocation",
    "open_rollout_header",
    "open_rollout_record",
]


@dataclass(frozen=True, slots=True)
class Opened:
    """What an opener returns: the signed envelope, the decoded object, the content id."""

    envelope: Envelope
    obj: Any
    content_id: bytes
    header: bytes | None = None  # rollout kinds: the header envelope bytes
    body: bytes | None = None  # rollout record: the body bytes


def open_rollout_header(data: bytes) -> Opened:
    """Open a gossiped rollout header envelope (decode and verify its signature)."""
    env, header, rid = open_header(data)
    return Opened(env, header, rid, header=bytes(data))


def open_rollout_record(data: bytes) -> Opened:
    """Open a pulled rollout record: its header envelope, and its body against the digest."""
    record = decode(RolloutRecord, data)
    env, header, rid = open_header(record.header)
    body = check_body(header, record.body)
    opened = OpenedRollout(env, header, body, rid, bytes(data))
    return Opened(env, opened, rid, header=record.header, body=record.body)


def envelope_opener(cls: type) -> Callable[[bytes], Opened]:
    """An opener of signed envelopes carrying a `cls` (content id: hash of the bytes)."""

    def opener(data: bytes) -> Opened:
        env, obj = open_envelope(data, cls)
        return Opened(env, obj, content_id(data))

    opener.__name__ = f"open_{cls.__name__}"
    return opener


def open_equivocation(data: bytes) -> Opened:
    """Open gossiped equivocation evidence: the reporter's envelope, then both signed
    objects inside it (`protocol.equivocation.evidence`; evidence that proves nothing is
    malformed, whoever relays it). `obj` is the checked `Equivocation`."""
    env, wire_ev = open_envelope(data, EquivocationEvidence)
    return Opened(env, from_wire(wire_ev, env.run_id), content_id(data))


@dataclass(frozen=True, slots=True)
class KindRule:
    """How one kind of message is admitted.

    opener:       bytes -> Opened; raises only `RemoteProtocolError` subclasses
    max_bytes:    the SIZE stage's limit
    gossip:       arrives by gossip: timestamp skew and replay apply, a signer rate limit
                  applies, and an admitted copy is forwarded
    versioned:    the envelope's policy version must be within the staleness bound
    weights:      a weight announcement: signer must hold a trainer key, version must be new
    store:        emit Store for admitted items
    dedup_with:   kinds whose admitted ids also make this one a duplicate
    work:         a rollout: one per (producer, counter) and per body digest (UNIQUE)
    judged:       a verdict or producer claim: the signer must be allowed to judge
                  (`protocol.authority`), must not judge its own work, and a sample
                  ticket must be its own
    delegation:   a trainer-signed grant or revocation of the right to judge
    evidence:     equivocation evidence: it must name a key with authority in this run
                  (a trainer key for policy versions, a named judge for verdicts and claims)
    """

    opener: Callable[[bytes], Opened]
    max_bytes: int
    gossip: bool
    versioned: bool
    store: bool
    weights: bool = False
    dedup_with: tuple[Kind, ...] = ()
    work: bool = False
    judged: bool = False
    delegation: bool = False
    evidence: bool = False

    def stages(self) -> tuple[Stage, ...]:
        """The stages this kind goes through, in pipeline order."""
        skip = set()
        if not self.gossip:
            # Pulled on our own request: bounded by what we asked for, never rate-limited
            # against the peer that answered.
            skip |= {Stage.RATE, Stage.REPLAY, Stage.FORWARD, Stage.QUOTA}
        if not self.work:
            skip.add(Stage.UNIQUE)
        if not self.store:
            skip.add(Stage.STORE)
        return tuple(s for s in PIPELINE if s not in skip)


ENVELOPE_SLACK = 1024  # envelope fields around the payload (see Envelope)

KIND_RULES: Mapping[Kind, KindRule] = {
    Kind.ROLLOUT_HEADER: KindRule(
        open_rollout_header,
        RolloutHeader.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=True,
        dedup_with=(Kind.ROLLOUT_RECORD,),
        work=True,
    ),
    Kind.ROLLOUT_RECORD: KindRule(
        open_rollout_record,
        RolloutRecord.MAX_BYTES,
        gossip=False,
        versioned=True,
        store=True,
        work=True,
    ),
    Kind.VERDICT: KindRule(
        envelope_opener(Verdict),
        Verdict.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=True,
        judged=True,
    ),
    Kind.DELEGATION: KindRule(
        envelope_opener(Delegation),
        Delegation.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=False,
        store=False,
        delegation=True,
    ),
    Kind.WEIGHT_ANNOUNCE: KindRule(
        envelope_opener(WeightManifest),
        WeightManifest.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=False,
        store=False,
        weights=True,
    ),
    Kind.WEIGHT_MANIFEST: KindRule(
        envelope_opener(WeightManifest),
        WeightManifest.MAX_BYTES + ENVELOPE_SLACK,
        gossip=False,
        versioned=False,
        store=False,
        weights=True,
    ),
    Kind.FRAUD_EVIDENCE: KindRule(
        envelope_opener(FraudEvidence),
        FraudEvidence.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=False,
    ),
    Kind.PRODUCER_CLAIM: KindRule(
        envelope_opener(ProducerClaim),
        ProducerClaim.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=False,
        judged=True,
    ),
    Kind.EQUIVOCATION: KindRule(
        open_equivocation,
        EquivocationEvidence.MAX_BYTES + ENVELOPE_SLACK,
        gossip=True,
        versioned=False,
        store=False,
        evidence=True,
    ),
}
