"""Local training, SAPO style: a peer trains its own copy on I own + J swarm groups a round.

The copy is separate from the policy the peer generates the run's rollouts with (those
must stay the run's published version, or audits would fail), so every group trained on
is off-policy for the copy: importance weights against the sampler's recorded log-probs
(truncated at the run's `is_bound`) correct for that, for own and foreign groups alike.
It never publishes: no publish callback exists here and the version never moves.

`LocalTrainer.offer(sample, own)` collects re-scored samples into groups; `round()` trains
one step on I own + J foreign complete groups when both are available (oldest first) and
returns its statistics, else None. Synchronous: the inference role calls it in a thread.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

from trainer.loss import LossSettings
from trainer.samples import Sample
from trainer.train_loop import Trainer

MAX_QUEUED_GROUPS = 256  # per side; the oldest are dropped first


class LocalTrainer:
    """A peer's own copy of the policy, trained on I own + J foreign groups a round (module
    docstring)."""

    def __init__(self, model: Any, tokenizer: Any, manifest: Any, own: int, foreign: int) -> None:
        if own < 0 or foreign < 0 or own + foreign < 1:
            raise ValueError(
                f"--local-train I:J needs I, J >= 0 and I + J >= 1, got {own}:{foreign}"
            )
        self.own, self.foreign = own, foreign
        self.model = copy.deepcopy(model)  # the peer's own copy, never the generating policy
        self.trainer = Trainer(
            self.model,
            tokenizer,
            group_size=manifest.group_size,
            max_staleness=None,
            loss=LossSettings.from_manifest(manifest),
            lr=manifest.rl_lr,
            groups_per_step=own + foreign,
            publish_every=2**62,
        )
        self.group_size = manifest.group_size
        self._partial: dict[tuple[bytes, int, int], list[Sample]] = {}
        self.queues: dict[bool, deque[list[Sample]]] = {
            True: deque(maxlen=MAX_QUEUED_GROUPS),
            False: deque(maxlen=MAX_QUEUED_GROUPS),
        }
        self.rounds = 0

    def offer(self, sample: Sample, own: bool) -> None:
        """Add a re-scored sample; a group that is complete joins its side's queue."""
        group = self._partial.setdefault(sample.group, [])
        group.append(sample)
        if len(group) >= self.group_size:
            self.queues[own].append(self._partial.pop(sample.group))
        if len(self._partial) > 4 * MAX_QUEUED_GROUPS:
            self._partial.pop(next(iter(self._partial)))

    def round(self) -> dict[str, float] | None:
        """One training step on I own + J foreign groups, oldest first; None while either side lacks
        groups."""
        mine, theirs = self.queues[True], self.queues[False]
        if len(mine) < self.own or len(theirs) < self.foreign:
            return None
        groups = [mine.popleft() for _ in range(self.own)]
        groups += [theirs.popleft() for _ in range(self.foreign)]
        self.rounds += 1
        return self.trainer.train_on(groups)
