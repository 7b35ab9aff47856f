"""The words of admission: its stages, the kinds of message, the reasons of a refusal.

Also the tables that say what each reason costs (`PENALTIES`, from `protocol.penalties`),
which costs double on repeat (`REPEATS_DOUBLE`), which reasons count against a relay
(`RELAY_BLAMED`), and which reasons each stage can give (`STAGE_REASONS`). Data only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from protocol import penalties as offences

__all__ = [
    "AUTHORED_NEW_IDENTITY_PENALTY",
    "PENALTIES",
    "PIPELINE",
    "RELAY_BLAMED",
    "REPEATS_DOUBLE",
    "STAGE_REASONS",
    "Kind",
    "Reason",
    "Stage",
]


class Stage(enum.StrEnum):
    """A step of the admission pipeline; the declaration order is the order they run in."""

    GATE = "gate"
    SIZE = "size"
    RATE = "rate"
    DECODE = "decode"
    SIGNATURE = "signature"
    CONTEXT = "context"
    DEDUP = "dedup"
    REPLAY = "replay"
    UNIQUE = "unique"
    QUOTA = "quota"
    STORE = "store"
    FORWARD = "forward"
    DELIVER = "deliver"


PIPELINE: tuple[Stage, ...] = tuple(Stage)
"""Every message goes through these stages in this order (a kind may skip some)."""


class Kind(enum.StrEnum):
    """A kind of message admission knows (its rules are in `KIND_RULES`)."""

    ROLLOUT_HEADER = "rollout_header"
    ROLLOUT_RECORD = "rollout_record"
    VERDICT = "verdict"
    WEIGHT_ANNOUNCE = "weight_announce"
    WEIGHT_MANIFEST = "weight_manifest"
    FRAUD_EVIDENCE = "fraud_evidence"
    DELEGATION = "delegation"
    PRODUCER_CLAIM = "producer_claim"
    EQUIVOCATION = "equivocation"


class Reason(enum.StrEnum):
    """Why a message was refused or a peer charged (values are the ledger's names)."""

    BANNED = "banned"
    OVERSIZED = "oversized"
    UNKNOWN_KIND = "unknown_kind"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    BODY_MISMATCH = "body_mismatch"
    WRONG_RUN = "wrong_run"
    STALE = "stale"
    FUTURE_VERSION = "future_version"
    CLOCK_SKEW = "clock_skew"
    UNAUTHORIZED = "unauthorized"
    OUTDATED = "outdated"
    RATE_LIMITED = "rate_limited"
    DUPLICATE = "duplicate"
    REPLAY = "replay"
    MISBEHAVED = "misbehaved"
    DOUBLE_WORK = "double_work"
    FLOODING = "flooding"
    NEW_IDENTITIES = "new_identities"
    BODY_MISSING = "body_missing"
    UNBACKED_VERSION = "unbacked_version"
    NOT_BOUND = "not_bound"
    UNPUBLISHED_VERSION = "unpublished_version"


# Default score change per reason (<= 0), from the network's one table of penalties
# (`protocol.penalties`, whose names are the reasons' values). MALFORMED, BAD_SIGNATURE and
# BODY_MISMATCH use the penalty carried by the protocol error instead when there is one.
PENALTIES: Mapping[Reason, float] = {r: offences.BY_NAME[r].cost for r in Reason}
# Reasons whose cost doubles with each repeat by the same peer (`offences.repeat_cost`).
REPEATS_DOUBLE: frozenset[Reason] = frozenset(r for r in Reason if offences.BY_NAME[r].repeats)
# A NEW_IDENTITIES refusal of a message the sender published itself under another signer
# (see `Quota.check_signer`): free for relays, this for an author of other keys' messages.
AUTHORED_NEW_IDENTITY_PENALTY = offences.AUTHORED_NEW_IDENTITIES.cost

# Reasons that count against a relay too (no honest peer forwards such bytes). The others
# depend on the receiver's view and count only against the message's signer.
RELAY_BLAMED: frozenset[Reason] = frozenset(
    {
        Reason.OVERSIZED,
        Reason.UNKNOWN_KIND,
        Reason.MALFORMED,
        Reason.BAD_SIGNATURE,
        Reason.BODY_MISMATCH,
        Reason.NOT_BOUND,
        Reason.WRONG_RUN,
        Reason.UNAUTHORIZED,
        Reason.RATE_LIMITED,  # the sender's own bucket; a signer's bucket is checked apart
        Reason.MISBEHAVED,
        Reason.BANNED,
        Reason.FLOODING,
    }
)

# The reasons each stage can refuse a message for, in the order its checks run (a test
# reads the package's `Refused(...)` calls and holds this table to them). FLOODING is not
# a stage's: it replaces a free refusal of a sender past its allowance of waste.
STAGE_REASONS: Mapping[Stage, tuple[Reason, ...]] = {
    Stage.GATE: (Reason.BANNED, Reason.UNKNOWN_KIND),
    Stage.SIZE: (Reason.OVERSIZED,),
    Stage.RATE: (Reason.RATE_LIMITED,),
    Stage.DECODE: (Reason.MALFORMED,),
    Stage.SIGNATURE: (Reason.BAD_SIGNATURE, Reason.BODY_MISMATCH),
    Stage.CONTEXT: (
        Reason.WRONG_RUN,
        Reason.NOT_BOUND,
        Reason.STALE,
        Reason.UNPUBLISHED_VERSION,
        Reason.FUTURE_VERSION,
        Reason.UNAUTHORIZED,
        Reason.OUTDATED,
        Reason.CLOCK_SKEW,
        Reason.UNBACKED_VERSION,
    ),
    Stage.DEDUP: (Reason.DUPLICATE,),
    Stage.REPLAY: (Reason.REPLAY,),
    Stage.UNIQUE: (Reason.DUPLICATE, Reason.DOUBLE_WORK),
    Stage.QUOTA: (Reason.NEW_IDENTITIES, Reason.RATE_LIMITED),
    Stage.STORE: (),
    Stage.FORWARD: (),
    Stage.DELIVER: (),
}
