"""How `bench verify` makes, doctors and audits signed rollout records.

`make_records` generates a case's records as a worker would (task assignment, seeded
sampling, proofs, signed records), with the knobs the attacks need (another prompt, a
temperature lie, own seeds and best-of-k picking, no proofs). A careful attacker's edits
go through `reprove` (proofs and sampler log-probs recomputed from an honest prefill of the
edited sequence) and `resign` (reward re-scored, record re-signed), both applied by
`edited`; `edit_token`, `truncate` and `extend` are the edits. `audit` is the verifier
every case shares, timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from protocol.rollout import make_record, open_record
from trainer.engine import SamplingSettings, rollout_body
from trainer.tasks import assign_task


@dataclass
class Ctx:
    """The bench's policy, run and producer, and how many records a case makes."""

    model: Any
    tokenizer: Any
    manifest: Any
    identity: Any
    tasks: Any
    judge: Any
    audit_settings: Any
    n: int
    quick: bool
    counter0: int = 0  # first task counter of the records made (one range per seed)


def canonical_bf16(model: Any) -> Any:
    """The model's weights rounded to bf16 in place (kept in their dtype), as a network
    ships them."""
    import torch  # deferred: heavy import

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model


def make_engine(model: Any, tok: Any, **kw: Any) -> Any:
    """An HF engine on `model`."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    return HFEngine(model, tok, **kw)


@dataclass
class Made:
    """One case's signed records and what making them cost."""

    records: list[bytes]
    gen_seconds: float  # in the engine's generate calls
    proof_seconds: float  # building the proofs, all rollouts at once
    tokens: int  # completion tokens
    proof_bytes: int
    chunks: int  # proofs (one per chunk of completion tokens)


def make_records(
    ctx: Ctx,
    engine: Any,
    *,
    counter0: int | None = None,
    proofs: bool = True,
    gen_temperature: float | None = None,
    prompt_offset: int | None = None,
    seed_fn: Any = None,
    pick_of: int = 1,
    version: int = 0,
) -> Made:
    """Generate ctx.n records as a worker would (task assignment, seeded sampling, proofs,
    signed records), with the knobs the attacks need."""
    from verify.toploc import build_proofs_bytes_many  # deferred: heavy import

    m = ctx.manifest
    counter0 = ctx.counter0 if counter0 is None else counter0
    claimed = SamplingSettings.from_manifest(m)
    used = replace(claimed, temperature=gen_temperature) if gen_temperature is not None else claimed
    counters = list(range(counter0, counter0 + ctx.n))
    assigns = [assign_task(m, ctx.identity.peer_id, c) for c in counters]
    tasks = [ctx.tasks.task_for(a) for a in assigns]
    if prompt_offset is not None:  # another task's prompt
        other = [assign_task(m, ctx.identity.peer_id, c + prompt_offset) for c in counters]
        gen_tasks = [ctx.tasks.task_for(a) for a in other]
    else:
        gen_tasks = tasks
    prompts = [ctx.tokenizer.encode(t.prompt, add_special_tokens=False) for t in gen_tasks]
    best: list[tuple[float, Any] | None] = [None] * ctx.n
    gen_s = 0.0
    for k in range(pick_of):
        seeds = [seed_fn(a.task_seed, k) if seed_fn else a.task_seed for a in assigns]
        t0 = time.perf_counter()
        gens = engine.generate(prompts, used, seeds, capture_hidden=proofs)
        gen_s += time.perf_counter() - t0
        for i, (t, g) in enumerate(zip(gen_tasks, gens, strict=True)):
            text = ctx.tokenizer.decode(g.completion_ids, skip_special_tokens=True)
            r = ctx.tasks.score(t, text).reward
            if best[i] is None or r > best[i][0]:  # type: ignore[index]
                best[i] = (r, g)
    t0 = time.perf_counter()
    if proofs:  # all rollouts of the batch at once (the worker does this off the decode path)
        proof_lists = build_proofs_bytes_many(
            [g.hidden for _, g in best],  # pyright: ignore[reportGeneralTypeIssues]
            m.proof_chunk,
            m.proof_topk,
        )
    else:
        proof_lists = [[] for _ in best]
    proof_s = time.perf_counter() - t0
    records = []
    tokens = pbytes = chunks = 0
    for a, prompt, (reward, g), pl in zip(assigns, prompts, best, proof_lists, strict=True):  # type: ignore[misc]
        body = rollout_body(prompt, g, claimed, a.task_seed, pl)
        tokens += len(body.completion_ids)
        pbytes += sum(len(p) for p in pl)
        chunks += len(pl)
        records.append(
            make_record(
                ctx.identity,
                body,
                dataset=a.dataset,
                task_index=a.task_index,
                counter=a.counter,
                task_seed=a.task_seed,
                reward=reward,
                run_id=m.run_id,
                policy_version=version,
                seq=a.counter,
                timestamp_ms=1_700_000_000_000 + a.counter,
            )
        )
    return Made(records, gen_s, proof_s, tokens, pbytes, chunks)


def open_records(records: list[bytes]) -> list[Any]:
    """The opened form of each signed record."""

    return [open_record(r) for r in records]


def resign(ctx: Ctx, ro: Any, body: Any) -> bytes:
    """The attacker's own signed record for a doctored body, reward re-scored honestly."""

    h, env = ro.header, ro.envelope
    task = ctx.tasks.task(h.dataset, h.task_index)
    text = ctx.tokenizer.decode(list(body.completion_ids), skip_special_tokens=True)
    reward = ctx.tasks.score(task, text).reward
    return make_record(
        ctx.identity,
        body,
        dataset=h.dataset,
        task_index=h.task_index,
        counter=h.counter,
        task_seed=h.task_seed,
        reward=reward,
        run_id=env.run_id,
        policy_version=env.policy_version,
        seq=env.seq,
        timestamp_ms=env.timestamp_ms,
    )


def reprove(ctx: Ctx, bodies: list[Any]) -> list[Any]:
    """Recompute proofs and sampler log-probs of doctored bodies from an honest prefill."""
    import numpy as np  # deferred: heavy import

    from verify import checks, toploc  # deferred: heavy import
    from verify.auditor import prefill  # deferred: heavy import

    out = []
    pre = prefill(ctx.model, [(b.prompt_ids, b.completion_ids) for b in bodies])
    for b, (hidden, logits) in zip(bodies, pre, strict=True):
        rep = checks.replay(logits, b)
        lps = np.nan_to_num(rep.logprobs, nan=-1e4).clip(-1e4, 0.0).astype(np.float32)
        out.append(
            replace(
                b,
                proofs=tuple(
                    toploc.build_proofs_bytes(
                        hidden, ctx.manifest.proof_chunk, ctx.manifest.proof_topk
                    )
                ),
                logprobs=tuple(float(x) for x in lps),
            )
        )
    return out


def audit(
    ctx: Ctx, opened: list[Any], model: Any = None, settings: Any = None
) -> tuple[list[Any], float]:
    """Audit `opened` (against `model` and `settings`, by default the context's); returns the results and the seconds taken."""
    from verify.auditor import audit_records  # deferred: heavy import

    t0 = time.perf_counter()
    res = audit_records(
        opened,
        model if model is not None else ctx.model,
        judge=ctx.judge,
        settings=settings or ctx.audit_settings,
    )
    return res, time.perf_counter() - t0


# ------------------------------------------------------------------ edits


def edited(ctx: Ctx, opened: list[Any], fn: Any) -> list[Any]:
    """The opened records with each body edited by `fn`, re-proved, re-scored, re-signed."""
    bodies = reprove(ctx, [fn(ro.body) for ro in opened])
    return open_records([resign(ctx, ro, b) for ro, b in zip(opened, bodies, strict=True)])


def edit_token(b: Any, non_eos: list[int], gen: Any) -> Any:
    """The middle completion token replaced by another non-EOS token."""
    import torch  # deferred: heavy import

    ids = list(b.completion_ids)
    i = len(ids) // 2
    choice = [t for t in non_eos if t != ids[i]]
    ids[i] = choice[int(torch.randint(len(choice), (1,), generator=gen))]
    return replace(b, completion_ids=tuple(ids))


def truncate(b: Any) -> Any:
    """The completion cut in half (a one-token completion: its finish reason flipped)."""
    k = max(1, len(b.completion_ids) // 2)
    if k == len(b.completion_ids):  # a one-token completion: drop its last (only) EOS
        return replace(
            b,
            completion_ids=b.completion_ids,
            finish_reason="length" if b.finish_reason == "eos" else "eos",
        )
    return replace(b, completion_ids=b.completion_ids[:k], logprobs=b.logprobs[:k])


def extend(b: Any, non_eos: list[int], gen: Any) -> Any:
    """4 random non-EOS tokens appended."""
    import torch  # deferred: heavy import

    extra = tuple(non_eos[int(torch.randint(len(non_eos), (1,), generator=gen))] for _ in range(4))
    return replace(b, completion_ids=b.completion_ids + extra, logprobs=b.logprobs + (-1.0,) * 4)
