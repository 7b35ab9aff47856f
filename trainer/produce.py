"""Producing rollouts: N signed rollout records generated into a msgpack stream.

Rollout `counter` (start, start + 1, ...) gets its task from `trainer.tasks.assign_task`
(run seed, the producer's peer id, counter) and its sampling seed from the
same derivation, so any peer can re-derive and replay it. Activation proofs are built from
the captured hidden states in a background thread while the next batch generates.

Used by `swarm-node rollouts` (a file for people and tests), the inference role (one
batch at a time, read back and gossiped) and, through `generate_batch`, the single-process
reference learner (`trainer.single`); benchmarks time it at `DEFAULT_BATCH_SIZE`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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


# One generated rollout waiting for its proofs: (assignment, prompt ids, generation, reward)
Item = tuple[Any, list[int], Any, float]


@dataclass
class Tally:
    """What the rollouts generated so far add up to."""

    rewards: list[float] = field(default_factory=list)
    finish: dict[str, int] = field(default_factory=lambda: {"eos": 0, "length": 0})
    tokens: int = 0  # completion tokens generated
    gen_seconds: float = 0.0  # in the engine's generate calls


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
    tasks = TaskSet(manifest.seed)
    credit = PartialCreditLog()
    tally = Tally()
    t_start = time.perf_counter()
    sign = functools.partial(
        _sign,
        identity=identity,
        manifest=manifest,
        settings=settings,
        policy_version=policy_version,
    )
    writer = _RecordWriter(build_proofs, manifest, sign)
    try:
        with open(out, "wb") as fh:
            for start in range(start_counter, start_counter + n, batch_size):
                counters = range(start, min(start + batch_size, start_counter + n))
                assignments = [assign_task(manifest, identity.peer_id, c) for c in counters]
                gens, items = generate_batch(
                    engine, tasks, credit, assignments, settings, build_proofs is not None, tally
                )
                writer.add(fh, gens, items)
                say(_progress(tally, n, time.perf_counter() - t_start))
            writer.flush(fh, upto_all=True)
    finally:
        writer.close()
    return {
        "n": writer.written,
        "out": str(out),
        "reward_mean": round(sum(tally.rewards) / len(tally.rewards), 4),
        "solve_rate": round(sum(r >= 1.0 for r in tally.rewards) / len(tally.rewards), 4),
        "tokens": tally.tokens,
        "tokens_per_s": round(tally.tokens / max(tally.gen_seconds, 1e-9), 1),
        "seconds": round(time.perf_counter() - t_start, 2),
        "finish": tally.finish,
        "proofs": build_proofs is not None,
        "partial_credit": credit.summary(),
        "policy_version": policy_version,
        "counters": [start_counter, start_counter + n - 1],
    }


def generate_batch(
    engine: Any,
    tasks: TaskSet,
    credit: PartialCreditLog,
    assignments: list[Any],
    settings: SamplingSettings,
    capture_hidden: bool,
    tally: Tally,
) -> tuple[list[Any], list[Item]]:
    """One batch: each assignment's prompt generated with its task seed, then scored."""
    tokenizer = engine.tokenizer
    batch_tasks = [tasks.task_for(a) for a in assignments]
    prompts = [tokenizer.encode(t.prompt, add_special_tokens=False) for t in batch_tasks]
    t0 = time.perf_counter()
    gens = engine.generate(
        prompts, settings, [a.task_seed for a in assignments], capture_hidden=capture_hidden
    )
    tally.gen_seconds += time.perf_counter() - t0
    items = []
    for a, t, p, g in zip(assignments, batch_tasks, prompts, gens, strict=True):
        text = tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        score = tasks.score(t, text, credit)
        tally.rewards.append(score.reward)
        tally.finish[g.finish_reason] += 1
        tally.tokens += len(g.completion_ids)
        items.append((a, p, g, score.reward))
    return gens, items


def _sign(
    items: list[Item],
    proof_lists: list[list[bytes]],
    *,
    identity: Any,
    manifest: Any,
    settings: SamplingSettings,
    policy_version: int,
) -> list[bytes]:
    """The signed records of one batch, each with its proofs."""
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
    return records


class _RecordWriter:
    """Builds each batch's proofs in a background thread while the next batch generates,
    then signs and writes its records, in batch order: at most one batch waits."""

    def __init__(
        self, build_proofs: ProofBuilder | None, manifest: Any, sign: Callable[..., list[bytes]]
    ) -> None:
        self.build_proofs, self.manifest, self.sign = build_proofs, manifest, sign
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proofs")
        self.pending: list[tuple[Future[Any] | None, list[Item]]] = []
        self.written = 0  # records written to the file

    def add(self, fh: Any, gens: list[Any], items: list[Item]) -> None:
        """Queues a batch's proof job (none without a builder), then writes the batch
        before it, if its proofs are done waiting for."""
        fut = None
        if self.build_proofs is not None:
            fut = self.pool.submit(self._proofs_for, [g.hidden for g in gens])
            for g in gens:
                g.hidden = None  # owned by the proof job now
        self.pending.append((fut, items))
        self.flush(fh, upto_all=False)

    def _proofs_for(self, hiddens: list[Any]) -> list[list[bytes]]:
        assert self.build_proofs is not None
        return self.build_proofs(
            hiddens, chunk=self.manifest.proof_chunk, topk=self.manifest.proof_topk
        )

    def flush(self, fh: Any, upto_all: bool) -> None:
        """Writes the queued batches, all of them or all but the newest."""
        while self.pending and (upto_all or len(self.pending) > 1):
            fut, items = self.pending.pop(0)
            proof_lists = fut.result() if fut is not None else [[] for _ in items]
            self.written += write_records(fh, self.sign(items, proof_lists))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _progress(tally: Tally, n: int, elapsed: float) -> str:
    done = len(tally.rewards)
    eta = elapsed / done * (n - done)
    return (
        f"rollouts {done}/{n}  reward mean {sum(tally.rewards) / done:.3f}  "
        f"{tally.tokens / max(tally.gen_seconds, 1e-9):.0f} tok/s  ETA {eta:.0f}s"
    )
