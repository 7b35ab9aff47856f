"""When a rollout counts as verified: the trainer's rule, as one pure function.

Inputs are the rollout's producer (its header's signer), the verdicts heard about it
(each reduced to a `Vote`: who signed it, which producer it names, pass or fail), the
run's `protocol.authority.Authority` and a `VerifiedRule`. Rules, in order:

1. A vote counts only if its signer may judge (`Authority.may_judge`), is not the
   producer itself (no self-vouching, even for a validator that also produces), names
   this producer (`Verdict.producer` must match the rollout's signer), and is not one the
   caller ignores (a validator the trainer flagged, `protocol.judges`).
2. One vote per signer: a signer's failures outweigh its passes.
3. No single validator decides alone, either way: with `n` keys that may judge, a
   decision needs `need = min(confirm, n)` agreeing signers (one in a run with one
   validator key: there is no second opinion to wait for).
   REJECTED   at least max(`fail_quorum`, need) signers failed it, and (need > 1) more
              than passed it;
   VERIFIED   at least max(`quorum`, need) signers passed it, more than failed it (a
              failing verdict outvoted by re-audits does not withdraw anything);
   CONTESTED  a failing vote, not (yet) confirmed nor outvoted: it does not train, and
              one pass does not outweigh it; credit waits for the re-audit;
   PENDING    otherwise (no vote, or passes short of `need`).

The quorum comes from the run manifest (`RunManifest.verdict_quorum`).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from protocol.authority import Authority

__all__ = ["Status", "VerifiedRule", "Vote", "judge"]


class Status(enum.StrEnum):
    """Whether a rollout is verified, rejected, or still pending."""

    PENDING = "pending"
    VERIFIED = "verified"
    REJECTED = "rejected"
    CONTESTED = "contested"


@dataclass(frozen=True, slots=True)
class Vote:
    """One validator's verdict about a producer's rollout."""

    signer: bytes
    producer: bytes
    passed: bool


@dataclass(frozen=True, slots=True)
class VerifiedRule:
    """How many passing (`quorum`) or failing (`fail_quorum`) votes decide, and how many
    distinct judges must agree when the run has that many (`confirm`)."""

    quorum: int = 1
    fail_quorum: int = 1
    confirm: int = 2

    def __post_init__(self) -> None:
        if self.quorum < 1 or self.fail_quorum < 1 or self.confirm < 1:
            raise ValueError("VerifiedRule quorums must be >= 1")


def judge(
    producer: bytes,
    votes: Iterable[Vote],
    authority: Authority,
    rule: VerifiedRule,
    ignore: Collection[bytes] = (),
) -> Status:
    """The status of one rollout of `producer` given the votes about it; the votes of the
    keys in `ignore` do not count (nor do they count among the run's judges)."""
    passed: set[bytes] = set()
    failed: set[bytes] = set()
    for v in votes:
        if (
            v.producer != producer
            or v.signer == producer
            or v.signer in ignore
            or not authority.may_judge(v.signer)
        ):
            continue
        (passed if v.passed else failed).add(v.signer)
    passed -= failed
    judges = authority.judges() - sum(1 for k in ignore if authority.may_judge(k))
    need = min(rule.confirm, max(1, judges))
    p, f = len(passed), len(failed)
    if f >= max(rule.fail_quorum, need) and (need == 1 or f > p):
        return Status.REJECTED
    if p >= max(rule.quorum, need) and p > f:
        return Status.VERIFIED
    return Status.CONTESTED if f else Status.PENDING
