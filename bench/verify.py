"""`swarm-node bench verify [--quick] [--json] [--hidden H] [--n N]`: proofs and audits.

What it measures, on the built-in policy (or, with `--hidden H`, a random-init Qwen2 of
hidden size H with the built-in tokenizer), N signed rollout records per case:
- `proof_bytes_per_token`: proof bytes per completion token a chunk covers (2 + 2k bytes
  per `chunk` tokens); `proof_bytes_per_generated_token`: the same over the rollouts'
  actual lengths (a short last chunk still costs a full proof).
- `proof_build_overhead_pct`: generation with hidden-state capture and proof building vs
  generation without, same prompts and seeds, same run (proofs built synchronously here,
  so this is an upper bound for the worker, which builds them in a background thread):
  the median over rounds of each round's pair (the order alternating);
  `proof_build_pct_of_generation`: the proof building alone (median) / generation.
- `verify_speedup`: generation time of the honest rollouts / time to audit them (one
  batched prefill plus all checks, task re-derivation and re-scoring included).
- `attacks`: detected fraction per attack; `honest`: false-positive fraction per honest
  variation (see ATTACKS / HONEST below for what each does).
- `attacks` is the minimum detection over `attack_seeds` repetitions of the attack matrix
  (other tasks, sampler, perturbation and initialisation seeds; 3 by default, 1 with
  `--quick`, `--seeds S`); `attacks_by_seed` lists each.
- `sensitivity`: per precision (worker and audit both at it), for rank-1 changes of each
  weight kind (q/k/v/o, gate/up/down in the first, middle and last layer, final norm, LM
  head) the smallest relative Frobenius change of SENS_SIZES detected in >= 0.99 of 64
  records (`table`; null: not even at 10 %), and the weakest matrix (`--no-sensitivity`
  skips it; `--quick`: 4 records, three matrices).
- `producer`: the per-producer rule (`verify.producer`; the validator role applies it):
  each case's records are one producer's, in order; `attacks` (minimum over seeds) and
  `honest_flagged` give the share of its full windows of WINDOW (16) audited records
  whose median `logprob_err_mean` is over the calibrated `limits` (the largest honest
  value of a single record); `sensitivity` adds `producer_table` and the weakest matrix
  by the same rule (64 records: 4 windows).
- `batch_invariance_mismatches`: records whose verdict or reason differs audited alone vs
  together (the honest fp32 set, and the bf16 set in a bf16 run).
- `stream_cases_failed_correctly`: of the truncated / trailing-garbage / empty /
  oversized-record files, how many `swarm-node audit` failed correctly (exit 1, the bad
  item with its reason, the good records still passing); `stream_cases` by name.
- `calibration`: per case, the distribution of each audit metric (honest: p50 and max;
  attacks: min and p50), the data behind `verify.thresholds`.
- `thresholds`: the limits used: the model's shipped calibration file (`calibration.json`
  next to the built-in policy, written by `init-model` / `swarm-node calibrate`, the file
  the audit command and validators use), its digest as `calibration_digest`. With
  `--hidden` (a random model, no directory) the calibrate command's procedure measures it
  here. `--no-calibrate`: the shipped defaults of `verify.thresholds`.

Timing (`proof_build_overhead_pct`, `verify_speedup`) runs generation and audit with one
thread each, 9 interleaved rounds (best of them; the overhead from pairs, see above), and
also as CPU seconds (`*_cpu`): the machine
is shared, and busy-waiting thread pools make multi-threaded wall times meaningless there.
Generation time is the engine's `generate` (plus proof building where said); audit time
is the whole audit of the opened records (cheap checks, task re-derivation and re-scoring,
batched prefill, proof, replay and log-prob checks, re-checks alone of rollouts near a limit).

Options: `--hidden H` (random-init model), `--n N` (rollouts per case), `--only a,b`
(cases by name), `--no-calibrate` (the shipped default thresholds).

The verifier in every case is the same: the claimed weights in float32, sdpa attention,
right-padded batched prefill, default threads, the run manifest's settings. The policy's
weights are first rounded to bf16 (a network ships bf16 checkpoints), so "fp32 vs bf16"
differs in compute precision only.

Edited-record attacks are made by a careful attacker: after the edit the proofs and
log-probs are recomputed from an honest prefill of the edited sequence, the reward is
re-scored and the record re-signed, so only the checks that matter can catch them.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from node.console import sayer

HONEST = {
    "kv_cache_vs_prefill": "baseline worker (fp32, KV-cache decode, batch 64) vs the verifier's prefill",
    "fp32_vs_bf16": "worker computes in bf16, in a run whose manifest says bf16 (audited at bf16)",
    "batch_size": "worker generates one rollout at a time",
    "padding_side": "verifier prefill left-padded with position ids (worker left-pads, verifier right-pads by default)",
    "threads": "worker runs with 1 thread",
    "attention_impl": "worker uses eager attention, verifier sdpa",
}
ATTACKS = {
    "other_model": "generated by a re-initialised model of the same shape",
    "perturbed_weights_1pct": "every weight times (1 + 0.01 N(0,1))",
    "dropped_layer": "the middle decoder layer removed (made the identity)",
    "int8_quantized": "linear weights fake-quantised to int8 per output row",
    "prompt_changed": "generated honestly for another task's prompt, claimed for the assigned task",
    "token_edited": "one middle token replaced; proofs and log-probs recomputed",
    "truncated": "completion cut in half; proofs and log-probs recomputed",
    "extended": "4 tokens appended; proofs and log-probs recomputed",
    "temperature_lie": "sampled at temperature 0.7, claimed at the run's 1.0",
    "cherry_pick": "best of 4 samples with the worker's own seeds, claimed under the assigned seed",
    "proof_copied": "proofs of another rollout",
    "zero_proofs": "all-zero proofs (TOPLOC's silent failure)",
    "stale_version": "generated with the weights one training step older than claimed",
    "precision_lie": "worker computes in bf16 in a run whose manifest says fp32",
}
METRICS = (
    "proof_exp_mismatch_frac_all",
    "proof_mant_mean_all",
    "proof_exp_mismatch_max",
    "proof_mant_mean_max",
    "proof_mant_median_max",
    "proof_sign_mismatches",
    "sampling_mismatches",
    "sampling_margin_max",
    "logprob_err_max",
    "logprob_err_mean",
    "proof_far_points",
    "drift",
)
FULL_N = 200
QUICK_N = 8
# "One training step" for stale_version: one AdamW step at this learning rate on the honest
# rollouts (REINFORCE, advantages r - mean), the result rounded to bf16 as a published
# checkpoint. At 1e-5 about 1-3 % of the bf16 weights change, the rate reported for real
# RL steps (docs/DESIGN.md §5, "RL updates are sparse"); the bench reports the measured fraction.
STALE_LR = 1e-5
# The attack matrix runs once per seed (task counters SEED_COUNTER_STRIDE apart); each
# attack reports its minimum detection over the seeds.
SEEDS = 3
SEED_COUNTER_STRIDE = 100_000


_say = sayer("bench verify")


@dataclass
class Ctx:
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


# ------------------------------------------------------------------ setup


def _canonical_bf16(model: Any) -> Any:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model


def _setup(hidden: int | None, n: int, quick: bool) -> tuple[Ctx, Any]:
    from node.run_file import manifest_from_table
    from protocol.content_id import content_id
    from protocol.identity import Identity
    from trainer import tiny_policy
    from trainer.judge import make_judge
    from trainer.model_dir import load_model_dir
    from trainer.tasks import TaskSet
    from verify.auditor import AuditSettings

    manifest = manifest_from_table(tiny_policy.run_manifest_table("bench-verify", seed=7), "bench")
    if hidden is None:
        path, _report, built = tiny_policy.ensure_policy(progress=_say)
        model, tok = load_model_dir(path)
        _say(f"built-in policy {path}{' (built now)' if built else ''}")
    else:
        tok = tiny_policy.build_tokenizer(0)
        heads = max(1, hidden // 64)
        kv = heads // 2 if heads % 2 == 0 else heads
        model = tiny_policy.build_model(
            tok,
            seed=1,
            hidden_size=hidden,
            intermediate_size=max(64, (8 * hidden // 3 + 63) // 64 * 64),
            num_attention_heads=heads,
            num_key_value_heads=kv,
        )
        _say(f"random-init Qwen2, hidden {hidden}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")
    model = _canonical_bf16(model.eval())
    identity = Identity.from_private_bytes(content_id(b"bench-verify-identity"))
    ctx = Ctx(
        model=model,
        tokenizer=tok,
        manifest=manifest,
        identity=identity,
        tasks=TaskSet(manifest.seed),
        judge=make_judge(manifest, tok),
        audit_settings=AuditSettings(
            chunk=manifest.proof_chunk, topk=manifest.proof_topk, expected_settings=manifest
        ),
        n=n,
        quick=quick,
    )
    return ctx, (path if hidden is None else None)


# ------------------------------------------------------------------ records


def _engine(model: Any, tok: Any, **kw: Any) -> Any:
    from trainer.engine_hf import HFEngine

    return HFEngine(model, tok, **kw)


@dataclass
class Made:
    records: list[bytes]
    gen_seconds: float
    proof_seconds: float
    tokens: int
    proof_bytes: int
    chunks: int


def _make_records(
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
    from protocol.rollout import make_record
    from trainer.engine import SamplingSettings, rollout_body
    from trainer.tasks import assign_task
    from verify.toploc import build_proofs_bytes_many

    m = ctx.manifest
    counter0 = ctx.counter0 if counter0 is None else counter0
    claimed = SamplingSettings.from_manifest(m)
    used = replace(claimed, temperature=gen_temperature) if gen_temperature is not None else claimed
    counters = list(range(counter0, counter0 + ctx.n))
    assigns = [assign_task(m, ctx.identity.peer_id, version, c) for c in counters]
    tasks = [ctx.tasks.task_for(a) for a in assigns]
    if prompt_offset is not None:  # another task's prompt
        other = [assign_task(m, ctx.identity.peer_id, version, c + prompt_offset) for c in counters]
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
        proof_lists = build_proofs_bytes_many([g.hidden for _, g in best], m.proof_chunk, m.proof_topk)  # type: ignore[misc]
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
                ctx.identity, body, dataset=a.dataset, task_index=a.task_index, counter=a.counter,
                task_seed=a.task_seed, reward=reward, run_id=m.run_id, policy_version=version,
                seq=a.counter, timestamp_ms=1_700_000_000_000 + a.counter,
            )
        )
    return Made(records, gen_s, proof_s, tokens, pbytes, chunks)


def _paired_overhead_pct(with_: list[float], without: list[float]) -> float:
    """Median over rounds of (with / without - 1), in percent."""
    return round(100 * statistics.median(w / wo - 1 for w, wo in zip(with_, without, strict=True)), 2)


def _open(records: list[bytes]) -> list[Any]:
    from protocol.rollout import open_record

    return [open_record(r) for r in records]


def _resign(ctx: Ctx, ro: Any, body: Any) -> bytes:
    """The attacker's own signed record for a doctored body, reward re-scored honestly."""
    from protocol.rollout import make_record

    h, env = ro.header, ro.envelope
    task = ctx.tasks.task(h.dataset, h.task_index)
    text = ctx.tokenizer.decode(list(body.completion_ids), skip_special_tokens=True)
    reward = ctx.tasks.score(task, text).reward
    return make_record(
        ctx.identity, body, dataset=h.dataset, task_index=h.task_index, counter=h.counter,
        task_seed=h.task_seed, reward=reward, run_id=env.run_id, policy_version=env.policy_version,
        seq=env.seq, timestamp_ms=env.timestamp_ms,
    )


def _reprove(ctx: Ctx, bodies: list[Any]) -> list[Any]:
    """Recompute proofs and sampler log-probs of doctored bodies from an honest prefill."""
    import numpy as np

    from verify import checks, toploc
    from verify.auditor import prefill

    out = []
    pre = prefill(ctx.model, [(b.prompt_ids, b.completion_ids) for b in bodies])
    for b, (hidden, logits) in zip(bodies, pre, strict=True):
        rep = checks.replay(logits, b)
        lps = np.nan_to_num(rep.logprobs, nan=-1e4).clip(-1e4, 0.0).astype(np.float32)
        out.append(
            replace(
                b,
                proofs=tuple(toploc.build_proofs_bytes(hidden, ctx.manifest.proof_chunk, ctx.manifest.proof_topk)),
                logprobs=tuple(float(x) for x in lps),
            )
        )
    return out


def _audit(ctx: Ctx, opened: list[Any], model: Any = None, settings: Any = None) -> tuple[list[Any], float]:
    from verify.auditor import audit_records

    t0 = time.perf_counter()
    res = audit_records(opened, model if model is not None else ctx.model, judge=ctx.judge,
                        settings=settings or ctx.audit_settings)
    return res, time.perf_counter() - t0


# ------------------------------------------------------------------ model variants


def _perturbed(model: Any, rel: float, seed: int) -> Any:
    import torch

    m = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1 + rel * torch.randn(p.shape, generator=gen))
    return m


def _dropped_layer(model: Any) -> Any:
    import torch

    m = copy.deepcopy(model)
    layer = m.base_model.layers[len(m.base_model.layers) // 2]
    with torch.no_grad():  # residual stream passes through unchanged: the layer is gone
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        for mod in (layer.self_attn.o_proj, layer.mlp.down_proj):
            if mod.bias is not None:
                mod.bias.zero_()
    return m


def _int8(model: Any) -> Any:
    import torch

    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.base_model.layers:
            for mod in layer.modules():
                if isinstance(mod, torch.nn.Linear):
                    w = mod.weight
                    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
                    w.copy_((w / scale).round().clamp(-127, 127) * scale)
    return m


def _bf16(model: Any) -> Any:
    import torch

    return copy.deepcopy(model).to(torch.bfloat16)


def _eager(model: Any) -> Any:
    m = copy.deepcopy(model)
    m.set_attn_implementation("eager")
    return m


def _other_model(ctx: Ctx, seed: int = 0) -> Any:
    """A freshly initialised model of the same configuration."""
    import torch

    torch.manual_seed(12345 + seed)
    m = type(ctx.model)(copy.deepcopy(ctx.model.config))
    m.generation_config = copy.deepcopy(ctx.model.generation_config)
    return _canonical_bf16(m.eval())


def _one_training_step(ctx: Ctx, opened: list[Any]) -> Any:
    """The policy after one REINFORCE step (group-free advantages r - mean) with AdamW at
    STALE_LR on the given rollouts: what a trainer publishes as the next version."""
    import torch

    m = copy.deepcopy(ctx.model).train()
    opt = torch.optim.AdamW(m.parameters(), lr=STALE_LR, weight_decay=0.0)
    rewards = torch.tensor([ro.header.reward for ro in opened])
    adv = rewards - rewards.mean()
    if float(adv.abs().sum()) == 0.0:
        adv = torch.ones_like(adv)
    loss = torch.zeros(())
    for ro, a in zip(opened, adv, strict=True):
        b = ro.body
        ids = torch.tensor([list(b.prompt_ids) + list(b.completion_ids)])
        logits = m(input_ids=ids).logits[0, len(b.prompt_ids) - 1 : -1].float()
        lp = torch.log_softmax(logits / max(b.temperature, 1e-6), -1)
        tok = torch.tensor(list(b.completion_ids))
        loss = loss - a * lp[torch.arange(len(tok)), tok].sum() / len(opened)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return _canonical_bf16(m.eval())


def _changed_fraction(a: Any, b: Any) -> float:
    changed = total = 0
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        changed += int((p != q).sum())
        total += p.numel()
    return changed / max(1, total)


# ------------------------------------------------------------------ calibration

def _calibrate(ctx: Ctx, model_dir: Any) -> tuple[Any, str]:
    """The audit limits from the model's calibration file (`swarm-node calibrate`; measured
    and cached now if the model has none yet). A random-init model (`--hidden`) has no
    directory: the same procedure measures it (`node.commands.calibrate.measure`), in the
    open and reported, on tasks the benchmark cases never see."""
    from node.commands.calibrate import ensure_calibration, measure
    from verify.calibration import FILE_NAME, apply, decode_calibration, encode_calibration

    if model_dir is not None:
        ensure_calibration(model_dir, force=False, say=_say)
        data = (model_dir / FILE_NAME).read_bytes()
    else:
        regimes, measured = measure(ctx.model, ctx.tokenizer, ctx.manifest, n=max(8, ctx.n // 4), say=_say)
        data = encode_calibration(regimes, measured, model="bench random-init")
    cal = decode_calibration(data)
    st = apply(replace(ctx.audit_settings, precision="bf16"), cal)
    st = apply(replace(st, precision="fp32"), cal)
    return st, cal.digest.hex()


# ------------------------------------------------------------------ sensitivity

SENS_KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SENS_SIZES = (0.001, 0.003, 0.01, 0.03, 0.1)  # relative Frobenius change, tried in order
SENS_FULL_N = 64
SENS_QUICK_N = 4
SENS_TARGET = 0.99


def _sens_matrices(model: Any, quick: bool) -> dict[str, Any]:
    """name -> weight parameter: each projection kind in the first, middle and last layer,
    the final norm and the LM head (quick: first layer's q_proj and down_proj, LM head)."""
    layers = model.base_model.layers
    picks = {"first": 0, "middle": len(layers) // 2, "last": len(layers) - 1}
    out: dict[str, Any] = {}
    for where, i in picks.items():
        for kind in SENS_KINDS:
            if quick and (where != "first" or kind not in ("q_proj", "down_proj")):
                continue
            mod = getattr(layers[i].self_attn, kind, None) or getattr(layers[i].mlp, kind)
            out[f"{where}.{kind}"] = mod.weight
    if not quick:
        out["final_norm"] = model.base_model.norm.weight
    out["lm_head"] = model.get_output_embeddings().weight
    return out


def _rank1_changed(model: Any, name: str, rel: float, seed: int, quick: bool) -> Any:
    """A copy of `model` with a rank-1 change of relative Frobenius size `rel` to one
    matrix (a vector for the norm)."""
    import torch

    m = copy.deepcopy(model)
    w = _sens_matrices(m, quick)[name]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if w.dim() == 1:
            d = torch.randn(w.shape, generator=g)
        else:
            d = torch.randn(w.shape[0], 1, generator=g) @ torch.randn(1, w.shape[1], generator=g)
        w.add_(d.to(w.dtype) * (rel * w.float().norm() / d.norm()).to(w.dtype))
    return m


def _sensitivity(ctx: Ctx, quick: bool) -> dict[str, Any]:
    """Per precision: for each matrix the smallest relative change detected in at least
    SENS_TARGET of the records (None: not even at the largest size), and the weakest."""
    n = SENS_QUICK_N if quick else SENS_FULL_N
    sctx = replace(ctx, n=n, counter0=5 * SEED_COUNTER_STRIDE)
    out: dict[str, Any] = {"records": n, "sizes": list(SENS_SIZES), "target": SENS_TARGET}
    for precision in ("fp32", "bf16"):
        settings = replace(ctx.audit_settings, precision=precision)
        limit = _producer_limit(ctx.audit_settings, precision)
        table: dict[str, Any] = {}
        by_producer: dict[str, Any] = {}
        for name in _sens_matrices(ctx.model, quick):
            table[name] = by_producer[name] = None
            for k, rel in enumerate(SENS_SIZES):
                worker = _rank1_changed(ctx.model, name, rel, seed=k, quick=quick)
                if precision == "bf16":
                    worker = _bf16(worker)
                made = _make_records(sctx, _engine(worker, ctx.tokenizer, max_batch=64))
                res = _audit(ctx, _open(made.records), settings=settings)[0]
                if table[name] is None and _frac_failed(res) >= SENS_TARGET:
                    table[name] = rel
                flagged = _producer_flagged(res, limit)
                if by_producer[name] is None and flagged is not None and flagged >= SENS_TARGET:
                    by_producer[name] = rel
                if table[name] is not None and (by_producer[name] is not None or n < _producer_window()):
                    break
            _say(f"sensitivity {precision} {name}: smallest detected {table[name]} per record, "
                 f"{by_producer[name]} per producer")  # fmt: skip
        weakest = max(table, key=lambda k: float("inf") if table[k] is None else table[k])
        weakest_p = max(by_producer, key=lambda k: float("inf") if by_producer[k] is None else by_producer[k])
        out[precision] = {
            "weakest_matrix": weakest,
            "weakest_rel_change_detected": table[weakest],
            "table": table,
            "producer_weakest_matrix": weakest_p,
            "producer_weakest_rel_change_detected": by_producer[weakest_p],
            "producer_table": by_producer,
        }
    return out


# ------------------------------------------------------------------ invariance, streams


def _batch_invariance_mismatches(ctx: Ctx, opened: list[Any], settings: Any) -> int:
    """How many records get another (verdict, reason) audited alone than in one batch."""
    together, _ = _audit(ctx, opened, settings=settings)
    alone = [_audit(ctx, [ro], settings=settings)[0][0] for ro in opened]
    return sum((a.passed, a.reason) != (b.passed, b.reason) for a, b in zip(together, alone, strict=True))


def _stream_cases(ctx: Ctx, model_dir: Any, records: list[bytes]) -> tuple[int, dict[str, bool]]:
    """Record files that must fail, through `swarm-node audit`: a truncated stream, trailing
    garbage, an empty file, an oversized record between good ones. Correct: exit 1, the bad
    item's line has its reason, every good record still passes."""
    import io
    import json
    import shutil
    import tempfile
    from pathlib import Path

    import msgpack

    from node.commands import audit as audit_cmd
    from protocol.rollout import write_records
    from protocol.wire import RolloutRecord
    from trainer.model_dir import save_model_dir
    from verify.calibration import FILE_NAME

    buf = io.BytesIO()
    write_records(buf, records[:2])
    good = buf.getvalue()
    oversized = msgpack.packb(b"\0" * (RolloutRecord.MAX_BYTES + 1), use_bin_type=True)
    cases = {  # name: (bytes, reasons expected line by line)
        "truncated": (good + b"\xc4\x80", ["ok", "ok", "stream-truncated"]),
        "trailing_garbage": (good + b"\x93\x01\x02", ["ok", "ok", "stream-garbage"]),
        "empty": (b"", ["stream-empty"]),
        "oversized": (good + oversized + good, ["ok", "ok", "record-too-large", "ok", "ok"]),
    }
    out: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from node.run_file import manifest_to_toml

        run_toml = root / "run.toml"
        run_toml.write_text(manifest_to_toml(ctx.manifest))
        # the bench's model (weights rounded to bf16 in memory), with the calibration file
        saved = save_model_dir(ctx.model, ctx.tokenizer, root / "model")
        if model_dir is not None and (Path(model_dir) / FILE_NAME).is_file():
            shutil.copy(Path(model_dir) / FILE_NAME, Path(saved) / FILE_NAME)
        model_dir = saved
        for name, (data, want) in cases.items():
            path = root / f"{name}.msgpack"
            path.write_bytes(data)
            text = io.StringIO()
            code = audit_cmd.main([path], str(model_dir), as_json=True, manifest=run_toml, out=text)
            got = [json.loads(x)["reason"] for x in text.getvalue().splitlines()]
            out[name] = code == 1 and got == want
    return sum(out.values()), out


# ------------------------------------------------------------------ stats


def _summary(results: list[Any], attack: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k in METRICS:
        vals = sorted(r.metrics[k] for r in results if k in r.metrics)
        if not vals:
            continue
        med = statistics.median(vals)
        pair = [vals[0], med] if attack else [med, vals[-1]]
        out[k] = [round(v, 4) for v in pair]
    if attack:
        reasons: dict[str, int] = {}
        for r in results:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        out["reasons"] = reasons  # type: ignore[assignment]
    return out


def _frac_failed(results: list[Any]) -> float:
    return round(sum(not r.passed for r in results) / max(1, len(results)), 4)


def _producer_flagged(results: list[Any], limit: float) -> float | None:
    """The share of full windows (`verify.producer.WINDOW` records, in order) of one
    producer's audited records that the per-producer rule flags; None: no full window."""
    from verify.producer import WINDOW, ProducerTally

    tally = ProducerTally(limit)
    flagged = sum(  # the records' counters are consecutive: record i is counter0 + i
        tally.add(b"p", i, i.to_bytes(4, "big"), r.metrics) is not None
        for i, r in enumerate(results)
    )
    blocks = [results[k : k + WINDOW] for k in range(0, len(results) - WINDOW + 1, WINDOW)]
    windows = sum(all(tally.stat in r.metrics for r in b) for b in blocks)
    return round(flagged / windows, 4) if windows else None


def _producer_window() -> int:
    from verify.producer import WINDOW

    return WINDOW


def _producer_limit(settings: Any, precision: str) -> float:
    th = settings.thresholds if precision == "fp32" else settings.bf16_thresholds
    return float(th.producer_logprob_err_median)


# ------------------------------------------------------------------ run


def _parse(args: list[str], quick: bool) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="swarm-node bench verify", add_help=False)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--no-calibrate", action="store_true", help="use the shipped thresholds")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the sensitivity block")
    ap.add_argument("--seeds", type=int, default=None, help="attack-matrix seeds (default 3; quick 1)")
    try:
        ns = ap.parse_args(args)
    except SystemExit:
        from node.errors import CommandError

        raise CommandError(f"bench verify: bad arguments {args} (know --hidden H, --n N, --only a,b, --no-calibrate, --no-sensitivity, --seeds S)") from None
    if ns.hidden is not None and not 16 <= ns.hidden <= 8192:
        from node.errors import CommandError

        raise CommandError(f"--hidden must be in [16, 8192], got {ns.hidden}")
    if ns.n is None:
        ns.n = QUICK_N if quick else FULL_N
    if ns.seeds is None:
        ns.seeds = 1 if quick else SEEDS
    if not 1 <= ns.seeds <= 16:
        from node.errors import CommandError

        raise CommandError(f"--seeds must be in [1, 16], got {ns.seeds}")
    return ns


def run(quick: bool, args: list[str]) -> dict:
    import torch

    ns = _parse(args, quick)
    only = set(ns.only.split(",")) if ns.only else None
    t_start = time.perf_counter()
    ctx, model_dir = _setup(ns.hidden, ns.n, quick)
    tok = ctx.tokenizer

    def want(name: str) -> bool:
        return only is None or name in only

    # ---- honest baseline: timing with and without proofs, then the audit.
    # Timed single-threaded (generation and audit alike) and as CPU seconds: the machine is
    # shared, and busy-waiting thread pools make multi-threaded timings meaningless there.
    # Interleaved rounds, best of each.
    from trainer.engine_hf import torch_threads

    base_engine = _engine(ctx.model, tok, max_batch=64)
    # Generation is timed at the worker's usual batch size (`trainer.produce.DEFAULT_BATCH_SIZE`).
    from trainer.produce import DEFAULT_BATCH_SIZE

    timing_engine = _engine(ctx.model, tok, max_batch=DEFAULT_BATCH_SIZE, threads=1)
    _make_records(replace(ctx, n=min(ctx.n, 4)), timing_engine)  # warm-up
    rounds = 1 if quick else 9  # a run takes ~3.5 s; the machine drifts by more than 2%
    t_without, t_with, c_without, c_with, proof_s, base = [], [], [], [], [], None
    for r in range(rounds):
        # each round is a pair, its order alternating, so a drift of the shared machine's
        # speed within a round favours neither side; the overhead is the median pair's
        for with_proofs in (r % 2 == 1, r % 2 == 0):
            c0 = time.process_time()
            made = _make_records(ctx, timing_engine, proofs=with_proofs)
            cpu = time.process_time() - c0
            if with_proofs:
                t_with.append(made.gen_seconds + made.proof_seconds)
                c_with.append(cpu)
                proof_s.append(made.proof_seconds)
                base = made
            else:
                t_without.append(made.gen_seconds)
                c_without.append(cpu)
    assert base is not None
    _say(f"generated {ctx.n} rollouts: {min(t_without):.2f}s without proofs, {min(t_with):.2f}s with")
    base_opened = _open(base.records)
    t_audits, c_audits = [], []
    with torch_threads(1):
        for _ in range(rounds + 1):
            c0 = time.process_time()
            base_res, t = _audit(ctx, base_opened)
            c_audits.append(time.process_time() - c0)
            t_audits.append(t)
    t_audit = min(t_audits)
    _say(f"audited {ctx.n} rollouts in {t_audit:.2f}s")

    # ---- calibration on a separate set of honest rollouts (other counters)
    thresholds_report: dict[str, Any] = {"calibrated": not ns.no_calibrate}
    calibration_digest = None
    if not ns.no_calibrate:
        ctx.audit_settings, calibration_digest = _calibrate(ctx, model_dir)
        _say(f"thresholds from calibration {calibration_digest[:16]}")
        base_res, _ = _audit(ctx, base_opened)
    for name, th in (("fp32", ctx.audit_settings.thresholds), ("bf16", ctx.audit_settings.bf16_thresholds)):
        thresholds_report[name] = {k: round(v, 6) for k, v in asdict(th).items()}

    honest: dict[str, float] = {}
    attacks: dict[str, float] = {}
    stale_changed = None
    cherry_identical = None
    copied_skipped = None
    calib_honest: dict[str, Any] = {}
    calib_attack: dict[str, Any] = {}

    producer_honest: dict[str, float | None] = {}
    producer_by_seed: dict[str, list[float]] = {}

    def honest_case(name: str, res: list[Any], precision: str = "fp32") -> None:
        honest[name] = _frac_failed(res)
        producer_honest[name] = _producer_flagged(res, _producer_limit(ctx.audit_settings, precision))
        calib_honest[name] = _summary(res, attack=False)
        bad = [r for r in res if not r.passed]
        _say(f"honest {name}: false positives {honest[name]}" + (f" ({bad[0].reason}: {bad[0].detail})" if bad else ""))

    attacks_by_seed: dict[str, list[float]] = {}

    def attack_case(name: str, res: list[Any]) -> None:
        frac = _frac_failed(res)
        attacks_by_seed.setdefault(name, []).append(frac)
        attacks[name] = min(attacks_by_seed[name])
        flagged = _producer_flagged(res, _producer_limit(ctx.audit_settings, "fp32"))
        if flagged is not None:
            producer_by_seed.setdefault(name, []).append(flagged)
        if name not in calib_attack:
            calib_attack[name] = _summary(res, attack=True)
        _say(f"attack {name} (seed {len(attacks_by_seed[name]) - 1}): detected {frac}")

    # ---- honest variations
    if want("kv_cache_vs_prefill"):
        honest_case("kv_cache_vs_prefill", base_res)
    bf16_opened = None
    if want("fp32_vs_bf16"):
        m = _bf16(ctx.model)
        bf16_opened = _open(_make_records(ctx, _engine(m, tok, max_batch=64)).records)
        honest_case("fp32_vs_bf16", _audit(ctx, bf16_opened, settings=replace(ctx.audit_settings, precision="bf16"))[0], "bf16")
        if want("precision_lie"):  # the same records claimed in an fp32 run
            attack_case("precision_lie", _audit(ctx, bf16_opened)[0])
    if want("batch_size"):
        honest_case("batch_size", _audit(ctx, _open(_make_records(ctx, _engine(ctx.model, tok, max_batch=1)).records))[0])
    if want("padding_side"):
        honest_case("padding_side", _audit(ctx, base_opened, settings=replace(ctx.audit_settings, padding_side="left"))[0])
    if want("threads"):
        honest_case("threads", _audit(ctx, _open(_make_records(ctx, _engine(ctx.model, tok, max_batch=64, threads=1)).records))[0])
    if want("attention_impl"):
        m = _eager(ctx.model)
        honest_case("attention_impl", _audit(ctx, _open(_make_records(ctx, _engine(m, tok, max_batch=64)).records))[0])

    # ---- the attack matrix, repeated over SEEDS (other tasks, sampler seeds, perturbation
    # and initialisation seeds); `attacks` reports the minimum detection per attack
    base_by_seed = base_opened
    for seed in range(ns.seeds):
        ctx.counter0 = seed * SEED_COUNTER_STRIDE
        base_opened = base_by_seed if seed == 0 else _open(_make_records(ctx, base_engine).records)
        # ---- attacks with another model
        for name, make in (
            ("other_model", lambda seed=seed: _other_model(ctx, seed)),
            ("perturbed_weights_1pct", lambda seed=seed: _perturbed(ctx.model, 0.01, 3 + seed)),
            ("dropped_layer", lambda: _dropped_layer(ctx.model)),
            ("int8_quantized", lambda: _int8(ctx.model)),
        ):
            if want(name):
                eng = _engine(make(), tok, max_batch=64)
                attack_case(name, _audit(ctx, _open(_make_records(ctx, eng).records))[0])
        if want("stale_version"):
            newer = _one_training_step(ctx, base_opened)
            stale_changed = _changed_fraction(ctx.model, newer)
            _say(f"one training step changed {stale_changed:.2%} of the bf16 weights")
            attack_case("stale_version", _audit(ctx, base_opened, model=newer)[0])

        # ---- attacks on sampling and the task
        if want("prompt_changed"):
            attack_case("prompt_changed", _audit(ctx, _open(_make_records(ctx, base_engine, prompt_offset=10**6).records))[0])
        if want("temperature_lie"):
            attack_case("temperature_lie", _audit(ctx, _open(_make_records(ctx, base_engine, gen_temperature=0.7).records))[0])
        if want("cherry_pick"):
            own = lambda s, k: (s * 6364136223846793005 + 1442695040888963407 * (k + 1)) % 2**64  # noqa: E731
            made = _make_records(ctx, base_engine, seed_fn=own, pick_of=4)
            picked = _open(made.records)
            # a pick equal to the assigned seed's own sample is no cheat (and cannot be seen)
            altered = [p for p, b in zip(picked, base_opened, strict=True)
                       if p.body.completion_ids != b.body.completion_ids]
            cherry_identical = len(picked) - len(altered)
            attack_case("cherry_pick", _audit(ctx, altered)[0] if altered else [])

        # ---- edited records (careful attacker: re-proved, re-scored, re-signed)
        gen = torch.Generator().manual_seed(5 + seed)
        eos = set(base_engine.eos_token_ids)
        vocab = base_engine.vocab_size
        non_eos = [t for t in range(vocab) if t not in eos]

        def edited(fn: Any, opened: list[Any] = base_opened) -> list[Any]:
            bodies = [fn(ro.body) for ro in opened]
            bodies = _reprove(ctx, bodies)
            return _open([_resign(ctx, ro, b) for ro, b in zip(opened, bodies, strict=True)])

        def edit_token(b: Any, non_eos: list[int] = non_eos, gen: Any = gen) -> Any:
            ids = list(b.completion_ids)
            i = len(ids) // 2
            choice = [t for t in non_eos if t != ids[i]]
            ids[i] = choice[int(torch.randint(len(choice), (1,), generator=gen))]
            return replace(b, completion_ids=tuple(ids))

        def truncate(b: Any) -> Any:
            k = max(1, len(b.completion_ids) // 2)
            if k == len(b.completion_ids):  # a one-token completion: drop its last (only) EOS
                return replace(b, completion_ids=b.completion_ids, finish_reason="length" if b.finish_reason == "eos" else "eos")
            return replace(b, completion_ids=b.completion_ids[:k], logprobs=b.logprobs[:k])

        def extend(b: Any, non_eos: list[int] = non_eos, gen: Any = gen) -> Any:
            extra = tuple(non_eos[int(torch.randint(len(non_eos), (1,), generator=gen))] for _ in range(4))
            return replace(b, completion_ids=b.completion_ids + extra, logprobs=b.logprobs + (-1.0,) * 4)

        if want("token_edited"):
            attack_case("token_edited", _audit(ctx, edited(edit_token))[0])
        if want("truncated"):
            attack_case("truncated", _audit(ctx, edited(truncate))[0])
        if want("extended"):
            attack_case("extended", _audit(ctx, edited(extend))[0])
        if want("proof_copied"):
            bodies = [ro.body for ro in base_opened]
            copied = []
            for i, ro in enumerate(base_opened):
                need = len(ro.body.proofs)
                # the next rollout whose proofs differ (a group shares prompts, and a
                # confident policy often its completions, hence its proofs too)
                for d in range(1, len(bodies)):
                    donor = bodies[(i + d) % len(bodies)]
                    pr = tuple((list(donor.proofs) * need)[:need])
                    if pr != ro.body.proofs:
                        copied.append(_resign(ctx, ro, replace(ro.body, proofs=pr)))
                        break
            copied_skipped = len(base_opened) - len(copied)
            attack_case("proof_copied", _audit(ctx, _open(copied))[0] if copied else [])
        if want("zero_proofs"):
            zeroed = [_resign(ctx, ro, replace(ro.body, proofs=tuple(bytes(len(p)) for p in ro.body.proofs)))
                      for ro in base_opened]
            attack_case("zero_proofs", _audit(ctx, _open(zeroed))[0])

    ctx.counter0 = 0
    base_opened = base_by_seed

    # ---- batch invariance: each record's verdict and reason, audited together vs alone
    invariance_sets = [(base_opened, ctx.audit_settings)]
    if bf16_opened is not None:
        invariance_sets.append((bf16_opened, replace(ctx.audit_settings, precision="bf16")))
    mismatches = sum(_batch_invariance_mismatches(ctx, o, st) for o, st in invariance_sets)
    _say(f"batch invariance: {mismatches} verdicts differ between together and alone")
    streams_ok, stream_cases = _stream_cases(ctx, model_dir, base.records)
    _say(f"stream cases failed correctly: {streams_ok}/{len(stream_cases)} {stream_cases}")

    sensitivity = _sensitivity(ctx, quick) if not ns.no_sensitivity else None

    chunk = ctx.manifest.proof_chunk
    gen_time = min(t_with)
    result: dict[str, Any] = {
        "model": "builtin:tiny" if ns.hidden is None else f"random-init hidden {ns.hidden}",
        "hidden_size": int(ctx.model.config.hidden_size),
        "rollouts_per_case": ctx.n,
        "completion_tokens": base.tokens,
        "proof_bytes_per_token": round(base.proof_bytes / max(1, base.chunks * chunk), 4),
        "proof_bytes_per_generated_token": round(base.proof_bytes / max(1, base.tokens), 4),
        "proof_build_overhead_pct": _paired_overhead_pct(t_with, t_without),
        "proof_build_seconds": round(statistics.median(proof_s), 4),
        "proof_build_pct_of_generation": round(100 * statistics.median(proof_s) / min(t_without), 2),
        "generation_seconds": round(gen_time, 3),
        "audit_seconds": round(t_audit, 3),
        "verify_speedup": round(gen_time / t_audit, 2),
        "proof_build_overhead_cpu_pct": _paired_overhead_pct(c_with, c_without),
        "verify_speedup_cpu": round(min(c_with) / min(c_audits), 2),
        "stale_weights_changed_frac": None if stale_changed is None else round(stale_changed, 5),
        "cherry_pick_identical_to_honest": cherry_identical,
        "proof_copied_no_distinct_donor": copied_skipped,
        "thresholds": thresholds_report,
        "calibration_digest": calibration_digest,
        "attacks": attacks,
        "sensitivity": sensitivity,
        "batch_invariance_mismatches": mismatches,
        "stream_cases_failed_correctly": streams_ok,
        "stream_cases": stream_cases,
        "attack_seeds": ns.seeds,
        "attacks_by_seed": attacks_by_seed,
        "honest": honest,
        "producer": {
            "window": _producer_window(),
            "statistic": "logprob_err_mean",
            "limits": {p: _producer_limit(ctx.audit_settings, p) for p in ("fp32", "bf16")},
            "attacks": {k: min(v) for k, v in producer_by_seed.items()},
            "attacks_by_seed": producer_by_seed,
            "honest_flagged": producer_honest,
        },
        "timing_threads": 1,
        "generation_batch": DEFAULT_BATCH_SIZE,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - t_start, 1),
        "calibration": {"honest": calib_honest, "attacks": calib_attack},
    }
    return result
