"""Validators held to account at the trainer: pass rates, agreement with re-audits, flags.

`protocol.verified.judge` makes every decision wait for a second judge when the run has
one (a failing verdict is re-audited by the other validators, which publish what their
re-audit found; `node.roles.validator`). Once a rollout is decided that way, every vote
on it either agreed with the decision or not. `JudgeBook` keeps, per validator key:

    verdicts, passes      how many of its verdicts the trainer heard, how many passed
                          (its pass rate, compared with the others' in `summary`)
    agreed, disagreed     its votes on decided rollouts that matched the decision or not

and charges a disagreement as it is found (`Charge`): a failing verdict that the re-audits
overturned costs `penalties.FALSE_ACCUSATION`, a pass of a rollout the re-audits rejected
`penalties.MISBEHAVED`. A validator with at least `flag_min` disagreements that make up at
least `flag_rate` of its decided votes is *flagged*: its votes count for nothing at this
trainer from then on (`flagged_keys`, passed to `judge` as `ignore`), and it is charged
`penalties.MISBEHAVED` once more. An honest validator disagrees only where its audit
differs from another honest one's, which the false-positive rate of the audit bounds far
below `flag_rate` (`docs/DESIGN.md`).

Producer claims follow the same rule: a claim bans a producer only when `need` distinct
judges claimed it (`claimed`); until then the producer is a *suspect*, whose records
train only with their own confirmed pass (`suspect`).

Pure: no IO, bounded (`max_keys` judges, `max_decided` decided rollouts remembered).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from protocol import penalties
from protocol.verified import Vote

__all__ = ["FLAG_MIN", "FLAG_RATE", "Charge", "JudgeBook"]

FLAG_MIN = 4
FLAG_RATE = 0.05


@dataclass(frozen=True, slots=True)
class Charge:
    """Charge `judge` `penalty` (a score change <= 0) for `reason` (`offence`: its name in
    `protocol.penalties`)."""

    judge: bytes
    penalty: float
    reason: str
    offence: str


@dataclass(slots=True)
class _Tally:
    verdicts: int = 0
    passes: int = 0
    agreed: int = 0
    disagreed: int = 0
    flagged: bool = False


class JudgeBook:
    """The trainer's record of its validators (module docstring)."""

    def __init__(
        self,
        flag_min: int = FLAG_MIN,
        flag_rate: float = FLAG_RATE,
        max_keys: int = 4096,
        max_decided: int = 100_000,
    ) -> None:
        if flag_min < 1 or not 0 < flag_rate <= 1 or max_keys < 1 or max_decided < 1:
            raise ValueError("JudgeBook: flag_min, max_keys, max_decided >= 1; 0 < flag_rate <= 1")
        self.flag_min, self.flag_rate = flag_min, flag_rate
        self.max_keys, self.max_decided = max_keys, max_decided
        self._tally: OrderedDict[bytes, _Tally] = OrderedDict()
        # rollout id -> (decision, the judges whose vote on it was counted)
        self._decided: OrderedDict[bytes, tuple[bool, set[bytes]]] = OrderedDict()
        self._claims: OrderedDict[bytes, set[bytes]] = OrderedDict()  # producer -> claimers
        self._flagged: frozenset[bytes] = frozenset()

    def _get(self, judge: bytes) -> _Tally:
        t = self._tally.get(judge)
        if t is None:
            t = self._tally[judge] = _Tally()
            while len(self._tally) > self.max_keys:
                self._tally.popitem(last=False)
            self._flagged = frozenset(k for k, t in self._tally.items() if t.flagged)
        return t

    def voted(self, judge: bytes, passed: bool) -> None:
        """A verdict of `judge` was heard (its pass rate)."""
        t = self._get(judge)
        t.verdicts += 1
        t.passes += bool(passed)

    def decided(self, rollout_id: bytes, passed: bool, votes: Iterable[Vote]) -> list[Charge]:
        """`rollout_id` is decided (`passed`, confirmed by `need` judges), or a vote came on
        one decided before (call again with all its votes): each vote not seen yet is
        compared with the decision; returns the charges of those that disagree."""
        entry = self._decided.get(rollout_id)
        if entry is None:
            entry = self._decided[rollout_id] = (bool(passed), set())
            while len(self._decided) > self.max_decided:
                self._decided.popitem(last=False)
        decision, seen = entry
        charges: list[Charge] = []
        for v in votes:
            if v.signer in seen:
                continue
            seen.add(v.signer)
            t = self._get(v.signer)
            if v.passed == decision:
                t.agreed += 1
                continue
            t.disagreed += 1
            if v.passed:
                charges.append(
                    Charge(
                        v.signer,
                        penalties.MISBEHAVED.cost,
                        "passed a rollout the re-audits rejected",
                        penalties.MISBEHAVED.name,
                    )
                )
            else:
                charges.append(
                    Charge(
                        v.signer,
                        penalties.FALSE_ACCUSATION.cost,
                        "failed a rollout the re-audits passed",
                        penalties.FALSE_ACCUSATION.name,
                    )
                )
            if not t.flagged and self._over(t):
                t.flagged = True
                self._flagged = self._flagged | {v.signer}
                charges.append(
                    Charge(
                        v.signer,
                        penalties.MISBEHAVED.cost,
                        f"verdicts disagree with re-audits ({t.disagreed} of "
                        f"{t.agreed + t.disagreed}): flagged, its votes no longer count here",
                        penalties.MISBEHAVED.name,
                    )
                )
        return charges

    def _over(self, t: _Tally) -> bool:
        n = t.agreed + t.disagreed
        return t.disagreed >= self.flag_min and t.disagreed >= self.flag_rate * n

    def is_decided(self, rollout_id: bytes) -> bool:
        """Whether `rollout_id` was decided (`decided`)."""
        return rollout_id in self._decided

    def flagged(self, judge: bytes) -> bool:
        """Whether `judge`'s verdicts disagreed with re-audits past the flag."""
        t = self._tally.get(judge)
        return t is not None and t.flagged

    def flagged_keys(self) -> frozenset[bytes]:
        """The flagged judges (their votes count for nothing here)."""
        return self._flagged

    def claimed(self, producer: bytes, judge: bytes, need: int) -> bool:
        """A producer claim of `judge`: True once `need` distinct judges claimed `producer`
        (ban it); until then it is a suspect."""
        claimers = self._claims.setdefault(producer, set())
        self._claims.move_to_end(producer)
        claimers.add(judge)
        while len(self._claims) > self.max_keys:
            self._claims.popitem(last=False)
        return len(claimers) >= need

    def suspect(self, producer: bytes) -> bool:
        """Whether a claim names `producer` that is not confirmed yet."""
        return bool(self._claims.get(producer))

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per judge (hex, last 12): verdicts, pass rate, agreement with decided rollouts,
        flagged."""
        out = {}
        for k, t in self._tally.items():
            n = t.agreed + t.disagreed
            out[k.hex()[-12:]] = {
                "verdicts": t.verdicts,
                "pass_rate": round(t.passes / t.verdicts, 4) if t.verdicts else None,
                "agreement": round(t.agreed / n, 4) if n else None,
                "disagreed": t.disagreed,
                "flagged": t.flagged,
            }
        return out
