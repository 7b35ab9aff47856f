"""The admission pipeline: what a peer does with every message another peer sends it.

A sans-IO state machine in the h11 manner. Events come in with the time as an argument
(`handle(event) -> list[Action]`); actions go out; the caller (the libp2p node, or the
simulator) carries them out. What this module owns: the order of the checks, which checks
apply to which kind of message, the reason and score change of every rejection, per-peer
rate limits, duplicate suppression, and when a peer is disconnected and banned. What it
never touches: sockets, clocks, threads, storage, randomness, libp2p types. Peers are opaque
ids (`bytes` or `str`); message bytes are decoded and verified by `protocol.envelope` /
`protocol.rollout` (or by openers the caller supplies, see `KindRule.opener`).

The pipeline (legal steps as data: `PIPELINE`, and per kind `KIND_RULES`)
-----------------------------------------------------------------------
    GATE       the sender is banned                           -> Reject(BANNED) + Disconnect
               no such kind                                   -> UNKNOWN_KIND
    SIZE       len(data) > the kind's byte limit               -> OVERSIZED
    DECODE     not a canonical encoding / wrong kind          -> MALFORMED (error's penalty)
    SIGNATURE  signature does not verify; body != digest      -> BAD_SIGNATURE / BODY_MISMATCH
    CONTEXT    other run; version older than t - S            -> WRONG_RUN / STALE
               a rollout newer than t, at the trainer         -> UNPUBLISHED_VERSION
               (`AdmissionConfig.publishes_versions`: the trainer knows which
               versions exist; its signer pays, a relay does not)
               version newer than t + max_future_versions     -> FUTURE_VERSION
               (free, but a gossiped one comes with AskNewest: the sender must back
               it with a trainer-signed manifest, or pays UNBACKED_VERSION;
               `protocol.version_claims`)
               timestamp further than max_skew from now       -> CLOCK_SKEW
               weights not signed by a trainer key, or old    -> UNAUTHORIZED / OUTDATED
               (OUTDATED only for gossiped announcements: a pulled manifest of an older
               version is what a joiner or a lagging peer asks for)
    RATE       token bucket per sender (dropped free; the sender  -> RATE_LIMITED
               pays only past `sender_overrun_rate` more), and per signer (QUOTA:
               dropped free; scaled by the signer's verified standing, passing verdicts
               of the run's validators, `signer_rate_factor`)
    DEDUP      content id admitted before (bounded LRU + TTL) -> DUPLICATE
    REPLAY     (signer, kind, seq) used before (`ReplayGuard`) -> REPLAY
    STORE      -> Store(item)       (kinds with `store`)
    FORWARD    -> Forward(item)     (gossiped kinds: let the router propagate it)
    DELIVER    -> Deliver(item)     (hand it to the local role)

`Admission` runs a kind's stages (`KIND_RULES[kind].stages()`, a sub-sequence of `PIPELINE`)
in order through a stage -> method table; the first refusal wins. DECODE and SIGNATURE are
one call to the kind's opener (the protocol functions decode and verify together); the
error's class says which of the two failed. ROLLOUT_RECORD (pulled on request, possibly old)
skips the sender-rate, skew, signer-rate and REPLAY rules (we asked for it) and is not
forwarded.

What is remembered: the dedup memory and the replay guard record a message only once it
is admitted, or refused for a fault of its signer that the content itself proves
(`double_work`). A refusal that does not judge the content (over a rate, too many new
signers, the body already held under another signer, a store that failed) records
nothing, so the producer's own copy arriving later by another path is admitted, not
charged as a replay. Each signer has one sequence space per kind (a rollout header's seq
is its task counter; other objects number themselves apart) and never reuses a number
across restarts (`node.store.store.Store.reserve`).

Staleness: a rollout made at policy version v is usable at version t only if t - v <= S,
S = `RunRules.max_staleness` (the run manifest's `max_staleness`). The current version t
comes from `VersionChanged` events. Who pays for a stale rollout: nobody when we pulled it
(we asked), nor when it went stale while it was made or on its way (signed less than
`stale_grace_s` after the version that made it stale became ours: the trainer moved on, the
producer could not know); its signer otherwise, so an honest worker of a fast-moving run is
not charged for the bodies and catch-up answers a trainer pulls from it late.

Whose fault: penalties go to the *sender* (the peer that handed us the bytes; given as
libp2p peer id bytes or their base58 text, so that a sender can be matched to an envelope
signer; any other opaque id is simply never the signer). Faults no
honest relay would pass on (malformed, bad signature, oversized) always count. Faults that
depend on the receiver's view (stale, skewed clock, replay, rate of a signer) count only
when the sender is also the signer; a relay that forwarded them is not blamed (penalty 0).
Rejections with penalty 0 are "ignore" in gossipsub terms (`Reject.verdict == "ignore"`):
drop, do not forward, do not penalise. The costs come from the network's one table
(`protocol.penalties`); those of persistent conditions (`wrong_run`, `clock_skew`: every
further message of such a peer is as useless) double with each repeat by the same peer
within `repeat_window_s`, so such a peer is banned within a few messages. Every admitted message earns the sender
`admit_reward`; a sender whose score falls below the ban threshold gets
`Disconnect` + `Ban` (`protocol.peer_score`).

Public API
----------
`RunRules(run_id, max_staleness, trainer_keys=())`, `RunRules.from_manifest(manifest)`
`AdmissionConfig(...)`  limits (defaults in the class); validated when built
`Admission(run, config=AdmissionConfig(), *, version=0, scores=None, rules=KIND_RULES)`
    `.handle(event) -> list[Action]`     the only way in
    `.scores` (`PeerScores`), `.version`, `.rules`
    `.signer_rate_factor(signer)`  how many times `signer_rate` peers admit from it
Events (frozen dataclasses, `now` in seconds, wall-clock in the node so that envelope
timestamps and ban ends mean the same across peers and restarts):
    `MessageReceived(peer, kind, data, now)`   bytes from `peer` (gossip or a stream)
    `VersionChanged(version, now)`             our policy version is now `version`
    `Tick(now)`                                 lifts ended bans (-> Unban), expires caches
    `PeerConnected(peer, now)`                  -> Disconnect if the peer is banned
    `Misbehaved(peer, penalty, reason, now, offence=None)`  a role found fault (e.g. fraud
                                                proven by an audit); penalty <= 0 is the score
                                                change, offence its name in `protocol.penalties`
    `StoreFailed(item, now)`                    the node could not store an admitted item:
                                                forget it so a copy can be admitted later
    `NewestShown(peer, envelope, now, answered=True)`  the answer to an `AskNewest`
    `Known(kind, ids, now, signers=())`         items already stored (the node loads them at
                                                start): copies are duplicates, as before a
                                                restart, and their signers are not new
Actions (execute in the order returned; if a Store raises, skip the rest of that list
and send `StoreFailed`):
    `Reject(peer, reason, penalty, stage, detail, kind)`  penalty is the score change (<= 0)
    `Penalized(peer, reason, penalty, stage, detail, kind)`  any other charge (a role's
                                    finding, a body nobody served, the signer of double work
                                    someone relayed): log it and write it to the ledger
    `Store(item)`, `Forward(item)`, `Deliver(item)`       item is an `Admitted`
    `Disconnect(peer, reason)`, `Ban(peer, until, record)` (persist `record`), `Unban(peer)`
    `AskNewest(peer, at_least)`  ask the peer for the newest signed manifest it holds
`Admitted`: kind, content_id (the rollout id for rollouts), sender, envelope, obj (decoded
object: RolloutHeader, OpenedRollout, Verdict, WeightManifest, FraudEvidence,
ProducerClaim), data (bytes as
received), header / body (rollout header envelope bytes and body bytes, when present),
received_at.
`Kind`: ROLLOUT_HEADER (gossip), ROLLOUT_RECORD (pulled header + body), VERDICT (gossip),
WEIGHT_ANNOUNCE (gossip, signed WeightManifest), WEIGHT_MANIFEST (a signed WeightManifest
pulled over the shard stream, any version), FRAUD_EVIDENCE (gossip), PRODUCER_CLAIM (gossip,
a validator's signed claim over a producer's window of records, `verify.producer`).
`verdict_of(actions) -> "accept" | "ignore" | "reject"`  what a message's actions mean to
the gossip router (a libp2p validator: accept; ignore = drop without blame; reject = drop
and count against the forwarder).
`Reason`: a `StrEnum` (values are short snake_case names for the ledger); `PENALTIES` holds
the default score change of each (`protocol.penalties`), `RELAY_BLAMED` which ones count
against a relay.
Helpers: `TokenBucket`, `RateLimiter`, `DedupCache` (all pure, time passed in).

For the simulator: the same `Admission` runs on virtual time; to skip real signatures for
thousands of peers pass `rules={k: dataclasses.replace(r, opener=cheap) ...}` where `cheap`
returns an `Opened` for its own stand-in bytes and raises `RemoteProtocolError` subclasses.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol import penalties as offences
from protocol.assignment import task_seed
from protocol.audit_sample import check_ticket
from protocol.authority import Authority
from protocol.codec import decode
from protocol.content_id import content_id
from protocol.envelope import ReplayGuard, open_envelope
from protocol.errors import (
    DecodeError,
    IntegrityError,
    LocalProtocolError,
    ReplayError,
    SignatureError,
)
from protocol.errors import RemoteProtocolError as _RemoteError
from protocol.identity import peer_id_to_b58
from protocol.peer_score import PeerId, PeerRecord, PeerScores
from protocol.rollout import OpenedRollout, check_body, open_header
from protocol.version_claims import AskNewest, VersionClaims
from protocol.wire import (
    Delegation,
    Envelope,
    FraudEvidence,
    ProducerClaim,
    RolloutHeader,
    RolloutRecord,
    RunManifest,
    Verdict,
    WeightManifest,
)

__all__ = [
    "KIND_RULES",
    "PENALTIES",
    "PIPELINE",
    "RELAY_BLAMED",
    "REPEATS_DOUBLE",
    "Action",
    "Admission",
    "AdmissionConfig",
    "Admitted",
    "Ban",
    "BodyMissing",
    "DedupCache",
    "Deliver",
    "Disconnect",
    "Event",
    "Forward",
    "Kind",
    "KindRule",
    "Known",
    "MessageReceived",
    "Misbehaved",
    "Opened",
    "PeerConnected",
    "Penalized",
    "RateLimiter",
    "Reason",
    "Reject",
    "RunRules",
    "Stage",
    "Store",
    "StoreFailed",
    "Tick",
    "TokenBucket",
    "Unban",
    "VersionChanged",
    "verdict_of",
]


# --------------------------------------------------------------------------------------
# Vocabulary: stages, kinds, reasons


class Stage(enum.StrEnum):
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
    ROLLOUT_HEADER = "rollout_header"
    ROLLOUT_RECORD = "rollout_record"
    VERDICT = "verdict"
    WEIGHT_ANNOUNCE = "weight_announce"
    WEIGHT_MANIFEST = "weight_manifest"
    FRAUD_EVIDENCE = "fraud_evidence"
    DELEGATION = "delegation"
    PRODUCER_CLAIM = "producer_claim"


class Reason(enum.StrEnum):
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
# (see `_stage_quota`): free for relays, this for an author of other keys' messages.
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


# --------------------------------------------------------------------------------------
# Run rules and settings


@dataclass(frozen=True, slots=True)
class RunRules:
    """What the run manifest says that admission needs."""

    run_id: str
    max_staleness: int
    trainer_keys: frozenset[bytes] = frozenset()
    validator_keys: frozenset[bytes] = frozenset()
    verdict_quorum: int = 1
    # The run's seed: a rollout's task seed must derive from its signer (protocol.assignment);
    # None: not checked (the simulator's synthetic messages carry no seeds).
    run_seed: int | None = None

    def __post_init__(self) -> None:
        if not self.run_id:
            raise LocalProtocolError("RunRules.run_id must not be empty")
        if self.max_staleness < 0:
            raise LocalProtocolError("RunRules.max_staleness must be >= 0")
        if self.verdict_quorum < 1:
            raise LocalProtocolError("RunRules.verdict_quorum must be >= 1")
        object.__setattr__(self, "trainer_keys", frozenset(self.trainer_keys))
        object.__setattr__(self, "validator_keys", frozenset(self.validator_keys))

    @classmethod
    def from_manifest(cls, manifest: RunManifest) -> RunRules:
        return cls(
            manifest.run_id,
            manifest.max_staleness,
            frozenset(manifest.trainer_keys),
            frozenset(manifest.validator_keys),
            manifest.verdict_quorum,
            manifest.seed,
        )


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Limits of admission. Rates are messages per second, bursts are bucket sizes."""

    sender_rate: float = 50.0  # everything one connection sends us (relays carry many signers)
    sender_burst: float = 200.0
    # Over its rate a sender's messages are dropped unopened and free (a busy honest relay
    # carries many producers); only past this many more per second does it pay.
    sender_overrun_rate: float = 100.0
    signer_rate: float = 20.0  # what one producer may publish, whoever relays it
    signer_burst: float = 100.0
    # A producer's verified standing raises its signer rate and burst: each
    # `standing_passes_per_step` passing verdicts of authorized validators about its work
    # (admitted here) add one more `signer_rate`, up to `signer_rate_max_factor` times it;
    # a failing verdict puts it back to 1x.
    signer_rate_max_factor: float = 4.0
    standing_passes_per_step: float = 50.0
    max_rate_keys: int = 100_000  # buckets kept; an evicted one restarts full
    dedup_entries: int = 65_536
    dedup_ttl_s: float = 900.0
    max_skew_s: float = 120.0
    replay_window: int = 4096
    max_signers: int = 100_000
    max_future_versions: int = 2
    # We publish the versions (the trainer): a rollout claiming one above ours claims a
    # version nobody holds, so it is refused whatever the margin, at its signer's cost.
    publishes_versions: bool = False
    # A stale rollout costs its producer only if signed this long after the version that
    # made it stale became ours (time for that version to reach the producer).
    stale_grace_s: float = 120.0
    admit_reward: float = 0.1
    waste_rate: float = 2.0  # blameless refusals (copies, stale replays) a sender gets free
    waste_burst: float = 50.0
    work_entries: int = 262_144  # units of work remembered (producer, counter)
    new_signer_rate: float = 0.5  # unknown signers one sender may introduce per second
    new_signer_burst: float = 16.0
    new_signer_rate_all: float = 2.0  # ... and all senders together
    new_signer_burst_all: float = 64.0
    # A young view (ours started empty: a cold start, or a node joining for the first
    # time) may take this many new signers besides the rates above, within `young_view_s`
    # of the first one it met, at most `young_view_per_sender` from one sender. 0 turns it
    # off; a view restored by `Known` is never young.
    young_view_signers: int = 4096
    young_view_per_sender: int = 512
    young_view_s: float = 600.0
    body_missing_sender: float = offences.BODY_MISSING_RELAYED.cost  # its forwarder
    repeat_window_s: float = offences.REPEAT_WINDOW_S  # a repeat within it costs double
    penalties: Mapping[Reason, float] = field(default_factory=lambda: dict(PENALTIES))

    def __post_init__(self) -> None:
        for name in (
            "sender_rate",
            "sender_burst",
            "sender_overrun_rate",
            "signer_rate",
            "signer_burst",
            "waste_rate",
            "waste_burst",
            "new_signer_rate",
            "new_signer_burst",
            "new_signer_rate_all",
            "new_signer_burst_all",
            "young_view_s",
            "standing_passes_per_step",
            "dedup_ttl_s",
            "max_skew_s",
            "repeat_window_s",
        ):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise LocalProtocolError(f"AdmissionConfig.{name} must be a positive number")
        if self.sender_burst < 1 or self.signer_burst < 1:
            raise LocalProtocolError("AdmissionConfig bursts must be >= 1")
        for name in (
            "max_rate_keys",
            "dedup_entries",
            "replay_window",
            "max_signers",
            "work_entries",
        ):
            if getattr(self, name) < 1:
                raise LocalProtocolError(f"AdmissionConfig.{name} must be >= 1")
        if not (math.isfinite(self.signer_rate_max_factor) and self.signer_rate_max_factor >= 1):
            raise LocalProtocolError("AdmissionConfig.signer_rate_max_factor must be >= 1")
        if self.young_view_signers < 0 or self.young_view_per_sender < 0:
            raise LocalProtocolError("AdmissionConfig.young_view_* counts must be >= 0")
        if self.max_future_versions < 0:
            raise LocalProtocolError("AdmissionConfig.max_future_versions must be >= 0")
        if not (math.isfinite(self.admit_reward) and self.admit_reward >= 0):
            raise LocalProtocolError("AdmissionConfig.admit_reward must be >= 0")
        missing = set(Reason) - set(self.penalties)
        if missing:
            raise LocalProtocolError(f"AdmissionConfig.penalties lacks {sorted(missing)}")
        for r, p in self.penalties.items():
            if not (math.isfinite(p) and p <= 0):
                raise LocalProtocolError(f"penalty of {r} must be a finite number <= 0")


# --------------------------------------------------------------------------------------
# Per-kind rules: how to open the bytes and which stages apply


@dataclass(frozen=True, slots=True)
class Opened:
    """What an opener returns: the signed envelope, the decoded object, the content id."""

    envelope: Envelope
    obj: Any
    content_id: bytes
    header: bytes | None = None  # rollout kinds: the header envelope bytes
    body: bytes | None = None  # rollout record: the body bytes


def _open_rollout_header(data: bytes) -> Opened:
    env, header, rid = open_header(data)
    return Opened(env, header, rid, header=bytes(data))


def _open_rollout_record(data: bytes) -> Opened:
    record = decode(RolloutRecord, data)
    env, header, rid = open_header(record.header)
    body = check_body(header, record.body)
    opened = OpenedRollout(env, header, body, rid, bytes(data))
    return Opened(env, opened, rid, header=record.header, body=record.body)


def _envelope_opener(cls: type) -> Callable[[bytes], Opened]:
    def opener(data: bytes) -> Opened:
        env, obj = open_envelope(data, cls)
        return Opened(env, obj, content_id(data))

    opener.__name__ = f"open_{cls.__name__}"
    return opener


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


_ENVELOPE_SLACK = 1024  # envelope fields around the payload (see Envelope)

KIND_RULES: Mapping[Kind, KindRule] = {
    Kind.ROLLOUT_HEADER: KindRule(
        _open_rollout_header,
        RolloutHeader.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=True,
        dedup_with=(Kind.ROLLOUT_RECORD,),
        work=True,
    ),
    Kind.ROLLOUT_RECORD: KindRule(
        _open_rollout_record,
        RolloutRecord.MAX_BYTES,
        gossip=False,
        versioned=True,
        store=True,
        work=True,
    ),
    Kind.VERDICT: KindRule(
        _envelope_opener(Verdict),
        Verdict.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=True,
        judged=True,
    ),
    Kind.DELEGATION: KindRule(
        _envelope_opener(Delegation),
        Delegation.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=False,
        store=False,
        delegation=True,
    ),
    Kind.WEIGHT_ANNOUNCE: KindRule(
        _envelope_opener(WeightManifest),
        WeightManifest.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=False,
        store=False,
        weights=True,
    ),
    Kind.WEIGHT_MANIFEST: KindRule(
        _envelope_opener(WeightManifest),
        WeightManifest.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=False,
        versioned=False,
        store=False,
        weights=True,
    ),
    Kind.FRAUD_EVIDENCE: KindRule(
        _envelope_opener(FraudEvidence),
        FraudEvidence.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=False,
    ),
    Kind.PRODUCER_CLAIM: KindRule(
        _envelope_opener(ProducerClaim),
        ProducerClaim.MAX_BYTES + _ENVELOPE_SLACK,
        gossip=True,
        versioned=True,
        store=False,
        judged=True,
    ),
}


# --------------------------------------------------------------------------------------
# Events and actions


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """`peer` handed us `data` (for gossip: the hop that forwarded it). `origin`, when the
    transport knows it, is the gossip message's publisher, authenticated by the message's
    own signature (GossipSub strict signing): a relay forwards with the origin unchanged."""

    peer: PeerId
    kind: Kind | str
    data: bytes
    now: float
    origin: PeerId | None = None


@dataclass(frozen=True, slots=True)
class VersionChanged:
    version: int
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class PeerConnected:
    peer: PeerId
    now: float


@dataclass(frozen=True, slots=True)
class Misbehaved:
    """A role found fault with `peer`: `penalty` (<= 0) is the score change, `reason` the
    role's words for it, `offence` its name in `protocol.penalties` (the ledger's reason;
    "misbehaved" when not given)."""

    peer: PeerId
    penalty: float
    reason: str
    now: float
    offence: str | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A message that passed every check."""

    kind: Kind
    content_id: bytes
    sender: PeerId
    envelope: Envelope
    obj: Any
    data: bytes
    received_at: float
    header: bytes | None = None
    body: bytes | None = None

    @property
    def signer(self) -> bytes:
        return self.envelope.signer

    @property
    def policy_version(self) -> int:
        return self.envelope.policy_version


@dataclass(frozen=True, slots=True)
class StoreFailed:
    item: Admitted
    now: float


@dataclass(frozen=True, slots=True)
class Known:
    kind: Kind
    ids: tuple[bytes, ...]
    now: float
    signers: tuple[bytes, ...] = ()  # signers of stored items: not new identities


@dataclass(frozen=True, slots=True)
class BodyMissing:
    """The node gave up pulling the body of an admitted header (no source served it).

    `answered`: how many times a source answered without the body (or with a bad one).
    0 means every attempt failed to connect (a source restarting, say): no evidence
    against anyone, nobody pays (the header stays owed and expires if it never comes)."""

    rollout_id: bytes
    signer: bytes
    sender: PeerId
    now: float
    answered: int = 1


@dataclass(frozen=True, slots=True)
class NewestShown:
    """The answer to an `AskNewest`: the signed manifest envelope `peer` sent as the newest
    it holds (None: it said it holds none). `answered=False`: no answer came (could not
    connect, timed out): no evidence, nobody pays."""

    peer: PeerId
    envelope: bytes | None
    now: float
    answered: bool = True


Event = (
    MessageReceived
    | VersionChanged
    | Tick
    | PeerConnected
    | Misbehaved
    | StoreFailed
    | Known
    | BodyMissing
    | NewestShown
)


@dataclass(frozen=True, slots=True)
class Reject:
    """A message refused. `penalty` is the score change applied to `peer` (<= 0)."""

    peer: PeerId
    reason: Reason
    penalty: float
    stage: Stage
    detail: str = ""
    kind: str | None = None
    # A STALE refusal of an authentic rollout (signature checked): it was published, only
    # late, so work accounting counts its counter (`protocol.accounting`), not a gap.
    late: Admitted | None = None

    @property
    def verdict(self) -> str:
        """Gossipsub's word for it: "reject" (a fault) or "ignore" (drop, no blame)."""
        return "reject" if self.penalty < 0 else "ignore"


@dataclass(frozen=True, slots=True)
class Penalized:
    """A score change (`penalty` < 0) charged to `peer` other than the sender's own refusal
    (a `Reject` reports that): a role's finding (`Misbehaved`), a body nobody served, the
    signer of double work someone else relayed. Log it and write it to the ledger, like a
    `Reject` (it has the same fields: `reason` is the offence's name in `protocol.penalties`,
    `stage` where it was found, "role" for a role's finding)."""

    peer: PeerId
    reason: str
    penalty: float
    stage: str
    detail: str = ""
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class Store:
    item: Admitted


@dataclass(frozen=True, slots=True)
class Forward:
    item: Admitted


@dataclass(frozen=True, slots=True)
class Deliver:
    item: Admitted


@dataclass(frozen=True, slots=True)
class Disconnect:
    peer: PeerId
    reason: Reason


@dataclass(frozen=True, slots=True)
class Ban:
    peer: PeerId
    until: float
    record: (
        PeerRecord  # persist this (node.store.store.Store.save_peer) so the ban survives restart
    )


@dataclass(frozen=True, slots=True)
class Unban:
    peer: PeerId


Action = Reject | Penalized | Store | Forward | Deliver | Disconnect | Ban | Unban | AskNewest


def verdict_of(actions: list[Action]) -> str:
    """What a message's actions mean to the gossip router: "accept" (admitted: deliver and
    forward), "reject" (its sender was charged: a fault no honest peer passes on; counts
    against the sender in gossipsub's score), or "ignore" (drop, do not forward, no blame:
    a copy, over a rate, what only our view refuses, a fault of a signer it only relayed)."""
    for action in actions:
        if isinstance(action, Store | Forward | Deliver):
            return "accept"
        if isinstance(action, Reject):
            return action.verdict
    return "ignore"


# --------------------------------------------------------------------------------------
# Pure helpers: token buckets, dedup cache


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; a clock going backwards refills nothing."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float, n: float = 1.0) -> bool:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class RateLimiter:
    """Token buckets by key, at most `max_keys` (least recently used forgotten first)."""

    def __init__(self, rate: float, burst: float, max_keys: int) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[Any, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: Any, now: float, scale: float = 1.0) -> bool:
        """Take a token of `key`'s bucket; `scale` multiplies its rate and burst."""
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = TokenBucket(self.rate, self.burst, self.burst, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if scale != 1.0 or b.rate != self.rate:
            b.rate, b.burst = self.rate * scale, self.burst * scale
        return b.take(now)


class DedupCache:
    """Ids seen within the last `ttl_s` seconds, at most `max_entries` of them."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._seen: OrderedDict[Any, float] = OrderedDict()  # id -> time added, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: Any) -> bool:
        return key in self._seen

    def seen(self, key: Any, now: float) -> bool:
        t = self._seen.get(key)
        return t is not None and now - t <= self.ttl_s

    def add(self, key: Any, now: float) -> None:
        self._seen.pop(key, None)
        self._seen[key] = now
        self.expire(now)

    def forget(self, key: Any) -> None:
        self._seen.pop(key, None)

    def expire(self, now: float) -> None:
        seen, limit, ttl = self._seen, self.max_entries, self.ttl_s
        while seen:
            key = next(iter(seen))
            if len(seen) > limit or now - seen[key] > ttl:
                del seen[key]
            else:
                break


# --------------------------------------------------------------------------------------
# The state machine


class _Refused(Exception):
    """Internal: a stage refused the message (never escapes `handle`)."""

    def __init__(
        self,
        stage: Stage,
        reason: Reason,
        detail: str,
        penalty: float | None = None,
        signer: bytes | None = None,
        blame_signer: bool = False,
        wasteful: bool = False,
        ask: AskNewest | None = None,
    ) -> None:
        super().__init__(detail)
        self.stage, self.reason, self.detail = stage, reason, detail
        self.penalty, self.signer, self.blame_signer = penalty, signer, blame_signer
        # Free for a relay only within its allowance of blameless refusals (like repeats).
        self.wasteful = wasteful
        self.ask = ask  # a question the sender can answer to back its claim
        self.late: Admitted | None = None


def _relaying(sender: PeerId, origin: PeerId | None, signer: bytes) -> bool:
    """Whether `sender` handed us `signer`'s message as a relay: it is not the signer, and
    not the gossip message's publisher either. An honest node publishes only what it signed
    itself, so the publisher of another key's message is its author, and gets none of the
    leniency relays get for faults that depend on the receiver's view."""
    return not _same_peer(sender, signer) and not (origin is not None and origin == sender)


def _same_peer(sender: PeerId, signer: bytes) -> bool:
    """Whether the sender is the signer: peer ids as bytes, or as base58 text (`12D3KooW...`)."""
    if isinstance(sender, str):
        return sender == peer_id_to_b58(signer)
    return sender == signer


def _as_peer_form(like: PeerId, peer_id: bytes) -> PeerId:
    """A signer's peer id in the form senders are given in (text or bytes)."""
    return peer_id_to_b58(peer_id) if isinstance(like, str) else peer_id


def _work_key(op: Opened) -> tuple[int, bytes]:
    """(counter, body digest) of an opened rollout header or record. The policy version is
    not part of the unit: one counter is one task whatever version a rollout claims."""
    obj = op.obj
    header = obj.header if isinstance(obj, OpenedRollout) else obj
    return header.counter, header.body_digest


class WorkIndex:
    """Which rollout holds each unit of work: (signer, counter) and body digest.

    Bounded: at most `max_entries` of each, oldest forgotten first.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._units: OrderedDict[tuple[bytes, int], bytes] = OrderedDict()
        self._bodies: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()  # -> signer, id

    def __len__(self) -> int:
        return len(self._units)

    def clash(self, signer: bytes, key: tuple[int, bytes], rid: bytes) -> str | None:
        """None if `rid` may hold this work; else what it clashes on ("counter", "body",
        or "other_signer" when another signer's rollout already holds the body)."""
        counter, digest = key
        held = self._units.get((signer, counter))
        if held is not None and held != rid:
            return "counter"
        body = self._bodies.get(digest)
        if body is not None and body[1] != rid:
            return "body" if body[0] == signer else "other_signer"
        return None

    def add(self, signer: bytes, key: tuple[int, bytes], rid: bytes) -> None:
        counter, digest = key
        self._units[(signer, counter)] = rid
        self._units.move_to_end((signer, counter))
        self._bodies[digest] = (signer, rid)
        self._bodies.move_to_end(digest)
        while len(self._units) > self.max_entries:
            self._units.popitem(last=False)
        while len(self._bodies) > self.max_entries:
            self._bodies.popitem(last=False)


class _Repeats:
    """How many times each (peer, reason) was charged before, counting only offences less
    than `window_s` apart (a longer pause starts the count again). At most `max_keys`."""

    def __init__(self, window_s: float, max_keys: int) -> None:
        self.window_s, self.max_keys = window_s, max_keys
        self._last: OrderedDict[tuple[PeerId, str], tuple[int, float]] = OrderedDict()

    def count(self, peer: PeerId, reason: str, now: float) -> int:
        """Offences before this one; records this one."""
        key = (peer, reason)
        n, at = self._last.pop(key, (0, -math.inf))
        before = n if now - at <= self.window_s else 0
        self._last[key] = (before + 1, max(at, now))
        if len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        return before


class _YoungView:
    """The new-signer allowance of a view that started empty (see `AdmissionConfig`).

    Why it is safe: the rates of new signers protect a running view from a flood of fresh
    keys (each would shed a bad key's record and get its own signer rate). A view that
    restored its signers (`Known`) is never young, so a restart opens nothing; a young view
    has no records to shed yet, and what it admits is bounded in count, per sender and in
    time. Headers a sender authored for another key never draw on it."""

    def __init__(self, signers: int, per_sender: int, window_s: float) -> None:
        self.left, self.per_sender, self.window_s = signers, per_sender, window_s
        self.started: float | None = None
        self.by_sender: dict[Any, int] = {}  # at most `signers` keys: each took one

    def close(self) -> None:
        self.left = 0
        self.by_sender.clear()

    def take(self, sender: Any, now: float) -> bool:
        if self.left <= 0:
            return False
        if self.started is None:
            self.started = now
        if now - self.started > self.window_s:
            self.close()
            return False
        n = self.by_sender.get(sender, 0)
        if n >= self.per_sender:
            return False
        self.by_sender[sender] = n + 1
        self.left -= 1
        return True


@dataclass(slots=True)
class _Msg:
    """A message on its way through the stages."""

    peer: PeerId
    now: float
    kind: Kind
    rule: KindRule
    data: bytes | bytearray | memoryview
    opened: Opened | None = None
    origin: PeerId | None = None


_REASON_NAMES = frozenset(str(r) for r in Reason)

# isinstance() classes, built once (not per call as `int | float` would be).
_NUMBER = (int, float)
_BYTES = (bytes, bytearray, memoryview)

_MAX_RETRIES = 4096  # items whose store failed that a later copy may replace

# The output stages and the action each one emits.
_OUTPUTS: Mapping[Stage, Callable[[Admitted], Action]] = {
    Stage.STORE: Store,
    Stage.FORWARD: Forward,
    Stage.DELIVER: Deliver,
}


class Admission:
    """Admission of one peer's incoming messages (see the module docstring)."""

    def __init__(
        self,
        run: RunRules,
        config: AdmissionConfig | None = None,
        *,
        version: int = 0,
        scores: PeerScores | None = None,
        rules: Mapping[Kind, KindRule] = KIND_RULES,
    ) -> None:
        self.run = run
        self.config = cfg = config if config is not None else AdmissionConfig()
        self.version = int(version)
        # (version, when it became ours) for versions reached while running, ascending
        self._version_times: deque[tuple[int, float]] = deque(maxlen=256)
        self._start_version = self.version
        self.scores = scores if scores is not None else PeerScores()
        self.rules = rules
        self._stages = {k: r.stages() for k, r in rules.items()}
        self._plans: dict[Kind, tuple[tuple[Callable[[_Msg], None], ...], tuple[Any, ...]]] = {}
        self._sender_rate = RateLimiter(cfg.sender_rate, cfg.sender_burst, cfg.max_rate_keys)
        self._overrun = RateLimiter(cfg.sender_overrun_rate, cfg.sender_burst, cfg.max_rate_keys)
        # (sender, id or body digest) of what each sender handed us: an honest relay hands
        # over each message (and each body) once, so only a repeat draws on its allowance.
        self._handed = DedupCache(2 * cfg.dedup_entries, cfg.dedup_ttl_s)
        self._signer_rate = RateLimiter(cfg.signer_rate, cfg.signer_burst, cfg.max_rate_keys)
        self._waste = RateLimiter(cfg.waste_rate, cfg.waste_burst, cfg.max_rate_keys)
        self._dedup = DedupCache(cfg.dedup_entries, cfg.dedup_ttl_s)
        self.authority = Authority(run.validator_keys, run.trainer_keys)
        self._new_signers = RateLimiter(
            cfg.new_signer_rate, cfg.new_signer_burst, cfg.max_rate_keys
        )
        self._new_signers_all = TokenBucket(
            cfg.new_signer_rate_all, cfg.new_signer_burst_all, cfg.new_signer_burst_all, -math.inf
        )
        self._known_signers: OrderedDict[bytes, None] = OrderedDict()
        self._standing: OrderedDict[bytes, int] = OrderedDict()  # producer -> passes
        self._young = _YoungView(
            cfg.young_view_signers, cfg.young_view_per_sender, cfg.young_view_s
        )
        self.work = WorkIndex(cfg.work_entries)
        self._replay = ReplayGuard(
            run.run_id,
            max_skew_ms=int(cfg.max_skew_s * 1000),
            window=cfg.replay_window,
            max_signers=cfg.max_signers,
        )
        # (peer, reason) -> recent offences, for the reasons whose cost doubles on repeat
        self._repeats = _Repeats(cfg.repeat_window_s, cfg.max_rate_keys)
        self._weights_version = -1  # highest weight announcement admitted
        self.claims = VersionClaims()  # future versions we asked the sender to back
        self._retry: OrderedDict[tuple[bytes, str, int], bytes] = OrderedDict()  # StoreFailed
        # Legal steps as data: which method carries out each check stage.
        self._checks: dict[Stage, Callable[[_Msg], None]] = {
            Stage.SIZE: self._stage_size,
            Stage.RATE: self._stage_rate,
            Stage.DECODE: self._stage_decode,  # the opener also checks the signature
            Stage.CONTEXT: self._stage_context,
            Stage.DEDUP: self._stage_dedup,
            Stage.REPLAY: self._stage_replay,
            Stage.UNIQUE: self._stage_unique,
            Stage.QUOTA: self._stage_quota,
        }
        self._handlers: dict[type, Callable[[Any], list[Action]]] = {
            MessageReceived: self._on_message,
            VersionChanged: self._on_version,
            Tick: self._on_tick,
            PeerConnected: self._on_connect,
            Misbehaved: self._on_misbehaved,
            StoreFailed: self._on_store_failed,
            Known: self._on_known,
            BodyMissing: self._on_body_missing,
            NewestShown: self._on_newest_shown,
        }

    def set_run_keys(
        self, trainer_keys: frozenset[bytes], validator_keys: frozenset[bytes]
    ) -> None:
        """A newer release of the run (`protocol.run_manifest`) names these trainer and
        validator keys: who may publish versions and judge rollouts from now on."""
        self.run = RunRules(
            self.run.run_id,
            self.run.max_staleness,
            frozenset(trainer_keys),
            frozenset(validator_keys),
            self.run.verdict_quorum,
            self.run.run_seed,
        )
        self.authority.set_keys(validator_keys, trainer_keys)

    # -- entry point ---------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; returns the actions to carry out, in order."""
        handler = self._handlers.get(type(event))
        if handler is None:
            raise LocalProtocolError(f"Admission cannot handle {type(event).__name__}")
        now = event.now
        if not isinstance(now, _NUMBER) or not math.isfinite(now):
            raise LocalProtocolError("event.now must be a finite number of seconds")
        return handler(event)

    # -- events --------------------------------------------------------------------

    def _on_version(self, ev: VersionChanged) -> list[Action]:
        if ev.version < 0:
            raise LocalProtocolError("policy version must be >= 0")
        if ev.version > self.version:
            self._version_times.append((int(ev.version), ev.now))
        self.version = int(ev.version)
        return []

    def _stale_by_fault(self, version: int, timestamp_ms: int) -> bool:
        """Whether a rollout of `version` was signed a grace after the first version that
        made it stale (`version + S + 1`) became ours. Versions we held when we started
        count as known forever."""
        first_stale = version + self.run.max_staleness + 1
        if first_stale <= self._start_version:
            return True
        for v, at in self._version_times:
            if v >= first_stale:
                return timestamp_ms / 1000.0 > at + self.config.stale_grace_s
        return True

    def _on_tick(self, ev: Tick) -> list[Action]:
        self._dedup.expire(ev.now)
        return [Unban(p) for p in self.scores.expire(ev.now)]

    def _on_connect(self, ev: PeerConnected) -> list[Action]:
        if self.scores.is_banned(ev.peer, ev.now):
            return [Disconnect(ev.peer, Reason.BANNED)]
        return []

    def _on_misbehaved(self, ev: Misbehaved) -> list[Action]:
        if not (math.isfinite(ev.penalty) and ev.penalty <= 0):
            raise LocalProtocolError("Misbehaved.penalty is a score change <= 0")
        name = ev.offence or str(Reason.MISBEHAVED)
        if name not in offences.BY_NAME:
            raise LocalProtocolError(f"Misbehaved.offence {name!r} is not in protocol.penalties")
        penalty = ev.penalty
        if penalty < 0 and offences.BY_NAME[name].repeats:
            penalty = offences.repeat_cost(penalty, self._repeats.count(ev.peer, name, ev.now))
        return self._charge(ev.peer, penalty, name, "role", ev.reason, ev.now)

    def _charge(
        self,
        peer: PeerId,
        delta: float,
        name: str,
        stage: str,
        detail: str,
        now: float,
        kind: str | None = None,
    ) -> list[Action]:
        """A `Penalized` report of a score change, then the change (and any ban)."""
        if delta == 0:
            return []
        # A ban's Disconnect names a Reason: the offence's when it is one, else MISBEHAVED.
        reason = Reason(name) if name in _REASON_NAMES else Reason.MISBEHAVED
        return [
            Penalized(peer, name, delta, stage, detail, kind),
            *self._apply_score(peer, delta, reason, now),
        ]

    def _on_store_failed(self, ev: StoreFailed) -> list[Action]:
        item = ev.item
        self._dedup.forget((item.kind, item.content_id))
        # The replay guard already holds (signer, kind, seq); let a copy of these very bytes
        # through once more (bounded memory, oldest forgotten first).
        env = item.envelope
        self._retry[(env.signer, env.kind, env.seq)] = item.content_id
        while len(self._retry) > _MAX_RETRIES:
            self._retry.popitem(last=False)
        return []

    def _on_body_missing(self, ev: BodyMissing) -> list[Action]:
        """Nobody served the body of an admitted header: its signer signed a promise it
        did not keep, and its sender passed it on (both pay a little; honest peers that
        crashed lose far less than a flood of body-less headers costs). Pulls that only
        failed to connect are no evidence: nobody pays."""
        if ev.answered <= 0:
            return []
        detail = f"rollout {ev.rollout_id.hex()[:16]}: no source served its body"
        actions = self._charge(
            _as_peer_form(ev.sender, ev.signer),
            self.config.penalties[Reason.BODY_MISSING],
            str(Reason.BODY_MISSING),
            "body_pull",
            detail,
            ev.now,
            str(Kind.ROLLOUT_HEADER),
        )
        if not _same_peer(ev.sender, ev.signer):
            actions += self._charge(
                ev.sender,
                self.config.body_missing_sender,
                offences.BODY_MISSING_RELAYED.name,
                "body_pull",
                detail,
                ev.now,
                str(Kind.ROLLOUT_HEADER),
            )
        return actions

    def _on_newest_shown(self, ev: NewestShown) -> list[Action]:
        """A sender backs the future version it handed us with a trainer-signed manifest,
        or pays (`protocol.version_claims`)."""
        if not ev.answered:
            self.claims.unanswered(ev.peer)
            return []
        shown = None
        if (
            ev.envelope is not None
            and len(ev.envelope) <= self.rules[Kind.WEIGHT_MANIFEST].max_bytes
        ):
            try:
                op = self.rules[Kind.WEIGHT_MANIFEST].opener(ev.envelope)
            except _RemoteError:
                op = None
            if (
                op is not None
                and op.envelope.run_id == self.run.run_id
                and op.envelope.signer in self.run.trainer_keys
            ):
                shown = int(op.obj.version)
        if not self.claims.answered(ev.peer, shown):
            return []
        penalty = self.config.penalties[Reason.UNBACKED_VERSION]
        detail = f"newest manifest shown: {shown}"
        return [
            Reject(ev.peer, Reason.UNBACKED_VERSION, penalty, Stage.CONTEXT, detail),
            *self._apply_score(ev.peer, penalty, Reason.UNBACKED_VERSION, ev.now),
        ]

    def _on_known(self, ev: Known) -> list[Action]:
        kind = Kind(ev.kind)
        for cid in ev.ids:
            self._dedup.add((kind, bytes(cid)), ev.now)
        for signer in ev.signers:
            self._know_signer(bytes(signer))
        if ev.signers:
            self._young.close()  # a view restored from our store is not young
        return []

    def _plan(self, kind: Kind) -> tuple[tuple[Callable[[_Msg], None], ...], tuple[Any, ...]]:
        """The kind's check methods and output makers, in stage order (computed once)."""
        plan = self._plans.get(kind)
        if plan is None:
            stages = self._stages[kind]
            checks = tuple(c for s in stages if (c := self._checks.get(s)) is not None)
            makes = tuple(mk for s in stages if (mk := _OUTPUTS.get(s)) is not None)
            plan = self._plans[kind] = (checks, makes)
        return plan

    def _on_message(self, ev: MessageReceived) -> list[Action]:
        peer, now = ev.peer, ev.now
        if not isinstance(ev.data, _BYTES):
            raise LocalProtocolError("MessageReceived.data must be bytes")
        m: _Msg | None = None
        try:
            # GATE comes before the kind's own stages are known.
            if self.scores.is_banned(peer, now):
                raise _Refused(Stage.GATE, Reason.BANNED, "sender is banned")
            try:
                kind = ev.kind if type(ev.kind) is Kind else Kind(ev.kind)
                rule = self.rules[kind]
            except (ValueError, KeyError, TypeError):
                raise _Refused(
                    Stage.GATE, Reason.UNKNOWN_KIND, f"no such kind {str(ev.kind)!r}"
                ) from None
            m = _Msg(peer, now, kind, rule, ev.data, origin=ev.origin)
            checks, makes = self._plan(kind)
            for check in checks:
                check(m)
        except _Refused as r:
            if r.blame_signer and m is not None:
                self._remember(m)  # judged by its content: copies are replays, free for relays
            repeat = False
            if r.reason is Reason.DUPLICATE and m is not None and m.rule.gossip:
                repeat = self._handed_before(peer, m, now)
            return self._reject(peer, r, str(ev.kind), now, repeat, ev.origin)

        # Every check passed: remember it, then the output stages in table order.
        op = m.opened
        assert op is not None
        self._dedup.add((kind, op.content_id), now)
        self._remember(m)
        if rule.gossip:
            self._handed_before(peer, m, now)
        if rule.weights and rule.gossip:
            self._weights_version = max(self._weights_version, op.obj.version)
        if rule.work:
            self.work.add(op.envelope.signer, _work_key(op), op.content_id)
        self._know_signer(op.envelope.signer)
        if kind is Kind.VERDICT:
            self._note_verdict(op.obj.producer, op.obj.passed)
        if rule.delegation:
            env = op.envelope
            self.authority.apply(
                env.signer, op.obj.validator, op.obj.granted, (env.timestamp_ms, env.seq)
            )
        if self.config.admit_reward > 0:
            self.scores.reward(peer, self.config.admit_reward, now)
        item = Admitted(
            kind, op.content_id, peer, op.envelope, op.obj, bytes(m.data), now, op.header, op.body
        )
        return [make(item) for make in makes]

    def _remember(self, m: _Msg) -> None:
        """Record the message's (signer, kind, seq) in the replay guard (kinds with REPLAY)."""
        if Stage.REPLAY not in self._stages[m.kind] or m.opened is None:
            return
        env = m.opened.envelope
        self._retry.pop((env.signer, env.kind, env.seq), None)
        self._replay.remember(env)

    def signer_rate_factor(self, signer: bytes) -> float:
        """How many times `signer_rate` (and burst) this producer may publish: 1 plus one per
        `standing_passes_per_step` passing verdicts about its work, at most
        `signer_rate_max_factor`. A worker paces itself by its own view of this."""
        cfg = self.config
        passes = self._standing.get(bytes(signer), 0)
        return min(cfg.signer_rate_max_factor, 1.0 + passes // cfg.standing_passes_per_step)

    def _note_verdict(self, producer: bytes, passed: bool) -> None:
        """An authorized validator's admitted verdict: a pass adds to the producer's
        standing, a fail takes it back to none."""
        standing = self._standing
        producer = bytes(producer)
        standing[producer] = standing.get(producer, 0) + 1 if passed else 0
        standing.move_to_end(producer)
        if len(standing) > self.config.max_rate_keys:
            standing.popitem(last=False)

    def _know_signer(self, signer: bytes) -> None:
        self._known_signers[signer] = None
        self._known_signers.move_to_end(signer)
        if len(self._known_signers) > self.config.max_signers:
            self._known_signers.popitem(last=False)

    def _handed_before(self, peer: PeerId, m: _Msg, now: float) -> bool:
        """Whether `peer` handed us this message (or its body) before; remembers it."""
        assert m.opened is not None
        handed = self._handed
        key = (peer, m.opened.content_id)
        before = handed.seen(key, now)
        if m.rule.work:
            body = (peer, _work_key(m.opened)[1])
            before = before or handed.seen(body, now)
            handed.add(key, now)
            handed.add(body, now)
        else:
            handed.add(key, now)
        return before

    # -- check stages (each raises _Refused or returns) ----------------------------

    def _stage_size(self, m: _Msg) -> None:
        if len(m.data) > m.rule.max_bytes:
            raise _Refused(
                Stage.SIZE, Reason.OVERSIZED, f"{len(m.data)} bytes > {m.rule.max_bytes}"
            )

    def _stage_decode(self, m: _Msg) -> None:
        """Decode and verify in one call to the kind's opener (the protocol functions do
        both); which stage failed is read from the error's class."""
        if type(m.data) is not bytes:
            m.data = bytes(m.data)  # copied only once the size is known to be within limits
        try:
            m.opened = m.rule.opener(m.data)
        except SignatureError as exc:
            raise _Refused(Stage.SIGNATURE, Reason.BAD_SIGNATURE, str(exc), exc.penalty) from None
        except IntegrityError as exc:
            raise _Refused(Stage.SIGNATURE, Reason.BODY_MISMATCH, str(exc), exc.penalty) from None
        except DecodeError as exc:
            raise _Refused(Stage.DECODE, Reason.MALFORMED, str(exc), exc.penalty) from None
        except _RemoteError as exc:  # any other way a peer's bytes can be wrong
            raise _Refused(Stage.DECODE, Reason.MALFORMED, str(exc), exc.penalty) from None

    def _stage_context(self, m: _Msg) -> None:
        assert m.opened is not None
        rule, op, now = m.rule, m.opened, m.now
        env = op.envelope
        who = env.signer

        def refuse(reason: Reason, detail: str) -> _Refused:
            return _Refused(Stage.CONTEXT, reason, detail, signer=who)

        if env.run_id != self.run.run_id:
            raise refuse(Reason.WRONG_RUN, f"run {env.run_id!r}, this is {self.run.run_id!r}")
        if rule.work and self.run.run_seed is not None:
            header = op.obj.header if isinstance(op.obj, OpenedRollout) else op.obj
            if header.task_seed != task_seed(self.run.run_seed, header.counter, who):
                r = refuse(
                    Reason.NOT_BOUND, "task seed not derived from the signer's key and counter"
                )
                r.blame_signer = True  # it signed a claim to work its key did not make
                raise r
        if rule.versioned:
            v, t, s = env.policy_version, self.version, self.run.max_staleness
            if t - v > s:
                # Who pays: nobody for bytes we asked for (a pull) or for a rollout that
                # went stale while it was made or on its way; its signer otherwise.
                fault = rule.gossip and self._stale_by_fault(v, env.timestamp_ms)
                r = _Refused(
                    Stage.CONTEXT,
                    Reason.STALE,
                    f"version {v} at {t}: {t - v} > S={s}",
                    None if fault else 0.0,
                    signer=who,
                )
                if rule.work:
                    r.late = Admitted(m.kind, op.content_id, m.peer, env, op.obj, b"", now)
                raise r
            if v > t and rule.work and self.config.publishes_versions:
                r = refuse(Reason.UNPUBLISHED_VERSION, f"version {v}, the newest published is {t}")
                r.blame_signer = True  # it signed a claim of weights that do not exist
                raise r
            if v - t > (margin := self.config.max_future_versions):
                # The signer holds v's manifest; a relay one of v - margin or newer.
                at_least = v if _same_peer(m.peer, who) else v - margin
                ask = self.claims.claimed(m.peer, at_least, now) if rule.gossip else None
                r = refuse(Reason.FUTURE_VERSION, f"version {v}, ours is {t}")
                r.ask = ask
                raise r
        if rule.weights:
            if who not in self.run.trainer_keys:
                raise refuse(Reason.UNAUTHORIZED, "weights not signed by a trainer key")
            version = op.obj.version
            if rule.gossip and version <= max(self._weights_version, self.version):
                raise refuse(Reason.OUTDATED, f"weights version {version} is not new")
        if rule.judged:
            self._check_judge(op, now, m.peer, m.origin)
        if rule.delegation and not self.authority.may_delegate(who):
            raise refuse(Reason.UNAUTHORIZED, "delegation not signed by a trainer key")
        if rule.gossip:
            skew_ms = env.timestamp_ms - now * 1000.0
            if abs(skew_ms) > self.config.max_skew_s * 1000.0:
                raise refuse(Reason.CLOCK_SKEW, f"timestamp {skew_ms:+.0f} ms from now")

    def _check_judge(
        self, op: Opened, now: float, sender: PeerId, origin: PeerId | None = None
    ) -> None:
        """A verdict (or a producer claim) counts only from a key allowed to judge, never
        about its own work."""
        who, v = op.envelope.signer, op.obj
        # Whether a key may judge can change (delegations): a relay that has not heard
        # of a revocation yet is not to blame.
        pen = 0.0 if _relaying(sender, origin, who) else None
        if not self.authority.may_judge(who):
            raise _Refused(
                Stage.CONTEXT,
                Reason.UNAUTHORIZED,
                "signer may not judge",
                pen,
                wasteful=not self.authority.ever_named(who),
            )
        if v.producer == who:
            raise _Refused(Stage.CONTEXT, Reason.UNAUTHORIZED, "a verdict on its own work", pen)
        if getattr(v, "sample_ticket", b"") and not check_ticket(
            who, self.run.run_id, v.rollout_id, v.sample_ticket
        ):
            raise _Refused(
                Stage.SIGNATURE, Reason.BAD_SIGNATURE, "sample ticket is not the signer's"
            )

    def _stage_rate(self, m: _Msg) -> None:
        """The cheap per-sender limit, before any decoding or signature check. Over it
        the message is dropped unopened; the sender pays only past a second allowance
        (`sender_overrun_rate` more per second): honest relays may be busy."""
        if not self._sender_rate.allow(m.peer, m.now):
            pen = 0.0 if self._overrun.allow(m.peer, m.now) else None
            raise _Refused(Stage.RATE, Reason.RATE_LIMITED, "sender over its rate", pen)

    def _stage_quota(self, m: _Msg) -> None:
        """What one signer may publish, counted only for fresh, unique messages: copies
        and replays sent by a third party never reach this stage, so never cost it.
        Fresh identities earn their place slowly: each sender may introduce only a few
        signers we have never admitted before (and all senders together a few more),
        except in a young view (`_YoungView`: at a cold start every signer is new)."""
        assert m.opened is not None
        signer = m.opened.envelope.signer
        authored = m.origin == m.peer and not _same_peer(m.peer, signer)
        if signer not in self._known_signers and not (
            (not authored and self._young.take(m.peer, m.now))
            or (self._new_signers.allow(m.peer, m.now) and self._new_signers_all.take(m.now))
        ):
            # Free for a relay (it may know these signers; we do not yet). But an honest
            # node publishes only what it signed itself, so a sender that is the gossip
            # origin of another signer's message is no relay: it pays for the refusal.
            raise _Refused(
                Stage.QUOTA,
                Reason.NEW_IDENTITIES,
                "too many new signers at once",
                AUTHORED_NEW_IDENTITY_PENALTY if authored else None,
            )
        if not self._signer_rate.allow(signer, m.now, self.signer_rate_factor(signer)):
            # Dropped, never charged: an honest producer may be faster than we accept (a
            # flood still pays at the per-sender stage), and its relays are not to blame.
            raise _Refused(Stage.QUOTA, Reason.RATE_LIMITED, "signer over its rate", 0.0)

    def _stage_unique(self, m: _Msg) -> None:
        """One rollout per (producer, counter) and per body digest."""
        assert m.opened is not None
        op = m.opened
        signer = op.envelope.signer
        clash = self.work.clash(signer, _work_key(op), op.content_id)
        if clash is None:
            return
        if clash == "other_signer":
            # Someone else signed this body first: not provably this signer's fault.
            raise _Refused(Stage.UNIQUE, Reason.DUPLICATE, "body already admitted", 0.0)
        raise _Refused(
            Stage.UNIQUE,
            Reason.DOUBLE_WORK,
            f"{clash} already used by another rollout",
            signer=signer,
            blame_signer=True,
        )

    def _stage_dedup(self, m: _Msg) -> None:
        assert m.opened is not None
        cid = m.opened.content_id
        for k in (m.kind, *m.rule.dedup_with):
            if self._dedup.seen((k, cid), m.now):
                raise _Refused(Stage.DEDUP, Reason.DUPLICATE, f"already admitted as {k}")

    def _stage_replay(self, m: _Msg) -> None:
        assert m.opened is not None
        env = m.opened.envelope
        if self._retry.get((env.signer, env.kind, env.seq)) == m.opened.content_id:
            return  # a copy of an item we failed to store
        try:
            # Only checked here: remembered once admitted (`_remember`).
            self._replay.check(env, int(m.now * 1000), remember=False)
        except ReplayError as exc:
            raise _Refused(Stage.REPLAY, Reason.REPLAY, str(exc), signer=env.signer) from None

    # -- scoring -------------------------------------------------------------------

    def _reject(
        self,
        peer: PeerId,
        r: _Refused,
        kind: str,
        now: float,
        repeat: bool = False,
        origin: PeerId | None = None,
    ) -> list[Action]:
        relayed = r.signer is not None and _relaying(peer, origin, r.signer)
        if r.reason not in RELAY_BLAMED and relayed:
            penalty = 0.0  # a view-dependent fault of the signer, not of this relay
        elif r.penalty is None:
            penalty = self.config.penalties[r.reason]
        else:
            penalty = min(0.0, float(r.penalty)) if math.isfinite(r.penalty) else 0.0
        reason = r.reason
        if penalty < 0 and reason in REPEATS_DOUBLE:
            penalty = offences.repeat_cost(penalty, self._repeats.count(peer, reason, now))
        if r.reason is Reason.BANNED:
            return [
                Reject(peer, reason, penalty, r.stage, r.detail, kind),
                Disconnect(peer, reason),
            ]
        if (
            penalty == 0
            and ((reason is Reason.DUPLICATE and repeat) or r.wasteful)
            and not self._waste.allow(peer, now)
        ):
            # A copy is free the first time a sender hands it over (we may simply have
            # heard it elsewhere first, or held it before a restart). An honest relay
            # hands over each message and each body once, so repeats are free only up to
            # an allowance; past it the sender pays. So does a verdict of a key nobody
            # ever named (no honest relay's admission passed it, unless a delegation is
            # still on its way to us: a few). What our view refuses (stale, new signers,
            # a replay, a revoked judge) stays free; the sender rate limit bounds it.
            reason, penalty = Reason.FLOODING, self.config.penalties[Reason.FLOODING]
        actions: list[Action] = [Reject(peer, reason, penalty, r.stage, r.detail, kind, r.late)]
        actions.extend(self._apply_score(peer, penalty, reason, now))
        if r.blame_signer and r.signer is not None and not _same_peer(peer, r.signer):
            # The signer is provably at fault (it signed both): it pays whoever relayed it.
            signer = _as_peer_form(peer, r.signer)
            cost = self.config.penalties[r.reason]
            actions += self._charge(signer, cost, str(r.reason), str(r.stage), r.detail, now, kind)
        if r.ask is not None:
            actions.append(r.ask)
        return actions

    def _apply_score(self, peer: PeerId, delta: float, reason: Reason, now: float) -> list[Action]:
        if delta == 0:
            return []
        change = self.scores.adjust(peer, delta, now)
        if change.banned_until is None:
            return []
        record = self.scores.record(peer, now)
        assert record is not None
        return [Disconnect(peer, reason), Ban(peer, change.banned_until, record)]
