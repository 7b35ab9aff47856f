"""Plain on-policy GRPO in one process: the reference a swarm's learning is compared with.

`SingleLearner` generates rollouts as an inference worker does (`trainer.produce.
generate_batch`: tasks from `trainer.tasks.assign_task` for one producer and consecutive
counters at the current policy version, the run's sampling settings, batches of
`batch_size`) and trains on them as the trainer role does (re-scored, solved-or-not
`trainer.samples.Sample`s queued in a `trainer.train_loop.Trainer` built from the same
manifest, one step whenever `groups_per_step` groups are ready), in turn, on the same
cores. No records, signatures, proofs, network or audits: every rollout is sampled by the
weights being trained, and every one is trained on.
"""

from __future__ import annotations

import time
from typing import Any

from trainer.engine import SamplingSettings
from trainer.engine_hf import HFEngine, torch_threads
from trainer.produce import DEFAULT_BATCH_SIZE, Tally, generate_batch
from trainer.samples import Sample
from trainer.tasks import PartialCreditLog, TaskSet, assign_task
from trainer.train_loop import Trainer

PRODUCER = b"single-learner"  # the producer id its tasks are derived for


class SingleLearner:
    """One model, one `Trainer`, one engine on that same model (module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        manifest: Any,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        threads: int | None = None,
        producer: bytes = PRODUCER,
    ) -> None:
        self.manifest, self.tokenizer, self.producer = manifest, tokenizer, producer
        self.batch_size, self.threads = batch_size, threads
        self.trainer = Trainer.from_manifest(model, tokenizer, manifest)
        self.engine = HFEngine(model, tokenizer, max_batch=batch_size, threads=threads)
        self.settings = SamplingSettings.from_manifest(manifest)
        self.tasks = TaskSet(manifest.seed)
        self.credit = PartialCreditLog()
        self.tally = Tally()
        self.counter = 0  # the next rollout's counter

    def samples(self, n: int) -> list[Sample]:
        """The next `n` rollouts, sampled by the current weights at the current version."""
        version = self.trainer.version
        counters = range(self.counter, self.counter + n)
        self.counter += n
        assignments = [assign_task(self.manifest, self.producer, c) for c in counters]
        _gens, items = generate_batch(
            self.engine, self.tasks, self.credit, assignments, self.settings, False, self.tally
        )
        return [
            Sample(
                prompt_ids=tuple(prompt),
                completion_ids=tuple(int(t) for t in g.completion_ids),
                sampler_logprobs=tuple(float(x) for x in g.logprobs),
                temperature=self.settings.temperature,
                version=version,
                group=(self.producer, version, a.group),
                reward=1.0 if reward >= 1.0 else 0.0,
                score=reward,
            )
            for a, prompt, g, reward in items
        ]

    def turn(self) -> int:
        """Generate one batch, queue it and take every step it makes ready; returns the
        steps taken."""
        with torch_threads(self.threads):
            for s in self.samples(self.batch_size):
                self.trainer.add(s)
            steps = 0
            while self.trainer.step() is not None:
                steps += 1
        return steps

    def run_for(self, seconds: float) -> dict[str, Any]:
        """Turns until `seconds` have passed (the turn under way finishes); a summary."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.turn()
        t = self.trainer
        return {
            "seconds": round(time.perf_counter() - t0, 1),
            "rollouts": self.counter,
            "steps": t.steps,
            "groups_trained": t.groups_trained,
            "groups_flat_dropped": t.groups_flat,
            "policy_version": t.version,
        }
