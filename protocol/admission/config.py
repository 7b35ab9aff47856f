"""What admission is told: the run's rules (`RunRules`) and its own limits (`AdmissionConfig`).

Both are frozen and validate themselves when built (`LocalProtocolError`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol import penalties as offences
from protocol.admission.vocabulary import PENALTIES, Reason
from protocol.errors import LocalProtocolError
from protocol.wire import RunManifest

__all__ = ["AdmissionConfig", "RunRules"]


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
        """The rules a run manifest sets."""
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
