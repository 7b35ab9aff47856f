"""Producing rollouts: N signed rollout records generated into a msgpack stream.

Rollout `counter` (start, start + 1, ...) gets its task from `trainer.tasks.assign_task`
(run seed, the producer's peer id, policy version, counter) and its sampling seed from the
same derivation, so any peer can re-derive and replay it. Activation proofs are built from
the captured hidden states in a background thread while the next batch generates.

Used by `swarm-node rollouts` (a file for people and tests) and the inference role (one
batch at a time, read back and gossiped); benchmarks time it at `DEFAULT_BATCH_SIZE`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from protocol.rollout import make_record, write_records
from trainer.engine import SamplingSettings, rollout_body
from trainer.tasks import PartialCreditLog, TaskSet, assign_task

DEFAULT_BATCH_SIZE = 16  # the worker's usual generation batch

# `verify.toploc.build_proofs_bytes_many`: hidden states of a batch -> proofs per sample
ProofBuilder = Callable[..., list[list[bytes]]]


def _quiet(_msg: str) -> None:
    pass


def generate_records(
    *,
    engine: Any,
    manifest: Any,
    identity: Any,
    n: int,
    out: Path,
    policy_version: int = 0,
    start_counter: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    build_proofs: ProofBuilder | None = None,
    say: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Generate `n` records (counters `start_counter`...) into the file `out`; returns the
    summary. `build_proofs` is `verify.toploc.build_proofs_bytes_many` or None (no proofs:
    records carry none and no hidden states are captured). Raises `TaskError` when a task
    cannot be derived and `OSError` when `out` cannot be written."""

    settings = SamplingSettings.from_manifest(manifest)
    tokenizer = engine.tokenizer
    tasks = TaskSet(manifest.seed)
    credit = PartialCreditLog()
    rewards: list[float] = []
    finish = {"eos": 0, "length": 0}
    gen_tokens = 0
    gen_seconds = 0.0
    t_start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proofs")
    pending: list[tuple[Future[Any] | None, list[Any]]] = []
    written = 0

    def flush(fh: Any, upto_all: bool) -> None:
        nonlocal written
        while pending and (upto_all or len(pending) > 1):
            fut, items = pending.pop(0)
            proof_lists = fut.result() if fut is not None else [[] for _ in items]
            records = []
            for (assignment, prompt_ids, g, reward), pl in zip(items, proof_lists, strict=True):
                body = rollout_body(prompt_ids, g, settings, assignment.task_seed, pl)
                records.append(
                    make_record(
                        identity,
                        body,
                        dataset=assignment.dataset,
                        task_index=assignment.task_index,
                        counter=assignment.counter,
                        task_seed=assignment.task_seed,
                        reward=reward,
                        run_id=manifest.run_id,
                        policy_version=policy_version,
                        seq=assignment.counter,
                        timestamp_ms=int(time.time() * 1000),
                    )
                )
            written += write_records(fh, records)

    def proofs_for(hiddens: list[Any]) -> list[list[bytes]]:
        return build_proofs(hiddens, chunk=manifest.proof_chunk, topk=manifest.proof_topk)

    try:
        with open(out, "wb") as fh:
            for start in range(start_counter, start_counter + n, batch_size):
                counters = range(start, min(start + batch_size, start_counter + n))
                assignments = [
                    assign_task(manifest, identity.peer_id, policy_version, c) for c in counters
                ]
                batch_tasks = [tasks.task_for(a) for a in assignments]
                prompts = [
                    tokenizer.encode(t.prompt, add_special_tokens=False) for t in batch_tasks
                ]
                t0 = time.perf_counter()
                gens = engine.generate(
                    prompts,
                    settings,
                    [a.task_seed for a in assignments],
                    capture_hidden=build_proofs is not None,
                )
                gen_seconds += time.perf_counter() - t0
                items = []
                for a, t, p, g in zip(assignments, batch_tasks, prompts, gens, strict=True):
                    text = tokenizer.decode(g.completion_ids, skip_special_tokens=True)
                    score = tasks.score(t, text, credit)
                    rewards.append(score.reward)
                    finish[g.finish_reason] += 1
                    gen_tokens += len(g.completion_ids)
                    items.append((a, p, g, score.reward))
                fut = None
                if build_proofs is not None:
                    fut = pool.submit(proofs_for, [g.hidden for g in gens])
                    for g in gens:
                        g.hidden = None  # owned by the proof job now
                pending.append((fut, items))
                flush(fh, upto_all=False)
                done = len(rewards)
                elapsed = time.perf_counter() - t_start
                eta = elapsed / done * (n - done)
                say(
                    f"rollouts {done}/{n}  reward mean {sum(rewards) / done:.3f}  "
                    f"{gen_tokens / max(gen_seconds, 1e-9):.0f} tok/s  ETA {eta:.0f}s"
                )
            flush(fh, upto_all=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    total = time.perf_counter() - t_start
    return {
        "n": written,
        "out": str(out),
        "reward_mean": round(sum(rewards) / len(rewards), 4),
        "solve_rate": round(sum(r >= 1.0 for r in rewards) / len(rewards), 4),
        "tokens": gen_tokens,
        "tokens_per_s": round(gen_tokens / max(gen_seconds, 1e-9), 1),
        "seconds": round(total, 2),
        "finish": finish,
        "proofs": build_proofs is not None,
        "partial_credit": credit.summary(),
        "policy_version": policy_version,
        "counters": [start_counter, start_counter + n - 1],
    }
