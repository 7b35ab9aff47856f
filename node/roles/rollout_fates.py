"""Where a swarm's rollouts went: trained on, or why not.

The trainer role counts what became of the rollouts it heard of (`Fates`, in its status
under `fates`); `shares` sets those counts against the workers' produced count, each
rollout in exactly one of:

- `trained`: in a group a training step took (a flat group included: it carries no
  gradient, and any GRPO learner drops it, the single-process one too);
- `stale`: refused for staleness by the trainer: at admission (too stale to admit), while
  it waited for its verdict, when queued (`Trainer.add`) or while its group waited
  (`Trainer.step`);
- `unverified`: still waiting for a verdict when the run stopped, or dropped unverified
  from a full waiting list;
- `incomplete_group`: verified and queued, its group never complete enough to train;
- `other`: the rest: never reached the trainer, rejected by an audit, refused for another
  reason (re-scoring, work accounting), or in a complete group no step had taken yet.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

KINDS = ("trained", "stale", "unverified", "incomplete_group", "other")
MAX_LATE = 100_000  # rollout ids remembered as refused too stale at admission


class Fates:
    """The trainer role's own counts; `counts` adds what its `Trainer` and waiting list
    hold."""

    def __init__(self) -> None:
        self.late: OrderedDict[bytes, None] = OrderedDict()  # a rollout's copies count once
        self.stale_waiting = 0
        self.unverified_dropped = 0

    def on_late(self, rollout_id: bytes) -> None:
        """`rollout_id` was refused as too stale at admission (counted once)."""
        self.late[rollout_id] = None
        if len(self.late) > MAX_LATE:
            self.late.popitem(last=False)

    def counts(self, trainer: Any, waiting: Any) -> dict[str, int]:
        """Rollouts trained, refused stale, unverified and in incomplete groups so far;
        `trainer` is the role's `trainer.train_loop.Trainer`, `waiting` its rollouts
        waiting for verdicts."""
        return {
            "trained": trainer.rollouts_trained,
            "stale": trainer.refused["stale"] + self.stale_waiting + len(self.late),
            "unverified": len(waiting) + self.unverified_dropped,
            "incomplete_group": sum(len(g) for g in trainer.pending.values()),
        }


def shares(produced: int, counts: dict[str, int]) -> dict[str, Any]:
    """Each kind's count and share of `produced`; `other` is what the trainer's counts do
    not explain. Raises ValueError when they explain more than was produced (a rollout
    counted twice, or counts from another run)."""
    known = {k: int(counts.get(k, 0)) for k in KINDS[:-1]}
    other = produced - sum(known.values())
    if produced < 0 or other < 0:
        raise ValueError(
            f"the trainer accounts for {sum(known.values())} rollouts, {produced} were produced"
        )
    out: dict[str, Any] = {"produced": produced, "counts": {**known, "other": other}}
    for k, n in out["counts"].items():
        out[k] = round(n / produced, 4) if produced else None
    return out
