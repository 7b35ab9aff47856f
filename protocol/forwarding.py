"""What admission's actions for one gossip message mean at the GossipSub boundary.

GossipSub's topic validator answers accept (deliver and forward), ignore (drop, the sender
is not at fault: a duplicate, a rate or queue refusal) or reject (drop, the sender sent
something judged bad). A `HeaderBatch` carries several headers, each admitted on its own;
the batch is one gossip message and gets one answer (`batch_verdict`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from protocol.admission import Action, Forward, Reject

__all__ = ["GossipVerdict", "batch_verdict", "verdict_of"]


class GossipVerdict(StrEnum):
    ACCEPT = "accept"
    IGNORE = "ignore"
    REJECT = "reject"


def verdict_of(actions: Iterable[Action]) -> GossipVerdict:
    """Accept when admission forwards the message; reject when it charged the sender for
    it (a penalty); otherwise ignore (not judged: duplicate, rate, quota, stale)."""
    verdict = GossipVerdict.IGNORE
    for action in actions:
        if isinstance(action, Forward):
            verdict = GossipVerdict.ACCEPT
        elif isinstance(action, Reject) and action.penalty < 0:
            return GossipVerdict.REJECT
    return verdict


def batch_verdict(verdicts: Iterable[GossipVerdict]) -> GossipVerdict:
    """A batch is rejected if any header in it was judged bad (its sender pays once per
    header through admission, and mesh peers must not receive it), accepted if at least
    one header was new and none bad (duplicates in a batch are common after catch-up and
    relays: they must not stop the new headers travelling), otherwise ignored."""
    out = GossipVerdict.IGNORE
    for v in verdicts:
        if v is GossipVerdict.REJECT:
            return v
        if v is GossipVerdict.ACCEPT:
            out = v
    return out
