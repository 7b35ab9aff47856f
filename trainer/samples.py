"""Training samples: an opened rollout re-scored from its task, or refused with a reason.

The trainer never trusts the reward a worker claims. `Rescorer.sample` re-derives the
task from (run seed, producer, counter), checks the header and the prompt
against it, decodes the completion and scores it with the dataset's scorer. A claimed
reward that differs from the re-scored one (beyond `REWARD_TOLERANCE`) refuses the rollout
(`claimed-reward-mismatch`): a producer that lies about rewards gets none of its rollouts
trained on, whatever a validator said.

The reward trained on is solved-or-not (`1.0` when the scorer gives full marks, else
`0.0`): partial credit from substring scorers was gamed at high learning rates
(docs/DESIGN.md §5), so it is recorded (`score`) but not trained on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from protocol.rollout import OpenedRollout
from trainer.tasks import TaskError, TaskSet, assign_task

REWARD_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class Sample:
    """One rollout ready for the loss."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    temperature: float
    version: int  # policy version that sampled it
    group: tuple[bytes, int, int]  # (producer, version, group index): one task's GRPO group
    reward: float  # solved-or-not, re-scored
    score: float  # the scorer's raw reward (may be partial credit)
    rollout_id: bytes = b""


class Refused(ValueError):
    """A rollout the trainer will not train on; `reason` is a short tag, str(self) a line."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Rescorer:
    """Re-derives tasks and re-scores completions for one run (caches prompt encodings)."""

    def __init__(self, manifest: Any, tokenizer: Any) -> None:
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.tasks = TaskSet(manifest.seed)
        self._encode = functools.lru_cache(maxsize=4096)(self._encode_prompt)

    def _encode_prompt(self, prompt: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(prompt, add_special_tokens=False))

    def rescore(self, ro: OpenedRollout) -> float:
        """The scorer's reward of a rollout's completion for its assigned task (whatever
        its header claims), or `Refused` when the rollout is not of its assigned task."""
        return self._score(ro)[1]

    def _score(self, ro: OpenedRollout) -> tuple[Any, float]:
        m, env, header, body = self.manifest, ro.envelope, ro.header, ro.body
        if env.run_id != m.run_id:
            raise Refused("wrong-run", f"run id {env.run_id!r} is not {m.run_id!r}")
        try:
            a = assign_task(m, env.signer, header.counter)
            task = self.tasks.task_for(a)
        except TaskError as exc:
            raise Refused("task-underivable", str(exc)) from None
        for name in ("dataset", "task_index", "task_seed"):
            if getattr(header, name) != getattr(a, name):
                raise Refused("task-mismatch", f"header {name} is not the assigned one")
        if tuple(body.prompt_ids) != self._encode(task.prompt):
            raise Refused("task-mismatch", "prompt is not the assigned task's")
        if not body.completion_ids:
            raise Refused("empty", "no completion tokens")
        text = self.tokenizer.decode(list(body.completion_ids), skip_special_tokens=True)
        return a, self.tasks.score(task, text).reward

    def sample(self, ro: OpenedRollout) -> Sample:
        """The training sample of a rollout, or `Refused`."""
        env, header, body = ro.envelope, ro.header, ro.body
        a, score = self._score(ro)
        if abs(score - header.reward) > REWARD_TOLERANCE:
            raise Refused(
                "claimed-reward-mismatch",
                f"claimed {header.reward:.4f}, re-scored {score:.4f}",
            )
        return Sample(
            prompt_ids=tuple(body.prompt_ids),
            completion_ids=tuple(body.completion_ids),
            sampler_logprobs=tuple(body.logprobs),
            temperature=body.temperature,
            version=env.policy_version,
            group=(bytes(env.signer), env.policy_version, a.group),
            reward=1.0 if score >= 1.0 else 0.0,
            score=score,
            rollout_id=ro.rollout_id,
        )
