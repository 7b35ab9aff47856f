"""Every penalty of the network in one table: what each offence costs, who pays, and why.

A cost is a peer-score change (<= 0). Scores (`protocol.peer_score`) decay toward zero
with a half-life of 10 minutes, are capped at +100 (an admitted message earns +0.1), and a
peer that falls below -100 is disconnected and banned, for an hour the first time and
twice as long each time after. Every module that charges a peer reads the cost here
(`penalties.FRAUD.cost`); `render_markdown()` writes the table docs/PROTOCOL.md shows under
"Penalties" (a test keeps the two equal).

Who pays (`Payer`):
    sender        the peer that handed us the bytes, relay or not
    signer        the key that signed the message, when it handed it over itself (a relay
                  that forwarded it pays nothing: the fault depends on our view); for
                  `double_work` whoever relayed it
    producer      the signer of a rollout, for its own work
    accuser       the key that signed a failed verdict or a producer claim
    serving peer  the peer that answered one of our requests
    requester     the peer that sent us a request

An offence marked `repeats` costs twice as much each time the same peer commits it again
within `REPEAT_WINDOW_S` (up to `MAX_DOUBLINGS` doublings): the condition behind it (another
run, a clock far off) stays true for every message the peer sends, each of which costs us a
signature check, so such a peer reaches a ban within a few messages whatever its rate.

Public API: `Payer`, `Offence`, the offences as module constants (`WRONG_RUN`, `FRAUD`, ...),
`TABLE` (all of them, in table order), `BY_NAME`, `repeat_cost(cost, repeats)`,
`render_markdown()`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BY_NAME",
    "MAX_DOUBLINGS",
    "REPEAT_WINDOW_S",
    "TABLE",
    "Offence",
    "Payer",
    "render_markdown",
    "repeat_cost",
]

REPEAT_WINDOW_S = 600.0  # a repeat within this of the last one doubles the cost
MAX_DOUBLINGS = 6


class Payer(enum.StrEnum):
    """Who pays an offence (see the module docstring)."""

    SENDER = "sender"
    SIGNER = "signer"
    PRODUCER = "producer"
    ACCUSER = "accuser"
    SERVING_PEER = "serving peer"
    REQUESTER = "requester"


@dataclass(frozen=True, slots=True)
class Offence:
    """One offence: `name` is the reason the ledger logs, `cost` the score change."""

    name: str
    cost: float
    payer: Payer
    why: str
    repeats: bool = False  # doubles with each repeat (see the module docstring)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cost) and self.cost <= 0):
            raise ValueError(f"{self.name}: a cost is a finite score change <= 0")


def repeat_cost(cost: float, repeats: int) -> float:
    """The cost of a `repeats` offence committed `repeats` times before (within the window)."""
    return cost * 2.0 ** min(max(repeats, 0), MAX_DOUBLINGS)


# -- admission: what a message costs its sender or signer (`protocol.admission`) ----------

BANNED = Offence("banned", 0.0, Payer.SENDER, "already banned: refused unopened and disconnected")
OVERSIZED = Offence(
    "oversized", -10.0, Payer.SENDER, "over its kind's byte limit: no honest peer sends one"
)
UNKNOWN_KIND = Offence("unknown_kind", -10.0, Payer.SENDER, "a kind of message that does not exist")
MALFORMED = Offence(
    "malformed", -10.0, Payer.SENDER, "not a canonical encoding: no honest peer sends one"
)
BAD_SIGNATURE = Offence(
    "bad_signature",
    -50.0,
    Payer.SENDER,
    "a signature (or a verdict's sample ticket) that does not verify: honest relays check",
)
BODY_MISMATCH = Offence(
    "body_mismatch", -50.0, Payer.SENDER, "a body that is not the one its signed header names"
)
WRONG_RUN = Offence(
    "wrong_run",
    -5.0,
    Payer.SENDER,
    "a message of another run: of no use to anyone here",
    repeats=True,
)
STALE = Offence(
    "stale",
    -1.0,
    Payer.SIGNER,
    "older than the staleness bound when signed; free when we pulled it or it aged in transit",
)
FUTURE_VERSION = Offence(
    "future_version",
    0.0,
    Payer.SENDER,
    "a version we have not reached: we may be behind (the sender is asked to back it)",
)
CLOCK_SKEW = Offence(
    "clock_skew",
    -2.0,
    Payer.SIGNER,
    "a timestamp outside the allowed skew of our clock",
    repeats=True,
)
UNAUTHORIZED = Offence(
    "unauthorized",
    -20.0,
    Payer.SENDER,
    "weights, a verdict or a delegation from a key without that right (or on its own work)",
)
OUTDATED = Offence(
    "outdated", 0.0, Payer.SENDER, "an old weight announcement still echoing through gossip"
)
RATE_LIMITED = Offence(
    "rate_limited",
    -0.5,
    Payer.SENDER,
    "a connection past its rate and a second allowance (a signer over its own rate: dropped free)",
)
DUPLICATE = Offence(
    "duplicate", 0.0, Payer.SENDER, "a copy of what we hold: gossip delivers copies"
)
REPLAY = Offence("replay", -5.0, Payer.SIGNER, "a (signer, kind, sequence number) it used before")
MISBEHAVED = Offence(
    "misbehaved",
    -20.0,
    Payer.SENDER,
    "a role found fault and named no cost of its own (the roles' offences are below)",
)
DOUBLE_WORK = Offence(
    "double_work",
    -20.0,
    Payer.SIGNER,
    "two signed rollouts for one unit of work (a counter, whatever its version, or a body): whoever relays",
)
FLOODING = Offence(
    "flooding",
    -1.0,
    Payer.SENDER,
    "blameless refusals (copies, keys nobody named) past its allowance",
)
NEW_IDENTITIES = Offence(
    "new_identities", 0.0, Payer.SENDER, "too many signers new to us at once: dropped, free"
)
AUTHORED_NEW_IDENTITIES = Offence(
    "new_identities_authored",
    -0.5,
    Payer.SENDER,
    "the gossip publisher of another new key's message: an author, not a relay",
)
BODY_MISSING = Offence(
    "body_missing", -1.0, Payer.SIGNER, "signed a header whose body no source served"
)
BODY_MISSING_RELAYED = Offence(
    "body_missing_relayed", -0.1, Payer.SENDER, "forwarded a header whose body no source served"
)
NOT_BOUND = Offence(
    "not_bound",
    -50.0,
    Payer.SIGNER,
    "a rollout whose task seed is not derived from its signer's key: another producer's work re-signed",
)
UNBACKED_VERSION = Offence(
    "unbacked_version",
    -5.0,
    Payer.SENDER,
    "handed us a version and holds no trainer-signed manifest of it",
)
UNPUBLISHED_VERSION = Offence(
    "unpublished_version",
    -20.0,
    Payer.SIGNER,
    "a rollout claiming a version the trainer has not published (the trainer refuses it)",
)

# -- roles and exchanges: what the node found by other means -------------------------------

BAD_REQUEST = Offence(
    "bad_request", -10.0, Payer.REQUESTER, "a malformed catch-up or rollout request"
)
WRONG_RECORD = Offence(
    "wrong_record", -10.0, Payer.SERVING_PEER, "served another rollout than the one asked for"
)
PRODUCER_LACKS_BODY = Offence(
    "producer_lacks_body",
    -2.0,
    Payer.PRODUCER,
    "says it lacks a body it announced (producers store before they gossip)",
)
BAD_SHARD = Offence(
    "bad_shard", -50.0, Payer.SERVING_PEER, "a weight shard that fails its signed digest"
)
BAD_MODEL_FILES = Offence(
    "bad_model_files",
    -50.0,
    Payer.SERVING_PEER,
    "model files or base weights that fail the run manifest's pin",
)
FALSE_CLAIM = Offence(
    "false_claim",
    -20.0,
    Payer.PRODUCER,
    "a header whose claimed reward differs from the trainer's re-score of its body",
)
OUT_OF_ORDER = Offence(
    "out_of_order",
    -5.0,
    Payer.PRODUCER,
    "a rollout going back to an older version than the producer's previous counters, other "
    "than the one version going back is free for within 10 minutes (an honest restart)",
)
FAILED_AUDIT = Offence("failed_audit", -20.0, Payer.PRODUCER, "a rollout whose audit failed here")
FRAUD = Offence(
    "fraud",
    -250.0,
    Payer.PRODUCER,
    "another validator's failed audit, re-run here and reproduced: a ban from any score",
)
FALSE_ACCUSATION = Offence(
    "false_accusation",
    -20.0,
    Payer.ACCUSER,
    "a failed verdict or producer claim our own audit does not reproduce",
)
PRODUCER_WINDOW = Offence(
    "producer_window",
    -50.0,
    Payer.PRODUCER,
    "a window of 16 records whose median audit statistic is over the limit",
)
WITHHELD = Offence(
    "withheld",
    -20.0,
    Payer.PRODUCER,
    "counters never published past its allowance (each time it passes it)",
)

# -- GossipSub control traffic, counted by the host (node/host/gossip_guard.py) per peer and window

GRAFT_PRUNE_FLOOD = Offence(
    "graft_prune_flood",
    -2.0,
    Payer.SENDER,
    "more GRAFT and PRUNE in a window than mesh upkeep needs",
    repeats=True,
)
IHAVE_FLOOD = Offence(
    "ihave_flood", -1.0, Payer.SENDER, "more IHAVE ids in a window than gossip needs", repeats=True
)
IWANT_FLOOD = Offence(
    "iwant_flood", -2.0, Payer.SENDER, "more IWANT ids in a window than gossip needs", repeats=True
)
TOO_MANY_TOPICS = Offence(
    "too_many_topics",
    -1.0,
    Payer.SENDER,
    "subscribed to more topics at once than a run has",
    repeats=True,
)
OVERSIZE_RPC = Offence(
    "oversize_rpc",
    -5.0,
    Payer.SENDER,
    "a gossip RPC over the library's 1 MiB limit (dropped there)",
    repeats=True,
)

TABLE: tuple[Offence, ...] = (
    BANNED,
    OVERSIZED,
    UNKNOWN_KIND,
    MALFORMED,
    BAD_SIGNATURE,
    BODY_MISMATCH,
    WRONG_RUN,
    STALE,
    FUTURE_VERSION,
    CLOCK_SKEW,
    UNAUTHORIZED,
    OUTDATED,
    RATE_LIMITED,
    DUPLICATE,
    REPLAY,
    MISBEHAVED,
    DOUBLE_WORK,
    FLOODING,
    NEW_IDENTITIES,
    AUTHORED_NEW_IDENTITIES,
    BODY_MISSING,
    BODY_MISSING_RELAYED,
    NOT_BOUND,
    UNBACKED_VERSION,
    UNPUBLISHED_VERSION,
    BAD_REQUEST,
    WRONG_RECORD,
    PRODUCER_LACKS_BODY,
    BAD_SHARD,
    BAD_MODEL_FILES,
    FALSE_CLAIM,
    OUT_OF_ORDER,
    FAILED_AUDIT,
    FRAUD,
    FALSE_ACCUSATION,
    PRODUCER_WINDOW,
    WITHHELD,
    GRAFT_PRUNE_FLOOD,
    IHAVE_FLOOD,
    IWANT_FLOOD,
    TOO_MANY_TOPICS,
    OVERSIZE_RPC,
)

BY_NAME: Mapping[str, Offence] = {o.name: o for o in TABLE}
assert len(BY_NAME) == len(TABLE), "offence names must be unique"


def _cost_text(o: Offence) -> str:
    text = "0" if o.cost == 0 else f"−{-o.cost:g}"
    return f"{text}, ×2 per repeat" if o.repeats else text


def render_markdown() -> str:
    """The table as Markdown (what docs/PROTOCOL.md prints under "Penalties")."""
    lines = ["| offence | cost | who pays | why |", "|---|---|---|---|"]
    lines += [f"| `{o.name}` | {_cost_text(o)} | {o.payer} | {o.why} |" for o in TABLE]
    return "\n".join(lines) + "\n"
