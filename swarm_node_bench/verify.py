"""`swarm-node bench verify [--quick] [--json] [--hidden H] [--n N] [--fp N]`: proofs and audits.

`--fp N` runs only the false-fail measurement: N honest records (transformers engine, the
run's settings and calibrated limits) over `--seeds` producers, each its own tasks and
sampler seeds; `fp_false_fails`, `fp_reasons` and `fp_rate_upper95`, the exact one-sided
95 % upper bound on the per-record false-fail rate (3 / N when none fail).

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
How records are made, edited and audited is `swarm_node_bench.parts.verify_records`, the changed models
the cases generate with `swarm_node_bench.parts.verify_models`; this module holds the cases, the
sensitivity sweep and the report.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack

from node.commands import audit as audit_cmd
from node.commands.calibrate import ensure_calibration, measure
from node.console import sayer
from node.errors import CommandError
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.rollout import write_records
from protocol.wire import RolloutRecord
from swarm_node_bench.parts.verify_models import (
    bf16_copy,
    changed_fraction,
    dropped_layer,
    eager,
    int8,
    one_training_step,
    other_model,
    perturbed,
)
from swarm_node_bench.parts.verify_records import (
    Ctx,
    Made,
    audit,
    canonical_bf16,
    edit_token,
    edited,
    extend,
    make_engine,
    make_records,
    open_records,
    resign,
    truncate,
)
from trainer import tiny_policy
from trainer.model_dir import load_model_dir, save_model_dir
from trainer.produce import DEFAULT_BATCH_SIZE
from trainer.tasks import TaskSet
from verify.calibration import FILE_NAME, apply, decode_calibration, encode_calibration
from verify.producer import WINDOW, ProducerTally

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
# The attack matrix runs once per seed (task counters SEED_COUNTER_STRIDE apart); each
# attack reports its minimum detection over the seeds.
SEEDS = 3
SEED_COUNTER_STRIDE = 100_000


_say = sayer("bench verify")


# ------------------------------------------------------------------ setup


def setup(hidden: int | None, n: int, quick: bool) -> tuple[Ctx, Any]:
    """The context of the cases: the model (built-in, or random with `hidden`), tokenizer, tasks, manifest, audit settings."""
    from trainer.judge import make_judge  # deferred: heavy import
    from verify.auditor import AuditSettings  # deferred: heavy import

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
        _say(
            f"random-init Qwen2, hidden {hidden}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params"
        )
    model = canonical_bf16(model.eval())
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


def _paired_overhead_pct(with_: list[float], without: list[float]) -> float:
    """Median over rounds of (with / without - 1), in percent."""
    return round(
        100 * statistics.median(w / wo - 1 for w, wo in zip(with_, without, strict=True)), 2
    )


# ------------------------------------------------------------------ calibration


def calibrate(ctx: Ctx, model_dir: Any) -> tuple[Any, str]:
    """The audit limits from the model's calibration file (`swarm-node calibrate`; measured
    and cached now if the model has none yet). A random-init model (`--hidden`) has no
    directory: the same procedure measures it (`node.commands.calibrate.measure`), in the
    open and reported, on tasks the benchmark cases never see."""

    if model_dir is not None:
        ensure_calibration(model_dir, force=False, say=_say)
        data = (model_dir / FILE_NAME).read_bytes()
    else:
        regimes, measured = measure(
            ctx.model, ctx.tokenizer, ctx.manifest, n=max(8, ctx.n // 4), say=_say
        )
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


def rank1_changed(model: Any, name: str, rel: float, seed: int, quick: bool) -> Any:
    """A copy of `model` with a rank-1 change of relative Frobenius size `rel` to one
    matrix (a vector for the norm)."""
    import torch  # deferred: heavy import

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
        limit = producer_limit(ctx.audit_settings, precision)
        table: dict[str, Any] = {}
        by_producer: dict[str, Any] = {}
        for name in _sens_matrices(ctx.model, quick):
            table[name] = by_producer[name] = None
            for k, rel in enumerate(SENS_SIZES):
                worker = rank1_changed(ctx.model, name, rel, seed=k, quick=quick)
                if precision == "bf16":
                    worker = bf16_copy(worker)
                made = make_records(sctx, make_engine(worker, ctx.tokenizer, max_batch=64))
                res = audit(ctx, open_records(made.records), settings=settings)[0]
                if table[name] is None and _frac_failed(res) >= SENS_TARGET:
                    table[name] = rel
                flagged = _producer_flagged(res, limit)
                if by_producer[name] is None and flagged is not None and flagged >= SENS_TARGET:
                    by_producer[name] = rel
                if table[name] is not None and (
                    by_producer[name] is not None or n < _producer_window()
                ):
                    break
            _say(
                f"sensitivity {precision} {name}: smallest detected {table[name]} per record, "
                f"{by_producer[name]} per producer"
            )
        weakest = max(table, key=lambda k: float("inf") if table[k] is None else table[k])
        weakest_p = max(
            by_producer, key=lambda k: float("inf") if by_producer[k] is None else by_producer[k]
        )
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
    together, _ = audit(ctx, opened, settings=settings)
    alone = [audit(ctx, [ro], settings=settings)[0][0] for ro in opened]
    return sum(
        (a.passed, a.reason) != (b.passed, b.reason) for a, b in zip(together, alone, strict=True)
    )


def _stream_cases(ctx: Ctx, model_dir: Any, records: list[bytes]) -> tuple[int, dict[str, bool]]:
    """Record files that must fail, through `swarm-node audit`: a truncated stream, trailing
    garbage, an empty file, an oversized record between good ones. Correct: exit 1, the bad
    item's line has its reason, every good record still passes."""

    buf = io.BytesIO()
    write_records(buf, records[:2])
    good = buf.getvalue()
    oversized = msgpack.packb(b"\0" * (RolloutRecord.MAX_BYTES + 1), use_bin_type=True)
    assert oversized is not None
    cases = {  # name: (bytes, reasons expected line by line)
        "truncated": (good + b"\xc4\x80", ["ok", "ok", "stream-truncated"]),
        "trailing_garbage": (good + b"\x93\x01\x02", ["ok", "ok", "stream-garbage"]),
        "empty": (b"", ["stream-empty"]),
        "oversized": (good + oversized + good, ["ok", "ok", "record-too-large", "ok", "ok"]),
    }
    out: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

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

    tally = ProducerTally(limit)
    flagged = sum(  # the records' counters are consecutive: record i is counter0 + i
        tally.add(b"p", i, i.to_bytes(4, "big"), r.metrics) is not None
        for i, r in enumerate(results)
    )
    blocks = [results[k : k + WINDOW] for k in range(0, len(results) - WINDOW + 1, WINDOW)]
    windows = sum(all(tally.stat in r.metrics for r in b) for b in blocks)
    return round(flagged / windows, 4) if windows else None


def _producer_window() -> int:
    return WINDOW


def producer_limit(settings: Any, precision: str) -> float:
    """The producer statistic's limit at `precision` under `settings`."""
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
    ap.add_argument(
        "--seeds", type=int, default=None, help="attack-matrix seeds (default 3; quick 1)"
    )
    ap.add_argument("--fp", type=int, default=None, help="false-fail run over N honest records")
    try:
        ns = ap.parse_args(args)
    except SystemExit:
        raise CommandError(
            f"bench verify: bad arguments {args} (know --hidden H, --n N, --only a,b, --no-calibrate, --no-sensitivity, --seeds S, --fp N)"
        ) from None
    if ns.fp is not None and not 1 <= ns.fp <= 100_000:
        raise CommandError(f"--fp must be in [1, 100000], got {ns.fp}")
    if ns.hidden is not None and not 16 <= ns.hidden <= 8192:
        raise CommandError(f"--hidden must be in [16, 8192], got {ns.hidden}")
    if ns.n is None:
        ns.n = QUICK_N if quick else FULL_N
    if ns.seeds is None:
        ns.seeds = 1 if quick else SEEDS
    if not 1 <= ns.seeds <= 16:
        raise CommandError(f"--seeds must be in [1, 16], got {ns.seeds}")
    return ns


@dataclass
class Baseline:
    """The honest rollouts of seed 0 and the timing rounds that made and audited them.

    Timed single-threaded (generation and audit alike) and as CPU seconds: the machine is
    shared, and busy-waiting thread pools make multi-threaded timings meaningless there.
    Interleaved rounds, best of each."""

    made: Made  # the last round's records with proofs
    t_with: list[float]  # wall seconds per round: generation plus proof building
    t_without: list[float]  # wall seconds per round: generation alone
    c_with: list[float]  # the same as CPU seconds
    c_without: list[float]
    proof_s: list[float]  # proof building alone per round
    t_audits: list[float] = field(default_factory=list)  # wall seconds per audit round
    c_audits: list[float] = field(default_factory=list)
    opened: list[Any] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)  # the audit's verdicts on `opened`


def _time_generation(ctx: Ctx, rounds: int) -> Baseline:
    """Generation timed with and without proofs, at the worker's usual batch size
    (`trainer.produce.DEFAULT_BATCH_SIZE`), one thread."""

    timing_engine = make_engine(ctx.model, ctx.tokenizer, max_batch=DEFAULT_BATCH_SIZE, threads=1)
    make_records(replace(ctx, n=min(ctx.n, 4)), timing_engine)  # warm-up
    t_without, t_with, c_without, c_with, proof_s, made_with = [], [], [], [], [], None
    for r in range(rounds):
        # each round is a pair, its order alternating, so a drift of the shared machine's
        # speed within a round favours neither side; the overhead is the median pair's
        for with_proofs in (r % 2 == 1, r % 2 == 0):
            c0 = time.process_time()
            made = make_records(ctx, timing_engine, proofs=with_proofs)
            cpu = time.process_time() - c0
            if with_proofs:
                t_with.append(made.gen_seconds + made.proof_seconds)
                c_with.append(cpu)
                proof_s.append(made.proof_seconds)
                made_with = made
            else:
                t_without.append(made.gen_seconds)
                c_without.append(cpu)
    assert made_with is not None
    _say(
        f"generated {ctx.n} rollouts: {min(t_without):.2f}s without proofs, {min(t_with):.2f}s with"
    )
    return Baseline(made_with, t_with, t_without, c_with, c_without, proof_s)


def _time_audit(ctx: Ctx, base: Baseline, rounds: int) -> None:
    """The baseline's records opened and audited `rounds` times, one thread."""
    from trainer.engine_hf import torch_threads  # deferred: heavy import

    base.opened = open_records(base.made.records)
    with torch_threads(1):
        for _ in range(rounds):
            c0 = time.process_time()
            base.results, t = audit(ctx, base.opened)
            base.c_audits.append(time.process_time() - c0)
            base.t_audits.append(t)
    _say(f"audited {ctx.n} rollouts in {min(base.t_audits):.2f}s")


def _thresholds(
    ctx: Ctx, ns: argparse.Namespace, model_dir: Any
) -> tuple[dict[str, Any], str | None]:
    """Sets ctx.audit_settings from the calibration (unless --no-calibrate); the limits
    used, per precision, and the calibration's digest."""
    report: dict[str, Any] = {"calibrated": not ns.no_calibrate}
    digest = None
    if not ns.no_calibrate:
        ctx.audit_settings, digest = calibrate(ctx, model_dir)
        _say(f"thresholds from calibration {digest[:16]}")
    for name, th in (
        ("fp32", ctx.audit_settings.thresholds),
        ("bf16", ctx.audit_settings.bf16_thresholds),
    ):
        report[name] = {k: round(v, 6) for k, v in asdict(th).items()}
    return report, digest


@dataclass
class Cases:
    """What the honest variations and the attacks found, filled case by case."""

    settings: Any  # the audit settings; the per-producer limits come from them
    honest: dict[str, float] = field(default_factory=dict)  # false-positive fraction
    attacks: dict[str, float] = field(default_factory=dict)  # minimum detection over seeds
    attacks_by_seed: dict[str, list[float]] = field(default_factory=dict)
    producer_honest: dict[str, float | None] = field(default_factory=dict)
    producer_by_seed: dict[str, list[float]] = field(default_factory=dict)
    calib_honest: dict[str, Any] = field(default_factory=dict)
    calib_attack: dict[str, Any] = field(default_factory=dict)  # the first seed's
    stale_changed: float | None = None
    cherry_identical: int | None = None
    copied_skipped: int | None = None

    def add_honest(self, name: str, res: list[Any], precision: str = "fp32") -> None:
        """Record an honest case's results."""
        self.honest[name] = _frac_failed(res)
        self.producer_honest[name] = _producer_flagged(
            res, producer_limit(self.settings, precision)
        )
        self.calib_honest[name] = _summary(res, attack=False)
        bad = [r for r in res if not r.passed]
        _say(
            f"honest {name}: false positives {self.honest[name]}"
            + (f" ({bad[0].reason}: {bad[0].detail})" if bad else "")
        )

    def add_attack(self, name: str, res: list[Any]) -> None:
        """Record an attack case's results (one seed)."""
        frac = _frac_failed(res)
        self.attacks_by_seed.setdefault(name, []).append(frac)
        self.attacks[name] = min(self.attacks_by_seed[name])
        flagged = _producer_flagged(res, producer_limit(self.settings, "fp32"))
        if flagged is not None:
            self.producer_by_seed.setdefault(name, []).append(flagged)
        if name not in self.calib_attack:
            self.calib_attack[name] = _summary(res, attack=True)
        _say(f"attack {name} (seed {len(self.attacks_by_seed[name]) - 1}): detected {frac}")


def _honest_cases(ctx: Ctx, cases: Cases, base: Baseline, want: Any) -> list[Any] | None:
    """The honest variations (and precision_lie, which reuses the bf16 records); returns
    the bf16 worker's opened records, if made."""
    tok = ctx.tokenizer
    if want("kv_cache_vs_prefill"):
        cases.add_honest("kv_cache_vs_prefill", base.results)
    bf16_opened = None
    if want("fp32_vs_bf16"):
        m = bf16_copy(ctx.model)
        bf16_opened = open_records(make_records(ctx, make_engine(m, tok, max_batch=64)).records)
        cases.add_honest(
            "fp32_vs_bf16",
            audit(ctx, bf16_opened, settings=replace(ctx.audit_settings, precision="bf16"))[0],
            "bf16",
        )
        if want("precision_lie"):  # the same records claimed in an fp32 run
            cases.add_attack("precision_lie", audit(ctx, bf16_opened)[0])
    if want("batch_size"):
        cases.add_honest(
            "batch_size",
            audit(
                ctx,
                open_records(make_records(ctx, make_engine(ctx.model, tok, max_batch=1)).records),
            )[0],
        )
    if want("padding_side"):
        cases.add_honest(
            "padding_side",
            audit(ctx, base.opened, settings=replace(ctx.audit_settings, padding_side="left"))[0],
        )
    if want("threads"):
        cases.add_honest(
            "threads",
            audit(
                ctx,
                open_records(
                    make_records(ctx, make_engine(ctx.model, tok, max_batch=64, threads=1)).records
                ),
            )[0],
        )
    if want("attention_impl"):
        m = eager(ctx.model)
        cases.add_honest(
            "attention_impl",
            audit(ctx, open_records(make_records(ctx, make_engine(m, tok, max_batch=64)).records))[
                0
            ],
        )
    return bf16_opened


def _model_attacks(ctx: Ctx, cases: Cases, base_opened: list[Any], seed: int, want: Any) -> None:
    """Rollouts generated by another model than claimed (stale_version: the claimed one is
    a training step newer)."""
    for name, make in (
        ("other_model", lambda: other_model(ctx, seed)),
        ("perturbed_weights_1pct", lambda: perturbed(ctx.model, 0.01, 3 + seed)),
        ("dropped_layer", lambda: dropped_layer(ctx.model)),
        ("int8_quantized", lambda: int8(ctx.model)),
    ):
        if want(name):
            eng = make_engine(make(), ctx.tokenizer, max_batch=64)
            cases.add_attack(name, audit(ctx, open_records(make_records(ctx, eng).records))[0])
    if want("stale_version"):
        newer = one_training_step(ctx, base_opened)
        cases.stale_changed = changed_fraction(ctx.model, newer)
        _say(f"one training step changed {cases.stale_changed:.2%} of the bf16 weights")
        cases.add_attack("stale_version", audit(ctx, base_opened, model=newer)[0])


def _own_seed(s: int, k: int) -> int:
    """The cherry-picking worker's k-th own sampler seed for assigned seed s."""
    return (s * 6364136223846793005 + 1442695040888963407 * (k + 1)) % 2**64


def _sampling_attacks(
    ctx: Ctx, cases: Cases, base_opened: list[Any], engine: Any, want: Any
) -> None:
    """Lies about the prompt, the temperature and the sampler seed."""
    if want("prompt_changed"):
        cases.add_attack(
            "prompt_changed",
            audit(ctx, open_records(make_records(ctx, engine, prompt_offset=10**6).records))[0],
        )
    if want("temperature_lie"):
        cases.add_attack(
            "temperature_lie",
            audit(ctx, open_records(make_records(ctx, engine, gen_temperature=0.7).records))[0],
        )
    if want("cherry_pick"):
        picked = open_records(make_records(ctx, engine, seed_fn=_own_seed, pick_of=4).records)
        # a pick equal to the assigned seed's own sample is no cheat (and cannot be seen)
        altered = [
            p
            for p, b in zip(picked, base_opened, strict=True)
            if p.body.completion_ids != b.body.completion_ids
        ]
        cases.cherry_identical = len(picked) - len(altered)
        cases.add_attack("cherry_pick", audit(ctx, altered)[0] if altered else [])


def _edit_attacks(
    ctx: Ctx, cases: Cases, base_opened: list[Any], engine: Any, seed: int, want: Any
) -> None:
    """Edited records (careful attacker: re-proved, re-scored, re-signed)."""
    import torch  # deferred: heavy import

    gen = torch.Generator().manual_seed(5 + seed)  # shared by the edits, in this order
    eos = set(engine.eos_token_ids)
    non_eos = [t for t in range(engine.vocab_size) if t not in eos]
    if want("token_edited"):
        cases.add_attack(
            "token_edited",
            audit(ctx, edited(ctx, base_opened, lambda b: edit_token(b, non_eos, gen)))[0],
        )
    if want("truncated"):
        cases.add_attack("truncated", audit(ctx, edited(ctx, base_opened, truncate))[0])
    if want("extended"):
        cases.add_attack(
            "extended", audit(ctx, edited(ctx, base_opened, lambda b: extend(b, non_eos, gen)))[0]
        )


def _copied_proofs(ctx: Ctx, opened: list[Any]) -> list[bytes]:
    """Each record re-signed with the proofs of the next rollout whose proofs differ (a
    group shares prompts, and a confident policy often its completions, hence its proofs
    too); records with no such donor are left out."""
    bodies = [ro.body for ro in opened]
    copied = []
    for i, ro in enumerate(opened):
        need = len(ro.body.proofs)
        for d in range(1, len(bodies)):
            donor = bodies[(i + d) % len(bodies)]
            pr = tuple((list(donor.proofs) * need)[:need])
            if pr != ro.body.proofs:
                copied.append(resign(ctx, ro, replace(ro.body, proofs=pr)))
                break
    return copied


def _proof_attacks(ctx: Ctx, cases: Cases, base_opened: list[Any], want: Any) -> None:
    """Proofs copied from another rollout, or all zero."""
    if want("proof_copied"):
        copied = _copied_proofs(ctx, base_opened)
        cases.copied_skipped = len(base_opened) - len(copied)
        cases.add_attack("proof_copied", audit(ctx, open_records(copied))[0] if copied else [])
    if want("zero_proofs"):
        zeroed = [
            resign(ctx, ro, replace(ro.body, proofs=tuple(bytes(len(p)) for p in ro.body.proofs)))
            for ro in base_opened
        ]
        cases.add_attack("zero_proofs", audit(ctx, open_records(zeroed))[0])


def _attack_matrix(ctx: Ctx, cases: Cases, base: Baseline, seeds: int, want: Any) -> None:
    """The attack matrix, repeated over `seeds` (other tasks, sampler seeds, perturbation
    and initialisation seeds); `attacks` reports the minimum detection per attack."""
    engine = make_engine(ctx.model, ctx.tokenizer, max_batch=64)
    for seed in range(seeds):
        ctx.counter0 = seed * SEED_COUNTER_STRIDE
        opened = base.opened if seed == 0 else open_records(make_records(ctx, engine).records)
        _model_attacks(ctx, cases, opened, seed, want)
        _sampling_attacks(ctx, cases, opened, engine, want)
        _edit_attacks(ctx, cases, opened, engine, seed, want)
        _proof_attacks(ctx, cases, opened, want)
    ctx.counter0 = 0


def _invariance(ctx: Ctx, base: Baseline, bf16_opened: list[Any] | None) -> int:
    """Batch invariance: records whose verdict and reason differ audited together vs alone."""
    invariance_sets = [(base.opened, ctx.audit_settings)]
    if bf16_opened is not None:
        invariance_sets.append((bf16_opened, replace(ctx.audit_settings, precision="bf16")))
    mismatches = sum(_batch_invariance_mismatches(ctx, o, st) for o, st in invariance_sets)
    _say(f"batch invariance: {mismatches} verdicts differ between together and alone")
    return mismatches


def _timing_report(ctx: Ctx, base: Baseline) -> dict[str, Any]:
    """Proof sizes and the timing ratios of the baseline."""
    made, chunk = base.made, ctx.manifest.proof_chunk
    gen_time, t_audit = min(base.t_with), min(base.t_audits)
    return {
        "completion_tokens": made.tokens,
        "proof_bytes_per_token": round(made.proof_bytes / max(1, made.chunks * chunk), 4),
        "proof_bytes_per_generated_token": round(made.proof_bytes / max(1, made.tokens), 4),
        "proof_build_overhead_pct": _paired_overhead_pct(base.t_with, base.t_without),
        "proof_build_seconds": round(statistics.median(base.proof_s), 4),
        "proof_build_pct_of_generation": round(
            100 * statistics.median(base.proof_s) / min(base.t_without), 2
        ),
        "generation_seconds": round(gen_time, 3),
        "audit_seconds": round(t_audit, 3),
        "verify_speedup": round(gen_time / t_audit, 2),
        "proof_build_overhead_cpu_pct": _paired_overhead_pct(base.c_with, base.c_without),
        "verify_speedup_cpu": round(min(base.c_with) / min(base.c_audits), 2),
    }


def _producer_report(ctx: Ctx, cases: Cases) -> dict[str, Any]:
    return {
        "window": _producer_window(),
        "statistic": "logprob_err_mean",
        "limits": {p: producer_limit(ctx.audit_settings, p) for p in ("fp32", "bf16")},
        "attacks": {k: min(v) for k, v in cases.producer_by_seed.items()},
        "attacks_by_seed": cases.producer_by_seed,
        "honest_flagged": cases.producer_honest,
    }


# ------------------------------------------------------------------ false fails

FP_COUNTER0 = 3 * 10**7  # task counters no other case uses
FP_BATCH = 64  # records generated and audited together


def upper_bound_95(fails: int, n: int) -> float:
    """The exact (Clopper-Pearson) one-sided 95 % upper bound on a per-record rate after
    `fails` of `n`: the p at which P(X <= fails) = 0.05 (bisection, no SciPy)."""
    if fails >= n:
        return 1.0

    def cdf(p: float) -> float:
        return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(fails + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 0.05 else (lo, mid)
    return hi


def false_fails(ctx: Ctx, n: int, seeds: int) -> dict[str, Any]:
    """Audit `n` honest records (transformers engine, the run's settings and limits),
    spread over `seeds` producers (each its own tasks and sampler seeds); the false-fail
    count, its reasons and the upper 95 % bound on the per-record false-fail rate."""
    engine = make_engine(ctx.model, ctx.tokenizer, max_batch=DEFAULT_BATCH_SIZE)
    per = -(-n // seeds)
    fails: dict[str, int] = {}
    done = tokens = 0
    for s in range(seeds):
        identity = Identity.from_private_bytes(content_id(b"bench-verify-fp-%d" % s))
        for start in range(0, min(per, n - done), FP_BATCH):
            k = min(FP_BATCH, per - start, n - done)
            c = replace(ctx, identity=identity, n=k, counter0=FP_COUNTER0 + s * per + start)
            opened = open_records(make_records(c, engine).records)
            results, _ = audit(ctx, opened)
            for ro, r in zip(opened, results, strict=True):
                tokens += len(ro.body.completion_ids)
                if not r.passed:
                    fails[r.reason] = fails.get(r.reason, 0) + 1
            done += k
            _say(f"false fails: {sum(fails.values())} of {done} honest records audited")
    total = sum(fails.values())
    return {
        "fp_records": done,
        "fp_producers": seeds,
        "fp_completion_tokens": tokens,
        "fp_false_fails": total,
        "fp_reasons": fails,
        "fp_rate_upper95": round(upper_bound_95(total, done), 6),
        "engine": "hf",
    }


def run(quick: bool, args: list[str]) -> dict:
    """Run the cases (arguments as in the module docstring); returns the figures."""
    import torch  # deferred: heavy import

    ns = _parse(args, quick)
    only = set(ns.only.split(",")) if ns.only else None
    t_start = time.perf_counter()
    ctx, model_dir = setup(ns.hidden, ns.n, quick)
    if ns.fp is not None:
        thresholds_report, calibration_digest = _thresholds(ctx, ns, model_dir)
        return {
            "model": "builtin:tiny" if ns.hidden is None else f"random-init hidden {ns.hidden}",
            **false_fails(ctx, ns.fp, ns.seeds),
            "precision": ctx.audit_settings.precision,
            "calibration_digest": calibration_digest,
            "seconds": round(time.perf_counter() - t_start, 1),
        }

    def want(name: str) -> bool:
        return only is None or name in only

    rounds = 1 if quick else 9  # a run takes ~3.5 s; the machine drifts by more than 2%
    base = _time_generation(ctx, rounds)
    _time_audit(ctx, base, rounds + 1)
    # calibration on a separate set of honest rollouts (other counters)
    thresholds_report, calibration_digest = _thresholds(ctx, ns, model_dir)
    if not ns.no_calibrate:
        base.results, _ = audit(ctx, base.opened)
    cases = Cases(ctx.audit_settings)
    bf16_opened = _honest_cases(ctx, cases, base, want)
    _attack_matrix(ctx, cases, base, ns.seeds, want)
    mismatches = _invariance(ctx, base, bf16_opened)
    streams_ok, stream_cases = _stream_cases(ctx, model_dir, base.made.records)
    _say(f"stream cases failed correctly: {streams_ok}/{len(stream_cases)} {stream_cases}")
    sensitivity = _sensitivity(ctx, quick) if not ns.no_sensitivity else None
    return {
        "model": "builtin:tiny" if ns.hidden is None else f"random-init hidden {ns.hidden}",
        "hidden_size": int(ctx.model.config.hidden_size),
        "rollouts_per_case": ctx.n,
        **_timing_report(ctx, base),
        "stale_weights_changed_frac": None
        if cases.stale_changed is None
        else round(cases.stale_changed, 5),
        "cherry_pick_identical_to_honest": cases.cherry_identical,
        "proof_copied_no_distinct_donor": cases.copied_skipped,
        "thresholds": thresholds_report,
        "calibration_digest": calibration_digest,
        "attacks": cases.attacks,
        "sensitivity": sensitivity,
        "batch_invariance_mismatches": mismatches,
        "stream_cases_failed_correctly": streams_ok,
        "stream_cases": stream_cases,
        "attack_seeds": ns.seeds,
        "attacks_by_seed": cases.attacks_by_seed,
        "honest": cases.honest,
        "producer": _producer_report(ctx, cases),
        "timing_threads": 1,
        "generation_batch": DEFAULT_BATCH_SIZE,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - t_start, 1),
        "calibration": {"honest": cases.calib_honest, "attacks": cases.calib_attack},
    }
