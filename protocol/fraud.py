"""Fraud cases: a failed verdict accuses; only a re-run of the audit convicts.

A verdict with `passed = False`, signed by a key that may judge (admission has checked
that), names a rollout and its producer. It is the announcement of fraud evidence: the
evidence itself is the rollout record, which the producer signed and which any peer pulls
by its id like any other body (gossip carries only the small signed verdict; a 4 MiB
record would not fit GossipSub's ~1 MB cap). A peer that can audit re-runs
`verify.audit` on the record with its own model of the claimed version, then:

    the audit fails too   -> the producer pays `FRAUD_PENALTY` (ban: the record is its
                             own signed work and the check is deterministic)
    the audit passes      -> every key that failed the rollout pays `FALSE_ACCUSATION`
    no record, or no model of its version, before `case_ttl_s`
                          -> the case is dropped; nobody pays (our lack is no evidence)

Who pays: only signers, for what they signed: the producer for its record, a validator
for its verdict. A relay that forwards either never pays here. A producer is convicted
once per rollout; a rollout is judged once.

Bounds, so that accusations cannot be turned into a flood of audits: at most
`max_open` cases at once and `max_open_per_accuser` per accusing key (further
accusations are ignored, free), and each case expires after `case_ttl_s`. Time is passed
in; `FraudCases` does no I/O: it returns actions for the node to carry out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from protocol import penalties

FRAUD_PENALTY = penalties.FRAUD.cost  # bans from any score (max 100, ban below -100)
FALSE_ACCUSATION = penalties.FALSE_ACCUSATION.cost  # as much as a failed audit costs a producer


@dataclass(frozen=True, slots=True)
class FraudConfig:
    """Bounds of the open fraud cases."""

    max_open: int = 256
    max_open_per_accuser: int = 32
    case_ttl_s: float = 120.0
    remember: int = 4096  # judged rollout ids kept, so a rollout is judged once

    def __post_init__(self) -> None:
        if self.max_open < 1 or self.max_open_per_accuser < 1 or self.remember < 1:
            raise ValueError(
                "FraudConfig: max_open, max_open_per_accuser and remember must be >= 1"
            )
        if self.case_ttl_s <= 0:
            raise ValueError("FraudConfig.case_ttl_s must be > 0")


# -- actions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NeedRecord:
    """Get the record of `rollout_id` (the store, else a pull from `sources`), then call
    `FraudCases.record_held`."""

    rollout_id: bytes
    sources: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Audit:
    """Audit the held record of `rollout_id`, then call `FraudCases.audited`."""

    rollout_id: bytes


@dataclass(frozen=True, slots=True)
class Punish:
    """Score `peer` (a signer: the producer or an accuser) down by `penalty`."""

    peer: bytes
    penalty: float
    reason: str
    offence: str  # its name in `protocol.penalties`


Action = NeedRecord | Audit | Punish


# -- state ------------------------------------------------------------------------------


@dataclass
class _Case:
    producer: bytes
    opened_at: float
    accusers: list[tuple[bytes, str]] = field(default_factory=list)  # (key, reason)
    record: bool = False
    auditing: bool = False


class FraudCases:
    """Open fraud cases of one peer (see the module docstring)."""

    def __init__(self, config: FraudConfig | None = None) -> None:
        self.config = config or FraudConfig()
        self.cases: OrderedDict[bytes, _Case] = OrderedDict()
        self.judged: OrderedDict[bytes, bool] = OrderedDict()  # rollout id -> convicted
        self.counts = {"opened": 0, "convicted": 0, "acquitted": 0, "expired": 0, "ignored": 0}

    def _open_by(self, accuser: bytes) -> int:
        return sum(any(a == accuser for a, _ in c.accusers) for c in self.cases.values())

    def accused(
        self,
        rollout_id: bytes,
        producer: bytes,
        accuser: bytes,
        reason: str,
        now: float,
        record_held: bool = False,
    ) -> list[Action]:
        """A failed verdict on `rollout_id` signed by `accuser` (a key that may judge)."""
        if accuser == producer:
            return []  # admission refuses verdicts on one's own work; never a case
        if rollout_id in self.judged:
            if not self.judged[rollout_id]:
                return [
                    Punish(
                        accuser, FALSE_ACCUSATION, f"false accusation: {reason}", "false_accusation"
                    )
                ]
            return []  # already convicted: nothing more to learn
        case = self.cases.get(rollout_id)
        if case is not None:
            if case.producer != producer:
                return []  # names another producer than the first accuser: no case of ours
            if all(a != accuser for a, _ in case.accusers):
                if self._open_by(accuser) >= self.config.max_open_per_accuser:
                    self.counts["ignored"] += 1
                    return []
                case.accusers.append((accuser, reason))
            return []
        if (
            len(self.cases) >= self.config.max_open
            or self._open_by(accuser) >= self.config.max_open_per_accuser
        ):
            self.counts["ignored"] += 1
            return []
        case = self.cases[rollout_id] = _Case(producer, now, [(accuser, reason)])
        self.counts["opened"] += 1
        if record_held:
            return self.record_held(rollout_id, now)
        return [NeedRecord(rollout_id, (producer, accuser))]

    def record_held(self, rollout_id: bytes, now: float) -> list[Action]:
        """The record of an open case is here (or arrived)."""
        case = self.cases.get(rollout_id)
        if case is None or case.auditing:
            return []
        case.record = case.auditing = True
        return [Audit(rollout_id)]

    def audited(self, rollout_id: bytes, passed: bool, reason: str, now: float) -> list[Action]:
        """Our own audit of `rollout_id` (asked for by `Audit`, or our own sample) decided;
        remembered, so that an accusation arriving later is judged at once."""
        self._remember(rollout_id, not passed)
        case = self.cases.pop(rollout_id, None)
        if case is None:
            return []
        if not passed:
            self.counts["convicted"] += 1
            return [Punish(case.producer, FRAUD_PENALTY, f"fraud reproduced: {reason}", "fraud")]
        self.counts["acquitted"] += 1
        return [
            Punish(
                key,
                FALSE_ACCUSATION,
                f"false accusation: {why} (our audit passed)",
                "false_accusation",
            )
            for key, why in case.accusers
        ]

    def cannot_judge(self, rollout_id: bytes) -> list[Action]:
        """We cannot audit this rollout (its version's weights are not ours): drop, no blame."""
        self.cases.pop(rollout_id, None)
        return []

    def tick(self, now: float) -> list[Action]:
        """Drop cases older than `case_ttl_s` (3x that once their audit started); nobody
        pays."""
        ttl = self.config.case_ttl_s
        for rid in [
            rid
            for rid, c in self.cases.items()
            if now - c.opened_at > (3 * ttl if c.auditing else ttl)
        ]:
            del self.cases[rid]
            self.counts["expired"] += 1
        return []

    def is_open(self, rollout_id: bytes) -> bool:
        """Whether a fraud case about `rollout_id` is open."""
        return rollout_id in self.cases

    def _remember(self, rollout_id: bytes, convicted: bool) -> None:
        self.judged[rollout_id] = convicted
        while len(self.judged) > self.config.remember:
            self.judged.popitem(last=False)
