"""What admission's actions for one gossip message mean at the GossipSub boundary.

GossipSub's topic validator answers accept (deliver and forward), ignore (drop, the sender
is not at fault: a duplicate, a rate or queue refusal) or reject (drop, the sender sent
something judged bad). A `HeaderBatch` carries several headers, each admitted on its own;
the batch is one gossip message and gets one answer (`batch_verdict`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from protocol.admission import Action
from protocol.admission import verdict_of as admission_verdict

__all__ = ["GossipVerdict", "batch_verdict", "verdict_of"]


class GossipVerdict(StrEnum):
    """A GossipSub validator's answer: accept (deliver and forward), ignore (drop, no blame),
    reject (drop and blame the forwarder)."""

    ACCEPT = "accept"
    IGNORE = "ignore"
    REJECT = "reject"


def verdict_of(actions: Iterable[Action]) -> GossipVerdict:
    """`protocol.admission.verdict_of` as a `GossipVerdict`."""
    return GossipVerdict(admission_verdict(list(actions)))


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
