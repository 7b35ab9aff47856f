"""The audit of rollouts: cheap checks first, then one batched prefill, then the model checks.

What this module owns: having a causal LM (any transformers `*ForCausalLM` object the
caller loaded) recompute the generated tokens' final hidden states and logits over
prompt + completion (`verify.prefill`), and combining the checks of `verify.checks` into
one verdict. It never loads a model or a tokenizer, never derives tasks itself (the caller
passes a `judge`, since tasks live in `trainer/`, which `verify/` must not import) and
never does network IO.

Order of an audit (the first failure is the verdict's reason; all failures are listed):
1. Cheap checks, no model: structure, sampling settings vs the run's, termination, proof
   format (one non-null, parseable proof per chunk), the task (the caller's judge
   re-derives the assignment; the sampler seed must equal the header's task seed) and the
   reward (re-scored by the judge). A rollout failing here is rejected without a prefill.
2. One prefill of prompt + completion per rollout, batched across rollouts (right padding,
   so real tokens keep their positions; up to `max_batch_tokens` padded tokens a batch,
   fewer on a CPU; rollouts of similar length share a batch; `verify.prefill`).
   Row `n_prompt - 1 + i` is the hidden state that chose completion token i.
3. Model checks: proof statistics (TOPLOC's, a far point counted as a mismatch, see
   `checks.FAR_MANT_ERR`) and signs, sampling replay, log-probs, drift. The LM head, the
   replay and the log-probs run in row chunks on the model's device (`verify.head`):
   no full-vocabulary logits beyond one chunk of rows, only per-token values kept.
4. One precision: the run fixes the workers' compute precision (`AuditSettings.precision`,
   the manifest's `verification.precision`) and the prefill runs at it (a converted copy
   of the model when the caller's differs), judged by that regime's limits only. There is
   no second pass at another precision: it would give a record that fails its own regime
   a second, looser budget. The metric `audit_precision_bits` says which precision judged.
5. Batch invariance: a rollout with a metric near its limit in the batched result (within
   a factor 2, `CLEAR`) is decided by a prefill of its own, so its verdict and reason do
   not depend on which other rollouts shared its batch; results clearly on one side of
   every limit stand as batched (so clear cheats cost no extra prefill).

Cost: one forward pass over prompt + completion, against the generation's one forward
pass per generated token; the bench measures the ratio (`verify_speedup`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from protocol.wire import Metric, Verdict
from verify import checks, toploc
from verify.head import replay_hidden
from verify.prefill import (  # noqa: F401 - prefill, prefill_shared: re-exported for callers
    DEFAULT_MAX_BATCH_TOKENS,
    hidden_rows,
    prefill,
    prefill_shared,
)
from verify.thresholds import CALIBRATED, STRICT, THRESHOLDS, Thresholds

# Per-record limit on prompt + completion tokens: a longer record fails (`too-large`)
# before any prefill. What a record costs the auditor: one prefill of its tokens (batched
# up to max_batch_tokens) and hidden states [T, H] for its T completion tokens; logits
# exist for one chunk of rows at a time (`verify.head`), whatever the batch.
DEFAULT_MAX_RECORD_TOKENS = 8_192


@dataclass(frozen=True, slots=True)
class TaskJudgement:
    """What the caller's judge found: `problem` is None when the prompt is the assigned
    task's; `reward` is the re-scored reward (None: not re-scored)."""

    problem: str | None = None
    reward: float | None = None


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """How a run's records are audited: proof shape, the workers' precision and each regime's
    limits."""

    chunk: int = toploc.CHUNK
    topk: int = toploc.TOPK
    precision: str = "fp32"  # the workers' compute precision (the run's); the only regime judged
    thresholds: Thresholds = STRICT  # the fp32 regime's limits (and the reward tolerance)
    bf16_thresholds: Thresholds = THRESHOLDS  # the bf16 regime's limits
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_record_tokens: int = DEFAULT_MAX_RECORD_TOKENS
    padding_side: str = "right"  # "left" uses explicit position ids (same result, up to noise)
    share_prompts: bool = (
        True  # shared prefixes once: a GRPO group's prompt, equal completion starts
    )
    expected_settings: Any = None  # a RunManifest (or same attributes): checked when given


def settings_for_run(run: Any) -> AuditSettings:
    """The audit settings a run manifest fixes: proof shape, sampling settings, the
    workers' compute precision (the only regime judged)."""
    return AuditSettings(
        chunk=run.proof_chunk,
        topk=run.proof_topk,
        expected_settings=run,
        precision=run.worker_precision,
    )


@dataclass(frozen=True, slots=True)
class AuditResult:
    """The verdict on one record: passed or the first failing reason, every failure, the metrics."""

    passed: bool
    reason: str  # "ok" or the first failing check's reason
    detail: str
    failures: tuple[str, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    reward_rescored: float | None = None

    def verdict(self, rollout_id: bytes, producer: bytes, claimed_reward: float) -> Verdict:
        """The wire `Verdict` (reward_rescored falls back to the claim when not re-scored;
        the metric `reward_rescored` is then absent)."""
        metrics = tuple(
            Metric(name=k[:64], value=_finite(v)) for k, v in sorted(self.metrics.items())
        )[:64]
        reward = self.reward_rescored if self.reward_rescored is not None else claimed_reward
        return Verdict(
            rollout_id=rollout_id,
            producer=producer,
            passed=self.passed,
            reason=self.reason,
            reward_rescored=float(min(1e6, max(-1e6, reward))),
            metrics=metrics,
        )


def _finite(v: float) -> float:
    v = float(v)
    if math.isnan(v):
        return -1.0
    return max(-1e30, min(1e30, v))


# ------------------------------------------------------------------ model helpers


def eos_token_ids(model: Any) -> frozenset[int]:
    """EOS ids from the model's generation config, else its config."""
    ids: Any = None
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids = getattr(gen, "eos_token_id", None)
    if ids is None:
        ids = getattr(model.config, "eos_token_id", None)
    if ids is None:
        return frozenset()
    if isinstance(ids, int):
        return frozenset([ids])
    return frozenset(int(i) for i in ids)


def vocab_size(model: Any) -> int:
    """Rows of the model's output embedding (its logits' width)."""
    return int(model.get_output_embeddings().weight.shape[0])


# ------------------------------------------------------------------ audit


def _combine(results: list[checks.CheckResult], reward: float | None) -> AuditResult:
    metrics: dict[str, float] = {}
    for r in results:
        metrics.update(r.metrics)
    failed = [r for r in results if not r.passed]
    if failed:
        first = failed[0]
        return AuditResult(
            False, first.reason, first.detail, tuple(f.reason for f in failed), metrics, reward
        )
    return AuditResult(True, "ok", "", (), metrics, reward)


def cheap_checks(
    body: Any,
    *,
    eos_ids: Collection[int],
    vocab: int,
    claimed_reward: float | None,
    judgement: TaskJudgement | None,
    settings: AuditSettings,
) -> list[checks.CheckResult]:
    """The checks that need no model. Any failure here makes a prefill pointless."""
    out = [checks.check_structure(body)]
    if not out[0].passed:
        return out
    ids = list(body.prompt_ids) + list(body.completion_ids)
    if len(ids) > settings.max_record_tokens:
        return [
            checks.check_failed(
                "structure",
                "too-large",
                f"{len(ids)} tokens > the audit's limit of {settings.max_record_tokens} per record",
            )
        ]
    if max(ids) >= vocab:
        return [
            checks.check_failed(
                "structure", "malformed", f"token id {max(ids)} outside the vocabulary of {vocab}"
            )
        ]
    out.append(checks.check_settings(body, settings.expected_settings))
    out.append(checks.check_termination(body, eos_ids))
    out.append(
        checks.check_proof_format(
            body.proofs, len(body.completion_ids), settings.chunk, settings.topk
        )
    )
    if judgement is not None:
        if judgement.problem is not None:
            out.append(checks.check_failed("task", "task-mismatch", judgement.problem))
        else:
            out.append(checks.check_ok("task"))
        if judgement.reward is not None and claimed_reward is not None:
            out.append(checks.check_reward(claimed_reward, judgement.reward, settings.thresholds))
    return out


def audit_bodies(
    bodies: Sequence[Any],
    model: Any,
    *,
    eos_ids: Collection[int] | None = None,
    claimed_rewards: Sequence[float | None] | None = None,
    judgements: Sequence[TaskJudgement | None] | None = None,
    settings: AuditSettings = AuditSettings(),
) -> list[AuditResult]:
    """Audit `RolloutBody` objects (or anything with the same attributes) against `model`
    with one batched prefill; one `AuditResult` per body, in order."""
    eos = frozenset(eos_ids) if eos_ids is not None else eos_token_ids(model)
    vocab = vocab_size(model)
    n = len(bodies)
    rewards = list(claimed_rewards) if claimed_rewards is not None else [None] * n
    judged = list(judgements) if judgements is not None else [None] * n
    early: list[list[checks.CheckResult]] = []
    for body, reward, judgement in zip(bodies, rewards, judged, strict=True):
        early.append(
            cheap_checks(
                body,
                eos_ids=eos,
                vocab=vocab,
                claimed_reward=reward,
                judgement=judgement,
                settings=settings,
            )
        )
    todo = [i for i in range(n) if all(r.passed for r in early[i])]
    late = _decide(model, bodies, todo, settings)
    if len(todo) > 1:
        # Batch invariance: a batched prefill rounds differently from a prefill of one
        # rollout (bf16 more than fp32), so a rollout whose batched result is not clear of
        # every limit is decided by a prefill of its own (see CLEAR).
        for i in todo:
            if not _clear(late[i], settings, len(bodies[i].completion_ids)):
                late[i] = _decide(model, bodies, [i], settings)[i]
    out = []
    for i in range(n):
        j = judged[i]
        out.append(_combine(early[i] + late.get(i, []), j.reward if j is not None else None))
    return out


# A rollout's batched result is final when no limited metric lies near its limit: each is
# at most CLEAR x its limit (clearly passing) or at least limit / CLEAR (clearly failing).
# Batch rounding moved honest bf16 metrics by up to ~45 % of their value on the test model
# (tests/test_verify_audit.py, 32 records, together vs alone); a metric cannot cross from
# one side of the band to the other alone unless batching changes it by a factor of 2, so
# every check, hence the verdict and its reason, comes out as it would alone. A zero limit
# (integer counts: signs, medians) has the band (0, 1).
CLEAR = 0.5


def _clear(results: list[checks.CheckResult], settings: AuditSettings, n_tokens: int) -> bool:
    """No limited metric in the band around its limit (see CLEAR) for a rollout of
    `n_tokens` completion tokens."""
    metrics: dict[str, float] = {}
    for r in results:
        metrics.update(r.metrics)
    th = (
        settings.bf16_thresholds
        if metrics.get("audit_precision_bits") == 16.0
        else settings.thresholds
    )
    limits = [(m, float(getattr(th, f))) for m, f in CALIBRATED.items()]
    limits.append(("sampling_mismatches", float(checks.near_ties_allowed(n_tokens, th))))
    limits.append(("proof_sign_mismatches", float(th.proof_sign_mismatches)))
    for m, limit in limits:
        v = metrics.get(m, 0.0)
        near = (0.0 < v < 1.0) if limit == 0.0 else (CLEAR * limit < v < limit / CLEAR)
        if near:
            return False
    return True


def _decide(
    model: Any, bodies: Sequence[Any], todo: Sequence[int], settings: AuditSettings
) -> dict[int, list[checks.CheckResult]]:
    """The model checks of `todo` at the run's precision, with that regime's limits."""
    return _model_checks(at_precision(model, settings.precision), bodies, todo, settings)


def _model_checks(
    model: Any, bodies: Sequence[Any], todo: Sequence[int], settings: AuditSettings
) -> dict[int, list[checks.CheckResult]]:
    seqs = [(bodies[i].prompt_ids, bodies[i].completion_ids) for i in todo]
    rows = hidden_rows(
        model, seqs, settings.max_batch_tokens, settings.padding_side, settings.share_prompts
    )
    hiddens = list(torch.split(rows.cpu(), [len(c) for _, c in seqs]))
    late: dict[int, list[checks.CheckResult]] = {}
    low = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    th = settings.bf16_thresholds if low else settings.thresholds
    bits = 16.0 if low else 32.0
    todo_bodies = [bodies[i] for i in todo]
    try:  # one batched proof verification for all rollouts; per rollout if any is bad
        chunk_lists = checks.proof_chunks_many(
            hiddens,
            [list(b.proofs) for b in todo_bodies],
            settings.chunk,
            settings.topk,
        )
        proof_res: list[list[checks.CheckResult]] = [
            checks.judge_proof_chunks(c, th) for c in chunk_lists
        ]
    except ValueError:  # ProofFormatError is a ValueError too
        proof_res = [
            checks.check_proofs(h, b.proofs, settings.chunk, settings.topk, th)
            for h, b in zip(hiddens, todo_bodies, strict=True)
        ]
    with torch.inference_mode():
        replays = replay_hidden(model.get_output_embeddings(), rows, todo_bodies)
    for k, i in enumerate(todo):
        body = bodies[i]
        res = proof_res[k]
        rep = replays[k]
        res.append(checks.check_sampling(rep, th))
        res.append(checks.check_logprobs(rep, body.logprobs, th))
        merged: dict[str, float] = {}
        for r in res:
            merged.update(r.metrics)
        res.append(checks.check_drift(merged, th))
        res.append(checks.check_ok("precision", {"audit_precision_bits": bits}))
        late[i] = res
    return late


PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_CONVERTED: dict[int, tuple[Any, str, Any]] = {}


def at_precision(model: Any, precision: str) -> Any:
    """`model` itself when its weights are in `precision`'s dtype, else a converted copy
    (cached: one copy at most, for the last model asked)."""
    dtype = PRECISION_DTYPES.get(precision)
    if dtype is None:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISION_DTYPES)}")
    if next(model.parameters()).dtype == dtype:
        return model

    hit = _CONVERTED.get(id(model))
    if hit is not None and hit[0] is model and hit[1] == precision:
        return hit[2]
    other = copy.deepcopy(model).to(dtype).eval()
    _CONVERTED.clear()
    _CONVERTED[id(model)] = (model, precision, other)
    return other


def audit_records(
    rollouts: Sequence[Any],
    model: Any,
    *,
    judge: Callable[[Any], TaskJudgement] | None = None,
    eos_ids: Collection[int] | None = None,
    settings: AuditSettings = AuditSettings(),
) -> list[AuditResult]:
    """Audit opened rollout records (`protocol.rollout.OpenedRollout`) with one batched
    prefill. The sampler seed must be the header's task seed; `judge(rollout)` (the
    caller's) re-derives the task and re-scores the completion."""
    judgements: list[TaskJudgement | None] = []
    for ro in rollouts:
        j = judge(ro) if judge is not None else None
        if ro.body.sampling_seed != ro.header.task_seed:
            j = TaskJudgement(
                problem=f"sampling seed {ro.body.sampling_seed} is not the task seed {ro.header.task_seed}",
                reward=j.reward if j is not None else None,
            )
        judgements.append(j)
    return audit_bodies(
        [ro.body for ro in rollouts],
        model,
        eos_ids=eos_ids,
        claimed_rewards=[ro.header.reward for ro in rollouts],
        judgements=judgements,
        settings=settings,
    )


def audit_many(
    rollouts: Sequence[Any],
    model: Any,
    *,
    judge: Callable[[Any], TaskJudgement] | None = None,
    eos_ids: Collection[int] | None = None,
    settings: AuditSettings = AuditSettings(),
) -> list[Verdict]:
    """`audit_records`, as wire `Verdict`s."""
    results = audit_records(rollouts, model, judge=judge, eos_ids=eos_ids, settings=settings)
    return [
        r.verdict(ro.rollout_id, ro.envelope.signer, ro.header.reward)
        for r, ro in zip(results, rollouts, strict=True)
    ]


def audit(
    rollout: Any,
    model: Any,
    *,
    judge: Callable[[Any], TaskJudgement] | None = None,
    eos_ids: Collection[int] | None = None,
    settings: AuditSettings = AuditSettings(),
) -> Verdict:
    """Audit one opened rollout record; returns the signed-ready `Verdict`."""
    return audit_many([rollout], model, judge=judge, eos_ids=eos_ids, settings=settings)[0]


_NO_LIMITS = Thresholds(
    proof_exp_mismatch_frac=1e300,
    proof_mant_mean=1e300,
    proof_mant_median=1e300,
    proof_exp_mismatch_frac_all=1e300,
    proof_mant_mean_all=1e300,
    proof_sign_mismatches=10**9,
    sampling_margin=1e300,
    sampling_near_ties_max=10**9,
    sampling_near_tie_rate=1e300,
    logprob_err_max=1e300,
    logprob_err_mean=1e300,
    drift=1e300,
)


def raw_metrics(
    model: Any, bodies: Sequence[Any], settings: AuditSettings = AuditSettings()
) -> list[dict[str, float]]:
    """The model checks' metrics of each body at `settings.precision`, with no limits
    applied: what calibration measures (`swarm-node calibrate`, the bench)."""
    st = replace(settings, thresholds=_NO_LIMITS, bf16_thresholds=_NO_LIMITS)
    late = _decide(model, bodies, list(range(len(bodies))), st)
    rows = []
    for i in range(len(bodies)):
        row: dict[str, float] = {}
        for r in late[i]:
            row.update(r.metrics)
        rows.append(row)
    return rows


def audit_versions(
    rollouts: Sequence[Any],
    model_for: Callable[[int], Any | None],
    *,
    judge: Callable[[Any], TaskJudgement] | None = None,
    eos_ids: Collection[int] | None = None,
    settings: AuditSettings = AuditSettings(),
) -> list[AuditResult]:
    """`audit_records` against the weights of the policy version each record claims:
    `model_for(version)` returns that version's model, or None when the auditor does not
    hold it; such a record fails `unknown-version` (no prefill), never passes. Records are
    audited per version (one batched prefill each), so a verdict never depends on which
    versions share a call."""
    out: list[AuditResult | None] = [None] * len(rollouts)
    by_version: dict[int, list[int]] = {}
    for i, ro in enumerate(rollouts):
        by_version.setdefault(int(ro.envelope.policy_version), []).append(i)
    for version, idx in sorted(by_version.items()):
        model = model_for(version)
        if model is None:
            for i in idx:
                out[i] = AuditResult(
                    False,
                    "unknown-version",
                    f"policy version {version} is not held by this auditor",
                    ("unknown-version",),
                    {"policy_version": float(version)},
                )
            continue
        results = audit_records(
            [rollouts[i] for i in idx], model, judge=judge, eos_ids=eos_ids, settings=settings
        )
        for i, r in zip(idx, results, strict=True):
            out[i] = r
    return [r for r in out if r is not None]
