"""`bench scale`'s `train` part: the trainer's optimiser step on the `gen` part's rollouts.

The trainer of the run (`trainer.train_loop.Trainer.from_manifest`, fp32 master, AdamW,
micro-batches of `trainer.micro_step`) takes one step (`train_on`) over the records'
sequences in groups of the run's group size. Random weights solve no task, so every reward
would be 0 and every group flat (dropped, no step): the bench gives the members of each
group rewards 1, 0, 1, 0, ... so that the step has advantages to follow. Without records
(the gen part skipped or failed) the sequences are made up: prompts of 64 random tokens,
completions of `tokens` random tokens (`train_input` says which).

Figures: `step_s` (the `train_on` call), `train_tokens_per_s` (prompt + completion tokens
of the step over `step_s`; `train_completion_tokens_per_s` the completion tokens only),
`train_peak_gib` (the process's peak resident set), the micro-batch and checkpointing used.
With `config["after_step"]` the stepped weights are written there as a bf16 checkpoint
(`trainer.checkpoint.from_state_dict`), the version the `weights` part publishes.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from swarm_node_bench.parts.scale_model import (
    bench_manifest,
    child_setup,
    gpu_gib,
    load_timed,
    peak_rss_gib,
    sync,
)

SYNTHETIC_PROMPT = 64


def _samples(config: dict[str, Any], manifest: Any, vocab: int) -> tuple[list[Any], str]:
    """The step's samples: from the records when there are some, else made up."""
    from protocol.rollout import open_record, read_records  # deferred: heavy import
    from trainer.samples import Sample  # deferred: heavy import

    records = Path(config.get("records") or "")
    out = []
    if records.is_file():
        with open(records, "rb") as f:
            for data in read_records(f):
                ro = open_record(data)
                b = ro.body
                out.append((b.prompt_ids, b.completion_ids, b.logprobs, b.temperature))
        source = "records"
    if not out:
        rng = random.Random(0)
        n, t = int(config["rollouts"]), int(config["tokens"])
        for _ in range(n):
            prompt = tuple(rng.randrange(vocab) for _ in range(SYNTHETIC_PROMPT))
            completion = tuple(rng.randrange(vocab) for _ in range(t))
            out.append((prompt, completion, tuple([-12.0] * t), manifest.temperature))
        source = "synthetic"
    g = manifest.group_size
    samples = [
        Sample(
            prompt_ids=tuple(p),
            completion_ids=tuple(c),
            sampler_logprobs=tuple(lp),
            temperature=float(temp),
            version=0,
            group=(b"bench", 0, i // g),
            reward=float(i % 2 == 0),
            score=float(i % 2 == 0),
            rollout_id=i.to_bytes(8, "big"),
        )
        for i, (p, c, lp, temp) in enumerate(out)
    ]
    return samples, source


def train_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part (module docstring); `config`: model_dir, tokens, rollouts, micro_batch,
    grad_checkpointing, records, after_step, device."""
    from trainer.checkpoint import from_state_dict  # deferred: heavy import
    from trainer.micro_step import StepSettings  # deferred: heavy import
    from trainer.train_loop import Trainer  # deferred: heavy import

    device = child_setup(config)
    model, tok, loaded = load_timed(config, device)
    manifest = bench_manifest(config["model_dir"], config["tokens"], config.get("lr", 1e-6))
    samples, source = _samples(config, manifest, model.config.vocab_size)
    step_settings = StepSettings(
        micro_batch=int(config["micro_batch"]), grad_checkpointing=config.get("grad_checkpointing")
    )
    trainer = Trainer.from_manifest(model, tok, manifest, step_settings=step_settings)
    g = manifest.group_size
    groups = [samples[i : i + g] for i in range(0, len(samples), g)]
    t0 = time.perf_counter()
    stats = trainer.train_on(groups)
    sync(device)
    step_s = time.perf_counter() - t0
    seq_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    comp_tokens = sum(len(s.completion_ids) for s in samples)
    out = {
        "trainer": loaded,
        "step_s": round(step_s, 2),
        "train_tokens_per_s": round(seq_tokens / step_s, 2),
        "train_completion_tokens_per_s": round(comp_tokens / step_s, 2),
        "train_peak_gib": peak_rss_gib(),
        "train_gpu_gib": gpu_gib(device),
        "train_sequences": len(samples),
        "train_input": source,
        "micro_batch": step_settings.micro_batch,
        "grad_checkpointing": step_settings.grad_checkpointing,
        "steps": trainer.steps,
        "loss": stats.get("loss"),
    }
    if config.get("after_step"):
        data = from_state_dict(model.state_dict(), cast="bfloat16")
        Path(config["after_step"]).write_bytes(data)
    return out
