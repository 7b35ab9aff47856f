"""When a rollout counts as verified: the trainer's rule, as one pure function.

Inputs are the rollout's producer (its header's signer), the verdicts heard about it
(each reduced to a `Vote`: who signed it, which producer it names, pass or fail), the
run's `protocol.authority.Authority` and a `VerifiedRule`. Rules, in order:

1. A vote counts only if its signer may judge (`Authority.may_judge`), is not the
   producer itself (no self-vouching, even for a validator that also produces), and
   names this producer (`Verdict.producer` must match the rollout's signer).
2. One vote per signer: a signer's failures outweigh its passes.
3. REJECTED when at least `fail_quorum` distinct authorized signers failed it;
   VERIFIED when at least `quorum` distinct authorized signers passed it and it is not
   rejected; PENDING otherwise.

The quorum comes from the run manifest (`RunManifest.verdict_quorum`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.authority import Authority

__all__ = ["Status", "VerifiedRule", "Vote", "judge"]


class Status(enum.StrEnum):
    """Whether a rollout is verified, rejected, or still pending."""

    PENDING = "pending"
    VERIFIED = "verified"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Vote:
    """One validator's verdict about a producer's rollout."""

    signer: bytes
    producer: bytes
    passed: bool


@dataclass(frozen=True, slots=True)
class VerifiedRule:
    """How many passing (`quorum`) or failing (`fail_quorum`) votes decide."""

    quorum: int = 1
    fail_quorum: int = 1

    def __post_init__(self) -> None:
        if self.quorum < 1 or self.fail_quorum < 1:
            raise ValueError("VerifiedRule quorums must be >= 1")


def judge(
    producer: bytes, votes: Iterable[Vote], authority: Authority, rule: VerifiedRule
) -> Status:
    """The status of one rollout of `producer` given the votes about it."""
    passed: set[bytes] = set()
    failed: set[bytes] = set()
    for v in votes:
        if v.producer != producer or v.signer == producer or not authority.may_judge(v.signer):
            continue
        (passed if v.passed else failed).add(v.signer)
    passed -= failed
    if len(failed) >= rule.fail_quorum:
        return Status.REJECTED
    if len(passed) >= rule.quorum:
        return Status.VERIFIED
    return Status.PENDING
