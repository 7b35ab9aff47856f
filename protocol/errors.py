"""Error classes of the protocol, split by whose fault it was (the h11 habit).

- `LocalProtocolError`: our own code built something illegal (a bug or bad local input).
- `RemoteProtocolError`: bytes from a peer are bad. Each carries `penalty`, the peer-score
  change the receiver applies (from `protocol.penalties`); only the receive boundary
  raises these.

Decoding, signature and replay failures are all `RemoteProtocolError`s, so a receiver can
catch one class and know it has handled every way a peer's bytes can be wrong.
"""

from __future__ import annotations

from protocol import penalties


class LocalProtocolError(ValueError):
    """We tried to build or send something the protocol does not allow."""


class RemoteProtocolError(Exception):
    """A peer sent bytes that break the protocol. `penalty` is the score change to apply."""

    default_penalty: float = penalties.MALFORMED.cost

    def __init__(self, message: str, *, penalty: float | None = None) -> None:
        super().__init__(message)
        self.penalty = self.default_penalty if penalty is None else penalty


class DecodeError(RemoteProtocolError):
    """Bytes that are not a valid canonical encoding of the expected object.

    The message names the object and, where there is one, the field:
    `RolloutBody.top_k: 4294967296 out of range [0, 4294967295]`.
    """

    def __init__(self, obj: str, field: str | None, problem: str, *, penalty: float | None = None):
        where = obj if field is None else f"{obj}.{field}"
        super().__init__(f"{where}: {problem}", penalty=penalty)
        self.obj = obj
        self.field = field
        self.problem = problem


class OversizeError(DecodeError):
    """Input longer than the byte limit of its object kind (checked before any decoding)."""


class SignatureError(RemoteProtocolError):
    """An envelope whose signature does not verify under its signer's key."""

    default_penalty = penalties.BAD_SIGNATURE.cost


class ReplayError(RemoteProtocolError):
    """A validly signed message that is a replay: wrong run, repeated sequence, clock skew."""

    default_penalty = penalties.REPLAY.cost


class IntegrityError(RemoteProtocolError):
    """Content that does not match the digest a signed object promised for it."""

    default_penalty = penalties.BODY_MISMATCH.cost
