"""Equivocation: one key, two valid signatures over different objects of the same slot.

An authority of the run signs objects that must be unique per slot: a trainer key signs one
policy version per version number, a validator key one verdict per rollout and one claim
per producer window. Two such objects that differ split the swarm (each half installs or
believes its own side), so the two envelopes together are evidence against the key that
signed them: self-contained (both signatures verify with the key named in them, nothing
else is needed), and re-checked by every peer that receives it.

Slots (`slot_of`) and what makes two objects of one slot conflict (`conflicts`):

    weight manifest   (version, kind, base version, base digest): any other bytes (a
                      full manifest and a patch of one version are two slots; the
                      publisher signs both)
    verdict           (rollout id): another pass/fail (a verdict naming another producer
                      than the rollout's counts for nothing anywhere: no conflict)
    producer claim    (producer, rollout ids): another statistic or limit (the window's
                      value may differ in its last digits between two honest audits of it)

`evidence(first, second)` checks two envelopes and returns the `Equivocation`, or raises
`DecodeError`/`SignatureError` (the bytes prove nothing). `EquivocationEvidence` is its
wire form, gossiped inside an envelope signed by whoever saw it first.

`EquivocationBook` keeps, per slot, the first object seen (bounded), turns a conflicting
second into evidence, and keeps the evidence learnt: the keys to treat as failed
(`failed`) and the policy versions whose manifests a trainer key equivocated over
(`disputed`: records made under a disputed version are neither passed nor failed, nobody
is charged for them, and the run goes on at the next undisputed version). Pure: time is
passed in; no IO.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from protocol.codec import decode, encode
from protocol.envelope import open_envelope
from protocol.errors import DecodeError
from protocol.wire import Envelope, EquivocationEvidence, ProducerClaim, Verdict, WeightManifest

__all__ = [
    "SLOTTED",
    "Equivocation",
    "EquivocationBook",
    "conflicts",
    "evidence",
    "slot_of",
]

SLOTTED: dict[str, type] = {
    WeightManifest.KIND: WeightManifest,
    Verdict.KIND: Verdict,
    ProducerClaim.KIND: ProducerClaim,
}
"""The signed kinds that have slots: kind -> its wire class."""


def slot_of(kind: str, obj: Any) -> tuple[Any, ...] | None:
    """The slot of a signed object of `kind` (None: the kind has no slots)."""
    if kind == WeightManifest.KIND:
        return (obj.version, obj.kind, obj.base_version, bytes(obj.base_digest))
    if kind == Verdict.KIND:
        return (bytes(obj.rollout_id),)
    if kind == ProducerClaim.KIND:
        return (bytes(obj.producer), tuple(bytes(r) for r in obj.rollout_ids))
    return None


def _decision(kind: str, obj: Any) -> Any:
    """What of an object two signatures of one slot must agree on."""
    if kind == Verdict.KIND:
        return bool(obj.passed)
    if kind == ProducerClaim.KIND:
        return (obj.statistic, float(obj.limit))
    return hashlib.sha256(encode(obj)).digest()


def conflicts(kind: str, a: Any, b: Any) -> bool:
    """Whether two objects of one slot say different things."""
    return _decision(kind, a) != _decision(kind, b)


@dataclass(frozen=True, slots=True)
class Equivocation:
    """Checked evidence: `signer` signed `first` and `second` (envelope bytes, in byte
    order), two conflicting objects of `kind` in `slot` of run `run_id`."""

    signer: bytes
    kind: str
    run_id: str
    slot: tuple[Any, ...]
    first: bytes
    second: bytes

    @property
    def version(self) -> int | None:
        """The policy version a trainer key equivocated over (None for other kinds)."""
        return int(self.slot[0]) if self.kind == WeightManifest.KIND else None

    @property
    def key(self) -> tuple[bytes, str, str, tuple[Any, ...]]:
        """(signer, kind, run, slot): one piece of evidence per slot."""
        return (self.signer, self.kind, self.run_id, self.slot)

    def wire(self) -> EquivocationEvidence:
        """Its wire form."""
        return EquivocationEvidence(first=self.first, second=self.second)

    def describe(self) -> dict[str, Any]:
        """A short summary for status and the ledger (hex names)."""
        slot = self.slot[0] if self.kind == WeightManifest.KIND else bytes(self.slot[0]).hex()
        return {"signer": self.signer.hex(), "kind": self.kind, "slot": slot}


def _open(data: bytes) -> tuple[Envelope, Any]:
    env = decode(Envelope, data)
    cls = SLOTTED.get(env.kind)
    if cls is None:
        raise DecodeError("EquivocationEvidence", None, f"kind {env.kind!r} has no slots")
    return open_envelope(data, cls)


def evidence(first: bytes, second: bytes, run_id: str | None = None) -> Equivocation:
    """Check two envelopes as evidence of equivocation (of run `run_id` when given).

    Raises `DecodeError` when they are not (another kind, another key, another run or
    slot, the same object) and `SignatureError` when a signature does not verify."""
    first, second = sorted((bytes(first), bytes(second)))
    env_a, a = _open(first)
    env_b, b = _open(second)

    def refuse(problem: str) -> DecodeError:
        return DecodeError("EquivocationEvidence", None, problem)

    if env_a.kind != env_b.kind:
        raise refuse("two kinds of object")
    if env_a.signer != env_b.signer:
        raise refuse("two signers")
    if env_a.run_id != env_b.run_id or (run_id is not None and env_a.run_id != run_id):
        raise refuse("another run")
    slot = slot_of(env_a.kind, a)
    if slot is None or slot != slot_of(env_b.kind, b):
        raise refuse("two slots")
    if not conflicts(env_a.kind, a, b):
        raise refuse("the two objects agree")
    return Equivocation(bytes(env_a.signer), env_a.kind, env_a.run_id, slot, first, second)


def from_wire(ev: EquivocationEvidence, run_id: str | None = None) -> Equivocation:
    """`evidence` of a received `EquivocationEvidence`."""
    return evidence(ev.first, ev.second, run_id)


@dataclass
class _Seen:
    decision: Any
    data: bytes
    at: float


class EquivocationBook:
    """The first object seen per slot, and the evidence learnt (module docstring).

    `max_slots` slots are remembered (oldest forgotten first; their objects must also
    fit in `max_bytes`); `max_evidence` pieces of evidence are kept (the keys they name
    stay failed: a key that equivocates once is failed for good)."""

    def __init__(
        self, max_slots: int = 16_384, max_bytes: int = 32 * 1024 * 1024, max_evidence: int = 1024
    ) -> None:
        self.max_slots, self.max_bytes, self.max_evidence = max_slots, max_bytes, max_evidence
        self._seen: OrderedDict[tuple[Any, ...], _Seen] = OrderedDict()
        self._bytes = 0
        self.found: OrderedDict[tuple[Any, ...], tuple[Equivocation, float]] = OrderedDict()
        self.failed_keys: dict[bytes, float] = {}  # key -> when its evidence was learnt
        self.disputed: set[int] = set()

    def observe(self, env: Envelope, obj: Any, data: bytes, now: float) -> Equivocation | None:
        """A signed object whose signature verified: new evidence when it conflicts with
        the first object seen in its slot (learnt at once), else None."""
        slot = slot_of(env.kind, obj)
        if slot is None:
            return None
        key = (bytes(env.signer), env.kind, env.run_id, slot)
        decision = _decision(env.kind, obj)
        seen = self._seen.get(key)
        if seen is None:
            self._remember(key, _Seen(decision, bytes(data), now))
            return None
        if seen.decision == decision or key in self.found:
            return None
        ev = evidence(seen.data, bytes(data))
        return ev if self.learn(ev, now) else None

    def learn(self, ev: Equivocation, now: float) -> bool:
        """Keep checked evidence; False when this slot's evidence was known already."""
        if ev.key in self.found:
            return False
        self.found[ev.key] = (ev, now)
        while len(self.found) > self.max_evidence:
            self.found.popitem(last=False)
        self.failed_keys.setdefault(ev.signer, now)
        if ev.version is not None:
            self.disputed.add(ev.version)
        return True

    def failed(self, key: bytes) -> bool:
        """Whether `key` equivocated (in evidence we hold)."""
        return bytes(key) in self.failed_keys

    def is_disputed(self, version: int) -> bool:
        """Whether a trainer key equivocated over policy `version`."""
        return version in self.disputed

    def evidence(self) -> list[Equivocation]:
        """The evidence held, oldest first."""
        return [ev for ev, _ in self.found.values()]

    def summary(self) -> list[dict[str, Any]]:
        """The evidence held, for status: signer, kind, slot and when it was learnt."""
        return [{**ev.describe(), "at": round(at, 3)} for ev, at in self.found.values()]

    def _remember(self, key: tuple[Any, ...], seen: _Seen) -> None:
        self._seen[key] = seen
        self._bytes += len(seen.data)
        while self._seen and (len(self._seen) > self.max_slots or self._bytes > self.max_bytes):
            _k, old = self._seen.popitem(last=False)
            self._bytes -= len(old.data)
