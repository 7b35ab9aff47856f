"""The training loop: groups of re-scored rollouts in, AdamW steps, policy versions out.

Plain on purpose (nanoGPT-style). One `Trainer` holds the model, its AdamW state, the
current policy version and the groups waiting to be trained on:

1. `add(sample)`: a re-scored `trainer.samples.Sample` joins its GRPO group (same
   producer, version and group index); a group is ready when complete, or via
   `flush_partial` when it has waited long enough with at least two members. Refused, with a reason, when it is stale: made with
   version v while the trainer is at t and t − v > S (the run's `max_staleness`), or from a
   version the trainer has not reached. Groups go stale while they wait too; `step` drops
   those (counted under `refused["stale"]`).
2. `step()`: once `groups_per_step` complete groups are ready, their advantages are computed
   (`trainer.loss.group_advantages`; flat groups dropped and counted), log-probs of the
   completions under the current policy come from micro-batched forward passes
   (`trainer.micro_step`: LM head at completion positions only, in row chunks), and
   `policy_loss` with the sampler's recorded log-probs as π_s, its gradients accumulated
   over the micro-batches, gives one AdamW step (gradient norm clipped to 1). One step per batch, so π_old is the current policy detached (ρ = 1 at the step).
3. Every `publish_every` consumed groups the version goes up by one: the checkpoint
   (weights, optimiser state, version) is written first, atomically, then `publish(v, model)`
   is called. A restarted trainer (`Trainer(..., ckpt_dir=...)`) resumes at the version of its
   last checkpoint, so it never hands out a version number twice for different weights.

`train_on(groups)` is step 2 for a caller that picks its own groups (SAPO-style local
training: I own + J foreign groups per round, no staleness rule, no publishing).
Model work here is synchronous; callers on a trio loop run it in a thread.

On several ranks (`ranks`, `trainer.distributed`): every rank builds a `Trainer`; rank 0's
`train_on` first sends the groups to the others (`trainer.follower` runs theirs), each rank
backpropagates its share of the micro-batches through DDP, the loss and statistics are
summed over the ranks, and every rank clips and steps the same gradients. Only rank 0
checkpoints and publishes; the others start from its weights and AdamW state.
"""

from __future__ import annotations

import os
import resource
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer.distributed import CHECK, STOP, TRAIN, Ranks
from trainer.loss import LossSettings, group_advantages
from trainer.micro_step import (
    CompletionLogprobs,
    StepSettings,
    accumulate_gradients,
    autocast_wanted,
    completion_token_logprobs,
    frozen_copy,
)
from trainer.samples import Sample

CKPT_FILE = "trainer_state.pt"
GRAD_CLIP = 1.0
WEIGHT_DECAY = 0.0
BETAS = (0.9, 0.99)

Publish = Callable[[int, Any], None]


def completion_logprobs(
    model: Any, samples: Sequence[Sample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (B, T), mask (B, T)) of each sample's completion tokens under `model` at
    each sample's sampling temperature, the LM head applied at completion positions only
    (`trainer.micro_step.completion_token_logprobs`)."""
    return completion_token_logprobs(model, samples, pad_id)


class Trainer:
    """Model + AdamW + version + waiting groups (module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        group_size: int,
        max_staleness: int | None,
        loss: LossSettings,
        lr: float,
        groups_per_step: int,
        publish_every: int,
        version: int = 0,
        ckpt_dir: str | os.PathLike[str] | None = None,
        publish: Publish | None = None,
        step_settings: StepSettings | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        self.model = model
        self.step_settings = step_settings if step_settings is not None else StepSettings()
        self.ranks = ranks
        if ranks is not None:
            ranks.sync_module(model)  # every rank starts from rank 0's weights
        # π_ref of the KL term: the weights this trainer was given, before any resume
        self.ref_model = frozen_copy(model) if loss.kl_coef > 0 else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.loss = loss
        self.groups_per_step = groups_per_step
        self.publish_every = publish_every
        self.publish = publish
        self.version = version
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.opt = torch.optim.AdamW(
            model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY, betas=BETAS
        )
        self.pending: dict[tuple[bytes, int, int], list[Sample]] = {}
        self.ready: list[list[Sample]] = []
        self.first_seen: dict[tuple[bytes, int, int], float] = {}
        self.refused: Counter[str] = Counter()
        self.steps = 0
        self.groups_trained = 0
        self.rollouts_trained = 0  # members of the groups trained on, flat groups included
        self.groups_flat = 0
        self.groups_since_publish = 0
        self.tokens_trained = 0
        self.train_seconds = 0.0
        self.published: list[int] = []
        self.last_stats: dict[str, float] = {}
        self.resumed = self._resume()
        self.policy: Any = None  # what a step forwards: DDP over the model on several ranks
        if ranks is not None:
            self._share_resume(ranks)
            amp = autocast_wanted(self.step_settings, next(model.parameters()).device)
            self.policy = ranks.wrap(
                CompletionLogprobs(model, self.step_settings.logit_chunk, amp)
            )  # DDP sets every rank's weights to rank 0's (resumed) ones

    @classmethod
    def from_manifest(cls, model: Any, tokenizer: Any, manifest: Any, **kwargs: Any) -> Trainer:
        """A trainer with the group size, staleness bound and loss settings of a run manifest."""
        kwargs.setdefault("max_staleness", manifest.max_staleness)
        return cls(
            model,
            tokenizer,
            group_size=manifest.group_size,
            loss=LossSettings.from_manifest(manifest),
            lr=manifest.rl_lr,
            groups_per_step=manifest.rl_groups_per_step,
            publish_every=manifest.rl_publish_every,
            **kwargs,
        )

    # -------------------------------------------------------------------- admission
    def add(self, sample: Sample, now: float = 0.0) -> str | None:
        """Queue a sample (`now`: arrival time, for `flush_partial`); returns the refusal
        reason (also counted) or None."""
        reason = self._stale(sample.version)
        if reason is not None:
            self.refused[reason.split(":")[0]] += 1
            return reason
        if sample.group not in self.pending:
            self.first_seen[sample.group] = now
        group = self.pending.setdefault(sample.group, [])
        if any(s.rollout_id == sample.rollout_id and s.rollout_id for s in group):
            self.refused["duplicate"] += 1
            return "duplicate: this rollout is already queued"
        group.append(sample)
        if len(group) >= self.group_size:
            self.ready.append(self.pending.pop(sample.group))
            self.first_seen.pop(sample.group, None)
        return None

    def flush_partial(self, now: float, wait_s: float, min_size: int = 2) -> int:
        """Move groups that have waited `wait_s` with at least `min_size` members to the
        ready list (validators audit a share of rollouts, so some members of a group may
        never be verified; advantages are then taken over the verified members)."""
        moved = 0
        for key in [k for k, t in self.first_seen.items() if now - t >= wait_s]:
            group = self.pending.get(key)
            if group is not None and len(group) >= min_size:
                self.ready.append(self.pending.pop(key))
                self.first_seen.pop(key)
                moved += 1
        return moved

    def _stale(self, v: int) -> str | None:
        if self.max_staleness is None:
            return None
        if v > self.version:
            return f"future-version: made with version {v}, trainer is at {self.version}"
        if self.version - v > self.max_staleness:
            return (
                f"stale: made with version {v}, trainer is at {self.version}, "
                f"bound S={self.max_staleness}"
            )
        return None

    # ------------------------------------------------------------------------- steps
    def step(self) -> dict[str, float] | None:
        """One optimiser step when enough fresh groups are ready, else None."""
        fresh = []
        for g in self.ready:
            if self._stale(g[0].version) is None:
                fresh.append(g)
            else:
                self.refused["stale"] += len(g)
        self.ready = fresh
        for key in [k for k, g in self.pending.items() if self._stale(g[0].version) is not None]:
            self.refused["stale"] += len(self.pending.pop(key))
            self.first_seen.pop(key, None)
        if len(self.ready) < self.groups_per_step:
            return None
        batch, self.ready = self.ready[: self.groups_per_step], self.ready[self.groups_per_step :]
        stats = self.train_on(batch)
        self.groups_since_publish += len(batch)
        if self.groups_since_publish >= self.publish_every:
            self.groups_since_publish = 0
            self._next_version()
        return stats

    def train_on(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        """Advantages, forward/backward passes in micro-batches (`trainer.micro_step`) and
        one AdamW step over these groups (on several ranks: rank 0 sends them first)."""
        t0 = time.perf_counter()
        ranks = self.ranks
        if ranks is not None and ranks.rank == 0:
            ranks.send(TRAIN, [list(g) for g in groups])
        samples: list[Sample] = []
        advs: list[float] = []
        for g in groups:
            a = group_advantages([s.reward for s in g], self.loss.advantage, self.loss.eps)
            if a is None:
                self.groups_flat += 1
                continue
            samples += list(g)
            advs += a
        stats: dict[str, float] = {"groups": float(len(groups)), "samples": float(len(samples))}
        stats["reward_mean"] = sum(s.reward for g in groups for s in g) / max(
            1, sum(len(g) for g in groups)
        )
        if samples:
            self.model.train()
            self.opt.zero_grad(set_to_none=True)
            loss, loss_stats = accumulate_gradients(
                self.model,
                samples,
                advs,
                self.pad_id,
                self.loss,
                self.step_settings,
                self.ref_model,
                policy=self.policy,
                rank=ranks.rank if ranks is not None else 0,
                world=ranks.world if ranks is not None else 1,
            )
            if ranks is not None:  # each rank holds its micro-batches' share: sum them
                keys = sorted(loss_stats)
                loss, *sums = ranks.sum([loss, *(loss_stats[k] for k in keys)])
                loss_stats = dict(zip(keys, sums, strict=True))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
            self.opt.step()
            self.model.eval()
            self.steps += 1
            self.tokens_trained += sum(len(s.completion_ids) for s in samples)
            stats.update(loss_stats, loss=loss, grad_norm=float(grad_norm))
        self.groups_trained += len(groups)
        self.rollouts_trained += sum(len(g) for g in groups)
        self.train_seconds += time.perf_counter() - t0
        self.last_stats = stats
        return stats

    # ----------------------------------------------------------- versions, checkpoints
    def _next_version(self) -> None:
        self.version += 1
        self.save_checkpoint()  # first: a crash after this never reuses the number
        if self.publish is not None:
            self.publish(self.version, self.model)
        self.published.append(self.version)

    def save_checkpoint(self) -> None:
        """Write the model and optimizer state to `ckpt_dir` (nothing without one)."""
        if self.ckpt_dir is None:
            return
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "version": self.version,
            "steps": self.steps,
            "groups_trained": self.groups_trained,
        }
        tmp = self.ckpt_dir / f".{CKPT_FILE}.tmp-{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_dir / CKPT_FILE)

    def _share_resume(self, ranks: Ranks) -> None:
        """Rank 0's resumed counters and AdamW state on every rank (its weights follow
        when DDP wraps the model)."""
        state = None
        if ranks.rank == 0 and self.resumed:
            state = {"optimizer": self.opt.state_dict(), "version": self.version}
            state.update(steps=self.steps, groups_trained=self.groups_trained)
        state = ranks.share(state)
        if state is not None and ranks.rank != 0:
            self.opt.load_state_dict(state["optimizer"])
            self.version, self.steps = state["version"], state["steps"]
            self.groups_trained = state["groups_trained"]
            self.resumed = True

    def ranks_agree(self) -> bool:
        """Whether every rank holds the same weights (True on one rank); rank 0 only."""
        if self.ranks is None:
            return True
        self.ranks.send(CHECK)
        return self.ranks.same_weights(self.model)

    def close(self) -> None:
        """Rank 0: stop the other ranks and leave the process group (nothing on one rank)."""
        ranks, self.ranks = self.ranks, None
        if ranks is not None:
            if ranks.rank == 0:
                ranks.send(STOP)
            ranks.close()

    def _resume(self) -> bool:
        path = self.ckpt_dir / CKPT_FILE if self.ckpt_dir is not None else None
        if path is None or not path.is_file():
            return False
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.steps = int(state["steps"])
        self.groups_trained = int(state["groups_trained"])
        return True

    def status(self) -> dict[str, Any]:
        """Throughput and memory figures for `status` and the benchmark."""
        return {
            "policy_version": self.version,
            "train_steps": self.steps,
            "groups_trained": self.groups_trained,
            "groups_flat_dropped": self.groups_flat,
            "groups_waiting": len(self.ready),
            "refused": dict(self.refused),
            "train_tokens_per_s": round(self.tokens_trained / self.train_seconds, 1)
            if self.train_seconds > 0
            else 0.0,
            "trainer_rss_mb": rss_mb(),
            "last": {k: round(v, 5) for k, v in self.last_stats.items()},
        }


def rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
