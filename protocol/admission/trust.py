"""Trust: who pays for a refusal, how much, and what a producer's verified record earns.

`Trust` turns a stage's `Refused` into the actions of its cost (the relay rule, repeats that
double, the allowance of blameless waste, the signer of provable faults, bans), and charges
the findings of roles; `Standing` counts passing verdicts about a producer's work, which
raise its signer rate; `Repeats` counts recent offences. Pure; time passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from protocol import penalties as offences
from protocol.admission.config import AdmissionConfig
from protocol.admission.inflight import Refused, as_peer_form, relaying, same_peer
from protocol.admission.messages import (
    Action,
    Ban,
    BodyMissing,
    Disconnect,
    Misbehaved,
    Penalized,
    Reject,
)
from protocol.admission.quota import RateLimiter
from protocol.admission.vocabulary import RELAY_BLAMED, REPEATS_DOUBLE, Kind, Reason, Stage
from protocol.errors import LocalProtocolError
from protocol.peer_score import PeerId, PeerScores

__all__ = ["REASON_NAMES", "Repeats", "Standing", "Trust"]

REASON_NAMES = frozenset(str(r) for r in Reason)


class Repeats:
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


class Standing:
    """A producer's verified standing: passing verdicts of authorized validators about its
    work (admitted here), back to none on a failing one. At most `max_rate_keys` producers."""

    def __init__(self, cfg: AdmissionConfig) -> None:
        self._cfg = cfg
        self._passes: OrderedDict[bytes, int] = OrderedDict()  # producer -> passes

    def signer_rate_factor(self, signer: bytes) -> float:
        """How many times `signer_rate` (and burst) this producer may publish: 1 plus one per
        `standing_passes_per_step` passing verdicts about its work, at most
        `signer_rate_max_factor`. A worker paces itself by its own view of this."""
        cfg = self._cfg
        passes = self._passes.get(bytes(signer), 0)
        return min(cfg.signer_rate_max_factor, 1.0 + passes // cfg.standing_passes_per_step)

    def note_verdict(self, producer: bytes, passed: bool) -> None:
        """An authorized validator's admitted verdict: a pass adds to the producer's
        standing, a fail takes it back to none."""
        standing = self._passes
        producer = bytes(producer)
        standing[producer] = standing.get(producer, 0) + 1 if passed else 0
        standing.move_to_end(producer)
        if len(standing) > self._cfg.max_rate_keys:
            standing.popitem(last=False)


class Trust:
    """Who pays, and the score changes that follow (`scores`, with bans)."""

    def __init__(self, cfg: AdmissionConfig, scores: PeerScores) -> None:
        self.config = cfg
        self.scores = scores
        # (peer, reason) -> recent offences, for the reasons whose cost doubles on repeat
        self._repeats = Repeats(cfg.repeat_window_s, cfg.max_rate_keys)
        self._waste = RateLimiter(cfg.waste_rate, cfg.waste_burst, cfg.max_rate_keys)

    def reject(
        self,
        peer: PeerId,
        r: Refused,
        kind: str,
        now: float,
        repeat: bool = False,
        origin: PeerId | None = None,
    ) -> list[Action]:
        """The actions of a refusal of `peer`'s message: the `Reject` with its cost, the
        score change (and any ban), the signer's charge for a provable fault it signed,
        and the question the sender may answer (`r.ask`). `repeat`: `peer` handed us
        this copy before."""
        relayed = r.signer is not None and relaying(peer, origin, r.signer)
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
        actions.extend(self.apply_score(peer, penalty, reason, now))
        if r.blame_signer and r.signer is not None and not same_peer(peer, r.signer):
            # The signer is provably at fault (it signed both): it pays whoever relayed it.
            signer = as_peer_form(peer, r.signer)
            cost = self.config.penalties[r.reason]
            actions += self.charge(signer, cost, str(r.reason), str(r.stage), r.detail, now, kind)
        if r.ask is not None:
            actions.append(r.ask)
        return actions

    def misbehaved(self, ev: Misbehaved) -> list[Action]:
        """Charge a role's finding (its cost doubles on repeat if its offence's does)."""
        if not (math.isfinite(ev.penalty) and ev.penalty <= 0):
            raise LocalProtocolError("Misbehaved.penalty is a score change <= 0")
        name = ev.offence or str(Reason.MISBEHAVED)
        if name not in offences.BY_NAME:
            raise LocalProtocolError(f"Misbehaved.offence {name!r} is not in protocol.penalties")
        penalty = ev.penalty
        if penalty < 0 and offences.BY_NAME[name].repeats:
            penalty = offences.repeat_cost(penalty, self._repeats.count(ev.peer, name, ev.now))
        return self.charge(ev.peer, penalty, name, "role", ev.reason, ev.now)

    def body_missing(self, ev: BodyMissing) -> list[Action]:
        """Nobody served the body of an admitted header: its signer signed a promise it
        did not keep, and its sender passed it on (both pay a little; honest peers that
        crashed lose far less than a flood of body-less headers costs). Pulls that only
        failed to connect are no evidence: nobody pays."""
        if ev.answered <= 0:
            return []
        detail = f"rollout {ev.rollout_id.hex()[:16]}: no source served its body"
        actions = self.charge(
            as_peer_form(ev.sender, ev.signer),
            self.config.penalties[Reason.BODY_MISSING],
            str(Reason.BODY_MISSING),
            "body_pull",
            detail,
            ev.now,
            str(Kind.ROLLOUT_HEADER),
        )
        if not same_peer(ev.sender, ev.signer):
            actions += self.charge(
                ev.sender,
                self.config.body_missing_sender,
                offences.BODY_MISSING_RELAYED.name,
                "body_pull",
                detail,
                ev.now,
                str(Kind.ROLLOUT_HEADER),
            )
        return actions

    def unbacked(self, peer: PeerId, shown: int | None, now: float) -> list[Action]:
        """`peer` did not back the future version it handed us (`protocol.version_claims`)."""
        penalty = self.config.penalties[Reason.UNBACKED_VERSION]
        detail = f"newest manifest shown: {shown}"
        return [
            Reject(peer, Reason.UNBACKED_VERSION, penalty, Stage.CONTEXT, detail),
            *self.apply_score(peer, penalty, Reason.UNBACKED_VERSION, now),
        ]

    def charge(
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
        reason = Reason(name) if name in REASON_NAMES else Reason.MISBEHAVED
        return [
            Penalized(peer, name, delta, stage, detail, kind),
            *self.apply_score(peer, delta, reason, now),
        ]

    def apply_score(self, peer: PeerId, delta: float, reason: Reason, now: float) -> list[Action]:
        """Change `peer`'s score by `delta`; `Disconnect` + `Ban` if that bans it."""
        if delta == 0:
            return []
        change = self.scores.adjust(peer, delta, now)
        if change.banned_until is None:
            return []
        record = self.scores.record(peer, now)
        assert record is not None
        return [Disconnect(peer, reason), Ban(peer, change.banned_until, record)]
