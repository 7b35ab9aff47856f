"""The generation engine interface shared by the CPU (transformers) and GPU (vLLM) engines.

One call: token-id prompts, sampling settings and one seed per sample in; per sample the
completion token ids, the sampler's per-token log-probs and the last hidden states out.

Contract every engine keeps (the verifier relies on it):
- Token `i` of a completion is chosen by `verify.sampling` from the logits at the position
  that predicts it (prompt length - 1 + i), with `seed` = the sample's seed and `step` = i.
  The choice depends only on (logits, settings, seed, step): not on batch size, batch
  order or thread count (up to float noise in the logits themselves).
- `hidden[i]` is the final-norm hidden state (the LM head's input) at that same position,
  i.e. the activation whose logits chose token i. A verifier gets all of them with one
  prefill of prompt + completion: rows (n_prompt - 1) .. (n_prompt + T - 2).
- Generation stops at the first EOS token (kept as the last completion token,
  `finish_reason="eos"`) or after `max_new_tokens` (`finish_reason="length"`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from protocol.wire import RolloutBody

FinishReason = Literal["eos", "length"]


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """Sampling settings recorded with every rollout. top_k <= 0 and top_p >= 1 are off;
    temperature 0 is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 48

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k}")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def from_manifest(cls, manifest: Any) -> SamplingSettings:
        """The sampling settings a run manifest fixes."""
        return cls(
            temperature=float(manifest.temperature),
            top_p=float(manifest.top_p),
            top_k=int(manifest.top_k),
            max_new_tokens=int(manifest.max_new_tokens),
        )


@dataclass(slots=True)
class Generation:
    """One sample's result. `hidden` is a float tensor [T, H] (None if not captured)."""

    completion_ids: list[int]
    logprobs: list[float]  # float32 values, one per completion token
    hidden: Any  # torch.Tensor [T, H], bf16-castable, on the CPU
    finish_reason: FinishReason


class Engine(ABC):
    """A generation backend. Implementations: `trainer.engine_hf.HFEngine` (CPU, any
    transformers causal LM directory) and `trainer.engine_vllm.VLLMEngine` (GPU)."""

    eos_token_ids: frozenset[int]
    vocab_size: int
    hidden_size: int

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        seeds: Sequence[int],
        capture_hidden: bool = True,
    ) -> list[Generation]:
        """Generate one completion per prompt; `seeds[i]` seeds sample i's sampler."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release resources (GPU memory, worker processes)."""


def check_batch(prompts: Sequence[Sequence[int]], seeds: Sequence[int], vocab_size: int) -> None:
    """Shared argument checks: matching lengths, non-empty prompts, ids in the vocabulary."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
    for s in seeds:
        if not 0 <= int(s) < 2**64:
            raise ValueError(f"seed {s} is not an unsigned 64-bit integer")


def rollout_body(
    prompt_ids: Sequence[int],
    generation: Generation,
    settings: SamplingSettings,
    sampling_seed: int,
    proofs: Sequence[bytes],
) -> RolloutBody:
    """The wire body of one generated rollout, with the sampling settings as claimed."""
    return RolloutBody(
        prompt_ids=tuple(int(t) for t in prompt_ids),
        completion_ids=tuple(int(t) for t in generation.completion_ids),
        logprobs=tuple(float(x) for x in generation.logprobs),
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
        sampling_seed=sampling_seed,
        finish_reason=generation.finish_reason,
        proofs=tuple(proofs),
    )
