"""The admission pipeline: what a peer does with every message another peer sends it.

A sans-IO state machine (`Admission.handle(event) -> list[Action]`); `machine.py`'s
docstring describes the pipeline, its stages in the order they run, and who pays.

The code is organized as follows:
- vocabulary.py: the stages, kinds and reasons, and their tables (costs, relay blame, stage reasons)
- config.py: the run's rules (`RunRules`) and admission's limits (`AdmissionConfig`)
- kinds.py: per-kind rules (`KindRule`, `KIND_RULES`) and the openers of each kind's bytes
- messages.py: the events that come in and the actions that go out; `verdict_of`
- inflight.py: a message on its way through the stages, a stage's refusal, peer helpers
- checks.py: the stages with no memory of their own: SIZE, DECODE/SIGNATURE, CONTEXT
- quota.py: per-sender and per-signer rates, new signers, the young view (RATE, QUOTA)
- seen.py: memory of seen work: dedup cache, replay guard, work index (DEDUP, REPLAY, UNIQUE)
- version_view.py: our policy version, when each became ours, the newest weights
- trust.py: who pays for a refusal, role findings, a producer's verified standing
- machine.py: `Admission`, which composes the above and runs each kind's stages
- table.py: the pipeline table (stages x kinds x who pays) for docs/DESIGN.md
"""

from protocol.admission.config import AdmissionConfig, RunRules
from protocol.admission.kinds import KIND_RULES, KindRule, Opened
from protocol.admission.machine import Admission
from protocol.admission.messages import (
    Action,
    Admitted,
    Ban,
    BodyMissing,
    Deliver,
    Disconnect,
    Equivocated,
    Event,
    Forward,
    Known,
    MessageReceived,
    Misbehaved,
    NewestShown,
    PeerConnected,
    Penalized,
    Reject,
    Store,
    StoreFailed,
    Tick,
    Unban,
    VersionChanged,
    verdict_of,
)
from protocol.admission.quota import RateLimiter, TokenBucket
from protocol.admission.seen import DedupCache, WorkIndex
from protocol.admission.vocabulary import (
    PENALTIES,
    PIPELINE,
    RELAY_BLAMED,
    REPEATS_DOUBLE,
    STAGE_REASONS,
    Kind,
    Reason,
    Stage,
)

__all__ = [
    "KIND_RULES",
    "PENALTIES",
    "PIPELINE",
    "RELAY_BLAMED",
    "REPEATS_DOUBLE",
    "STAGE_REASONS",
    "Action",
    "Admission",
    "AdmissionConfig",
    "Admitted",
    "Ban",
    "BodyMissing",
    "DedupCache",
    "Deliver",
    "Disconnect",
    "Equivocated",
    "Event",
    "Forward",
    "Kind",
    "KindRule",
    "Known",
    "MessageReceived",
    "Misbehaved",
    "NewestShown",
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
    "WorkIndex",
    "verdict_of",
]
