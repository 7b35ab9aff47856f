"""The audit's task judge: a rollout's assignment re-derived and its reward re-scored.

`verify.auditor` checks proofs, sampling and termination; what a rollout was asked and
what it earned are the tasks' business (`trainer.tasks`), so the judge lives here and is
handed to the auditor (`audit_records(..., judge=...)`) by `swarm-node audit`, the
validator role and `bench verify`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trainer.tasks import TaskError, TaskSet, assign_task
from verify.auditor import TaskJudgement


def make_judge(manifest: Any, tokenizer: Any) -> Callable[[Any], Any]:
    """A task judge for `verify.audit_records`: re-derives the assignment of a rollout from
    (run seed, producer, counter), checks header and prompt against it,
    and re-scores the decoded completion with the dataset's scorer."""
    tasks = TaskSet(manifest.seed)

    @functools.lru_cache(maxsize=4096)
    def encode_prompt(prompt: str) -> tuple[int, ...]:
        # Tasks repeat (small task pools, GRPO groups): encode each distinct prompt once.
        return tuple(tokenizer.encode(prompt, add_special_tokens=False))

    def judge(ro: Any) -> TaskJudgement:
        env, header, body = ro.envelope, ro.header, ro.body
        if env.run_id != manifest.run_id:
            return TaskJudgement(f"run id {env.run_id!r} is not {manifest.run_id!r}", None)
        try:
            a = assign_task(manifest, env.signer, header.counter)
            task = tasks.task_for(a)
        except TaskError as exc:
            return TaskJudgement(f"task cannot be derived: {exc}", None)
        for name in ("dataset", "task_index", "task_seed"):
            if getattr(header, name) != getattr(a, name):
                return TaskJudgement(
                    f"header {name} {getattr(header, name)!r} is not the assigned {getattr(a, name)!r}",
                    None,
                )
        prompt = encode_prompt(task.prompt)
        text = tokenizer.decode(list(body.completion_ids), skip_special_tokens=True)
        reward = tasks.score(task, text).reward
        if prompt != tuple(body.prompt_ids):
            return TaskJudgement("prompt is not the assigned task's", reward)
        return TaskJudgement(None, reward)

    return judge
