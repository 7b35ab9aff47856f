"""Signed envelopes: sealing an object under a peer's key, opening and checking one.

What is signed: `b"swarm-rl/v1/" + kind + b"\\x00"` (the domain-separation prefix, so a
signature over one kind of object can never be passed off as another) followed by the
canonical encoding of the envelope's fields without the signature. The signer's public key
is inside its peer id, so nothing else is needed to verify.

Against replay, every envelope names its run, the policy version, a sequence number (per
signer and kind) and a timestamp; `ReplayGuard` rejects other runs, repeats, and clocks outside the
allowed skew. It keeps bounded state and takes the time as an argument.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

from protocol.codec import WireObject, decode, encode, pack, to_wire
from protocol.errors import DecodeError, LocalProtocolError, ReplayError, SignatureError
from protocol.identity import Identity, verify_signature
from protocol.wire import SIGNED_KINDS, Envelope

T = TypeVar("T", bound=WireObject)

DOMAIN = b"swarm-rl/v1/"


def signing_bytes(env: Envelope) -> bytes:
    """The exact bytes a signature covers (see the module docstring)."""
    fields = to_wire(env)[:-1]  # everything but the signature
    return DOMAIN + env.kind.encode() + b"\x00" + pack(fields)


def seal(
    identity: Identity,
    obj: WireObject,
    *,
    run_id: str,
    policy_version: int,
    seq: int,
    timestamp_ms: int,
) -> bytes:
    """Sign `obj` as `identity` and return the envelope's canonical bytes."""
    if type(obj).KIND not in SIGNED_KINDS:
        raise LocalProtocolError(f"{type(obj).__name__} is not a signed kind")
    unsigned = Envelope(
        kind=obj.KIND,
        signer=identity.peer_id,
        run_id=run_id,
        policy_version=policy_version,
        seq=seq,
        timestamp_ms=timestamp_ms,
        payload=encode(obj),
        signature=bytes(64),
    )
    signature = identity.sign(signing_bytes(unsigned))
    sealed = Envelope(**{**_as_dict(unsigned), "signature": signature})
    return encode(sealed)


def _as_dict(env: Envelope) -> dict[str, object]:
    return {name: getattr(env, name) for name, _ in env.wire_fields()}


def open_envelope(data: bytes, cls: type[T]) -> tuple[Envelope, T]:
    """Decode an envelope of kind `cls`, verify its signature, decode its payload.

    Raises `DecodeError` for malformed bytes or the wrong kind, `SignatureError` for a bad
    signature. Replay rules are separate (`ReplayGuard`), since they need state and time.
    """
    if len(data) > cls.MAX_BYTES + 64 * 1024:
        raise DecodeError("Envelope", None, f"{len(data)} bytes, over the {cls.__name__} limit")
    env = decode(Envelope, data)
    if env.kind != cls.KIND:
        raise DecodeError("Envelope", "kind", f"expected {cls.KIND!r}, got {env.kind!r}")
    if not verify_signature(env.signer, signing_bytes(env), env.signature):
        raise SignatureError(f"{cls.__name__} envelope: bad signature")
    return env, decode(cls, env.payload)


@dataclass
class _SignerWindow:
    high: int = -1
    seen: set[int] = field(default_factory=set)


class ReplayGuard:
    """Rejects envelopes of another run, repeated (signer, kind, seq), and skewed clocks.

    Each signer has one sequence space per kind of object: a rollout header's seq is its
    task counter, other objects of the same key number themselves apart, and a signature
    over one kind can never pass for another (`signing_bytes`), so the spaces never meet.
    Sequence numbers may arrive out of order (gossip); each (signer, kind) has a window of
    the last `window` numbers below its highest: anything older, or already seen, is a
    replay. At most `max_signers` (signer, kind) windows are tracked (least recently heard
    forgotten first), so memory is bounded whatever peers send.

    `check(env, now_ms)` checks and remembers; `check(..., remember=False)` only checks, and
    `remember(env)` records it later (admission remembers only what it accepted).
    """

    def __init__(
        self,
        run_id: str,
        *,
        max_skew_ms: int = 120_000,
        window: int = 4096,
        max_signers: int = 100_000,
    ) -> None:
        self.run_id = run_id
        self.max_skew_ms = max_skew_ms
        self.window = window
        self.max_signers = max_signers
        self._signers: OrderedDict[tuple[bytes, str], _SignerWindow] = OrderedDict()

    def held(self) -> list[int]:
        """How many sequence numbers each tracked (signer, kind) window holds (its memory)."""
        return [len(w.seen) for w in self._signers.values()]

    def check(self, env: Envelope, now_ms: int, *, remember: bool = True) -> None:
        """Raise `ReplayError` if `env` must be refused; otherwise remember it (unless
        `remember` is False)."""
        if env.run_id != self.run_id:
            raise ReplayError(f"envelope for run {env.run_id!r}, this is {self.run_id!r}")
        if abs(env.timestamp_ms - now_ms) > self.max_skew_ms:
            raise ReplayError(
                f"timestamp {env.timestamp_ms} is {env.timestamp_ms - now_ms:+d} ms from now,"
                f" outside ±{self.max_skew_ms} ms"
            )
        w = self._signers.get((env.signer, env.kind))
        if w is not None and (env.seq <= w.high - self.window or env.seq in w.seen):
            raise ReplayError(f"sequence number {env.seq} already used or too old")
        if remember:
            self.remember(env)

    def remember(self, env: Envelope) -> None:
        """Record (signer, kind, seq) as used, without checking it."""
        key = (env.signer, env.kind)
        w = self._signers.get(key)
        if w is None:
            w = self._signers[key] = _SignerWindow()
            if len(self._signers) > self.max_signers:
                self._signers.popitem(last=False)
        else:
            self._signers.move_to_end(key)
        w.seen.add(env.seq)
        if env.seq > w.high:
            w.high = env.seq
            if len(w.seen) > 2 * self.window:
                floor = w.high - self.window
                w.seen = {s for s in w.seen if s > floor}
