"""The individual checks of an audit, each a pure function with its own verdict reason.

What this module owns: judging one rollout body against values a verifier recomputed
(hidden states and logits from one prefill) and against the run's rules. It never runs a
model (see `verify.audit`), never reads files, and never decides thresholds (they live in
`verify.thresholds` with the data that justifies them).

Every check returns a `CheckResult`: `passed`, a `reason` (a verdict reason string, the
same on every peer: lowercase, digits, `-`) and the measurements behind it. Reasons:

| reason              | check                                                            |
|---------------------|------------------------------------------------------------------|
| `malformed`         | token, log-prob or settings shape inconsistent                   |
| `unknown-version`   | the claimed policy version's weights are not held by the auditor  |
| `too-large`         | more tokens than the audit's per-record limit (`verify.auditor`)  |
| `proof-missing`     | no proofs, or not one per chunk of `chunk` completion tokens     |
| `proof-malformed`   | a proof that cannot be parsed (length, modulus, coefficients)    |
| `proof-null`        | an all-zero proof (TOPLOC's silent prover failure)               |
| `proof-mismatch`    | TOPLOC statistics over the limit in some chunk                   |
| `proof-sign`        | top-k values with matching magnitude but flipped sign            |
| `termination`       | not ending at the first EOS, nor at exactly `max_new_tokens`     |
| `sampling-replay`   | a token the seeded Gumbel-max rule would not have chosen         |
| `logprob-mismatch`  | recorded sampler log-probs differ from recomputed ones           |
| `model-drift`       | log-probs and proof values together drift more than rounding     |
| `task-mismatch`     | prompt, seed or task differ from the re-derived assignment        |
| `reward-mismatch`   | claimed reward differs from the re-scored one                    |
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verify import sampling, toploc
from verify.thresholds import THRESHOLDS, Thresholds


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome: its name, pass or fail with a reason code, metrics and a detail line."""

    name: str
    passed: bool
    reason: str  # "ok" when passed
    metrics: dict[str, float] = field(default_factory=dict)
    detail: str = ""


def check_ok(name: str, metrics: dict[str, float] | None = None) -> CheckResult:
    """A passed check named `name`."""
    return CheckResult(name, True, "ok", metrics or {})


def check_failed(
    name: str, reason: str, detail: str, metrics: dict[str, float] | None = None
) -> CheckResult:
    """A failed check named `name`, with its reason code and a one-line detail."""
    return CheckResult(name, False, reason, metrics or {}, detail)


# ------------------------------------------------------------------ structure


def check_structure(body: Any) -> CheckResult:
    """Token counts, one log-prob per token, finite log-probs, usable sampling settings."""
    n = len(body.completion_ids)
    if n == 0:
        return check_failed("structure", "malformed", "empty completion")
    if len(body.prompt_ids) == 0:
        return check_failed("structure", "malformed", "empty prompt")
    if len(body.logprobs) != n:
        return check_failed(
            "structure", "malformed", f"{len(body.logprobs)} log-probs for {n} tokens"
        )
    if not all(math.isfinite(x) for x in body.logprobs):
        return check_failed("structure", "malformed", "non-finite log-prob")
    if not (0.0 < body.top_p <= 1.0) or not (body.temperature >= 0.0):
        return check_failed("structure", "malformed", "unusable sampling settings")
    return check_ok("structure", {"n_completion": float(n)})


def check_settings(body: Any, expected: Any | None) -> CheckResult:
    """The body's sampling settings equal the run's (a `RunManifest` or anything with the
    same four attributes); `expected=None` skips."""
    if expected is None:
        return check_ok("settings")
    for name in ("temperature", "top_p", "top_k", "max_new_tokens"):
        got, want = getattr(body, name), getattr(expected, name)
        if got != want:
            return check_failed(
                "settings", "malformed", f"{name} {got!r} differs from the run's {want!r}"
            )
    return check_ok("settings")


# ------------------------------------------------------------------ proofs


def check_proof_format(
    proofs: Sequence[bytes], n_tokens: int, chunk: int = toploc.CHUNK, topk: int = toploc.TOPK
) -> CheckResult:
    """One well-formed, non-null proof per chunk. An empty, zero or malformed proof is a
    failure, never a pass."""
    want = toploc.n_chunks(n_tokens, chunk)
    if len(proofs) != want:
        return check_failed(
            "proof-format", "proof-missing", f"{len(proofs)} proofs for {want} chunks"
        )
    for i, p in enumerate(proofs):
        if isinstance(p, bytes | bytearray) and toploc.is_null_proof(p):
            return check_failed("proof-format", "proof-null", f"proof {i} is all zeros")
        try:
            toploc.parse_proof(p, topk)
        except toploc.ProofFormatError as exc:
            return check_failed("proof-format", "proof-malformed", f"proof {i}: {exc}")
    return check_ok("proof-format")


# A top-k point whose exponent matches but whose 7-bit mantissa is off by more than this
# many units (more than 1/8 of its binade) is not rounding noise: it is a position the
# prover did not select (a near-tie at the top-k boundary), where the proof's polynomial
# evaluates to a random 16-bit pattern whose exponent happened to match (1 in 256).
# TOPLOC averages such a point into the mantissa error (it adds up to 127/128 to a chunk's
# mean); we count it as a mismatch instead, like a differing exponent, so that one stray
# point cannot dominate the mean. The limit sits above honest rounding errors and at the
# reach of int8 workers' errors (docs/CALIBRATION.md, "far points").
FAR_MANT_ERR = 16


@dataclass(frozen=True, slots=True)
class ProofChunk:
    """Our statistics of one chunk's top-k points (claimed by the proof vs recomputed)."""

    points: int
    exp_mismatches: int  # differing exponents (TOPLOC's count)
    far_points: int  # equal exponents, mantissas more than FAR_MANT_ERR apart
    mant_err_mean: float  # over the remaining (near) points; NO_MATCH when none
    mant_err_median: float  # upper median over the near points; NO_MATCH when none
    sign_mismatches: int  # near points, mantissas within 2 units, opposite signs

    @property
    def mismatches(self) -> int:
        """Points counted as mismatches: differing exponents plus far points."""
        return self.exp_mismatches + self.far_points

    @property
    def near_points(self) -> int:
        """Points whose mantissa error is measured (the rest)."""
        return self.points - self.mismatches


def proof_chunks_many(
    activations: Sequence[torch.Tensor],
    proofs: Sequence[Sequence[bytes]],
    chunk: int = toploc.CHUNK,
    topk: int = toploc.TOPK,
) -> list[list[ProofChunk]]:
    """Per rollout, per chunk: `ProofChunk` statistics of `proofs` against recomputed
    hidden states [T, H]. The top-k selection, parsing and evaluation are TOPLOC's
    (`verify.toploc`, chunks of equal shape batched across rollouts). Raises
    `toploc.ProofFormatError` for malformed proofs or a wrong proof count, `ValueError`
    for unusable activations."""
    return toploc.compare_many(activations, proofs, _chunk_stats, chunk, topk)


def _chunk_stats(claimed: np.ndarray, got: np.ndarray) -> list[ProofChunk]:
    """`ProofChunk` per row of bf16 bit patterns [chunks, points]."""
    exp_match = (claimed & toploc.BF16_EXP_MASK) == (got & toploc.BF16_EXP_MASK)
    mant_err = np.abs((claimed & toploc.BF16_MANT_MASK) - (got & toploc.BF16_MANT_MASK))
    near = exp_match & (mant_err <= FAR_MANT_ERR)
    far = exp_match & ~near
    sign = (
        near & (mant_err <= toploc.SIGN_MANT_TOL) & (((claimed ^ got) & toploc.BF16_SIGN_MASK) != 0)
    )
    count = near.sum(axis=1)
    sums = np.where(near, mant_err, 0).sum(axis=1).tolist()
    ordered = np.sort(np.where(near, mant_err, np.iinfo(np.int64).max), axis=1)
    medians = ordered[np.arange(len(count)), np.minimum(count // 2, ordered.shape[1] - 1)].tolist()
    points = int(claimed.shape[1])
    out = []
    for c, s, med, e, f, g in zip(
        count.tolist(),
        sums,
        medians,
        (~exp_match).sum(axis=1).tolist(),
        far.sum(axis=1).tolist(),
        sign.sum(axis=1).tolist(),
        strict=True,
    ):
        mean, median = (s / c, float(med)) if c else (toploc.NO_MATCH, toploc.NO_MATCH)
        out.append(ProofChunk(points, e, f, mean, median, g))
    return out


def check_proofs(
    hidden: torch.Tensor,
    proofs: Sequence[bytes],
    chunk: int = toploc.CHUNK,
    topk: int = toploc.TOPK,
    th: Thresholds = THRESHOLDS,
) -> list[CheckResult]:
    """Proof statistics per chunk against the recomputed hidden states [T, H], and our
    sign check. Returns [proof result, sign result]."""
    try:
        chunks = proof_chunks_many([hidden], [list(proofs)], chunk, topk)[0]
    except toploc.ProofFormatError as exc:
        return [check_failed("proof", "proof-malformed", str(exc))]
    except ValueError as exc:  # non-finite recomputed activations: the verifier's problem
        return [check_failed("proof", "proof-mismatch", f"recomputed activations unusable: {exc}")]
    return judge_proof_chunks(chunks, th)


def judge_proof_chunks(
    chunks: Sequence[ProofChunk], th: Thresholds = THRESHOLDS
) -> list[CheckResult]:
    """[proof result, sign result] from the per-chunk statistics of one rollout.

    The mismatch limits count exponent mismatches and far points together (both are
    points whose claimed value is not the recomputed one up to rounding); the mantissa
    limits apply to the remaining near points. TOPLOC's own statistics differ only in
    averaging far points into the mantissa error (`verify.toploc.verify_proofs_bytes`)."""
    # TOPLOC's limits are per 128 points; a short chunk with fewer points scales them.
    # Each chunk statistic is judged at the worst chunk but the `proof_chunks_over_rate`
    # share of worst ones (none below 1 / rate chunks), a per-chunk rate: the worst of n
    # honest chunks grows with n, the (rate x n)-th worst does not.
    skip = int(th.proof_chunks_over_rate * len(chunks))
    exp_frac = _worst_but(sorted(r.mismatches / r.points for r in chunks), skip)
    mean = _worst_but(sorted(r.mant_err_mean for r in chunks), skip)
    median = _worst_but(sorted(r.mant_err_median for r in chunks), skip)
    sign = sum(r.sign_mismatches for r in chunks)
    # rollout-level aggregates: every point of every chunk (steadier than the worst chunk)
    points = sum(r.points for r in chunks)
    n_near = sum(r.near_points for r in chunks)
    mean_all = (
        sum(r.near_points * r.mant_err_mean for r in chunks if r.near_points) / n_near
        if n_near
        else toploc.NO_MATCH
    )
    exp_all = 1.0 - n_near / points
    metrics = {
        "proof_exp_mismatch_frac_all": exp_all,
        "proof_mant_mean_all": mean_all,
        "proof_exp_mismatch_max": float(max(r.mismatches for r in chunks)),
        "proof_chunks": float(len(chunks)),
        "proof_exp_mismatch_frac": exp_frac,
        "proof_far_points": float(sum(r.far_points for r in chunks)),
        "proof_mant_mean_max": mean,
        "proof_mant_median_max": median,
        "proof_sign_mismatches": float(sign),
    }
    out = []
    if exp_frac > th.proof_exp_mismatch_frac:
        out.append(
            check_failed(
                "proof",
                "proof-mismatch",
                f"exponent mismatches {exp_frac:.3f} of top-k in a chunk",
                metrics,
            )
        )
    elif mean > th.proof_mant_mean or median > th.proof_mant_median:
        out.append(
            check_failed(
                "proof",
                "proof-mismatch",
                f"mantissa error mean {mean:.2f} median {median:.1f} in a chunk",
                metrics,
            )
        )
    elif exp_all > th.proof_exp_mismatch_frac_all or mean_all > th.proof_mant_mean_all:
        out.append(
            check_failed(
                "proof",
                "proof-mismatch",
                f"rollout exponent mismatches {exp_all:.3f}, mantissa error mean {mean_all:.3f}",
                metrics,
            )
        )
    else:
        out.append(check_ok("proof", metrics))
    if sign > th.proof_sign_mismatches:
        out.append(
            check_failed(
                "proof-sign", "proof-sign", f"{sign} top-k values with flipped sign", metrics
            )
        )
    else:
        out.append(check_ok("proof-sign"))
    return out


def _worst_but(ordered: list[float], skip: int) -> float:
    """The largest value of an ascending list but its `skip` largest (the smallest when
    `skip` reaches the list's length)."""
    return ordered[max(0, len(ordered) - 1 - skip)]


# ------------------------------------------------------------------ termination


def check_termination(body: Any, eos_token_ids: Collection[int]) -> CheckResult:
    """Generation stops at the first EOS (kept as the last token, `finish_reason="eos"`)
    or after exactly `max_new_tokens` without any EOS (`"length"`)."""
    ids = list(body.completion_ids)
    n = len(ids)
    eos = set(int(e) for e in eos_token_ids)
    first_eos = next((i for i, t in enumerate(ids) if t in eos), None)
    metrics = {"n_completion": float(n), "max_new_tokens": float(body.max_new_tokens)}
    if n > body.max_new_tokens:
        return check_failed(
            "termination",
            "termination",
            f"{n} tokens > max_new_tokens {body.max_new_tokens}",
            metrics,
        )
    if body.finish_reason == "eos":
        if first_eos is None:
            return check_failed(
                "termination", "termination", "finish_reason eos without an EOS token", metrics
            )
        if first_eos != n - 1:
            return check_failed(
                "termination", "termination", f"tokens continue after EOS at {first_eos}", metrics
            )
        return check_ok("termination", metrics)
    if body.finish_reason == "length":
        if first_eos is not None:
            return check_failed(
                "termination",
                "termination",
                f"EOS at {first_eos} but finish_reason length",
                metrics,
            )
        if n != body.max_new_tokens:
            return check_failed(
                "termination",
                "termination",
                f"stopped at {n} of {body.max_new_tokens} tokens without EOS",
                metrics,
            )
        return check_ok("termination", metrics)
    return check_failed(
        "termination", "termination", f"unknown finish_reason {body.finish_reason!r}", metrics
    )


# ------------------------------------------------------------------ sampling


@dataclass(frozen=True, slots=True)
class Replay:
    """Per-token replay of the seeded sampler on recomputed logits [T, V]."""

    margins: np.ndarray  # float64 [T]: (best score - score of the recorded token) * temperature
    logprobs: np.ndarray  # float64 [T]: recomputed sampler log-probs (nan where filtered out)


def replay(logits: torch.Tensor | np.ndarray, body: Any) -> Replay:
    """Replay the sampling rule of `verify.sampling` for every completion token.

    Margins are in logit units (score margins times the temperature), so one tolerance
    serves every temperature: a margin of 0 means the recorded token is the rule's choice;
    a small positive margin is a near-tie that logit noise can flip; inf means the token
    was filtered out (top-k / top-p) or out of the vocabulary.
    """
    x = (
        logits.detach().float().cpu().numpy()
        if isinstance(logits, torch.Tensor)
        else np.asarray(logits, np.float32)
    )
    t, v = x.shape
    tokens = np.asarray(body.completion_ids, dtype=np.int64)
    in_vocab = tokens < v
    safe = np.where(in_vocab, tokens, 0)
    rows = np.arange(t)
    if body.temperature == 0.0:
        chosen = x[rows, safe].astype(np.float64)
        margins = x.max(axis=1).astype(np.float64) - chosen
        margins[~in_vocab] = np.inf
        return Replay(margins, np.where(in_vocab, 0.0, np.nan))
    scores, zk = sampling.perturbed_scores(
        x,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seeds=[body.sampling_seed] * t,
        steps=list(range(t)),
    )
    return Replay(*_replay_rows(scores, zk, tokens, body.temperature))


def replay_many(logits: Sequence[torch.Tensor], bodies: Sequence[Any]) -> list[Replay]:
    """`replay` for many rollouts: rows of rollouts with the same sampling settings are
    scored in one batched call (the sampler's noise is per row: seed and step)."""
    out: list[Replay | None] = [None] * len(bodies)
    groups: dict[tuple[float, float, int], list[int]] = {}
    for i, b in enumerate(bodies):
        if b.temperature == 0.0:
            out[i] = replay(logits[i], b)
        else:
            groups.setdefault((b.temperature, b.top_p, b.top_k), []).append(i)
    for (temp, top_p, top_k), idx in groups.items():
        x = torch.cat([logits[i].float() for i in idx]).numpy()
        lengths = [len(bodies[i].completion_ids) for i in idx]
        seeds = np.repeat(sampling.seed_array([bodies[i].sampling_seed for i in idx]), lengths)
        steps = np.concatenate([np.arange(n) for n in lengths])
        tokens = np.concatenate([np.asarray(bodies[i].completion_ids, dtype=np.int64) for i in idx])
        margins, lp = replay_rows(x, tokens, seeds, steps, temp, top_p, top_k)
        start = 0
        for i, n in zip(idx, lengths, strict=True):
            out[i] = Replay(margins[start : start + n], lp[start : start + n])
            start += n
    return [r for r in out if r is not None]


def replay_rows(
    x: np.ndarray,
    tokens: np.ndarray,
    seeds: np.ndarray,
    steps: np.ndarray,
    temperature: float,
    top_p: float,
    top_k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(margins, sampler log-probs) float64 [rows] of the recorded `tokens` for float32
    logits x [rows, V], row r sampled with (seeds[r], steps[r]) under one setting (sampling
    temperature > 0). In slices of rows whose arrays (noise, scores, float64 log-softmax)
    stay in cache."""
    margins, lp = np.empty(len(x)), np.empty(len(x))
    rows = max(1, sampling.CACHE_SLICE_VALUES // max(1, x.shape[1]))
    for a in range(0, len(x), rows):
        b = min(a + rows, len(x))
        scores, zk = sampling.perturbed_scores(
            x[a:b],
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seeds=seeds[a:b],
            steps=steps[a:b],
        )
        margins[a:b], lp[a:b] = _replay_rows(scores, zk, tokens[a:b], temperature)
    return margins, lp


def _replay_rows(
    scores: np.ndarray, zk: np.ndarray, tokens: np.ndarray, temperature: float
) -> tuple[np.ndarray, np.ndarray]:
    """(margins, sampler log-probs) of the recorded `tokens`, one per row of the perturbed
    `scores` and kept scaled logits `zk` [rows, V]."""
    t, v = scores.shape
    in_vocab = tokens < v
    safe = np.where(in_vocab, tokens, 0)
    rows = np.arange(t)
    chosen = scores[rows, safe].astype(np.float64)
    margins = (scores.max(axis=1).astype(np.float64) - chosen) * temperature
    margins[~in_vocab | ~np.isfinite(chosen)] = np.inf
    z64 = zk.astype(np.float64)
    zmax = z64.max(axis=1, keepdims=True)
    lp = z64[rows, safe]
    z64 -= zmax
    np.exp(z64, out=z64)
    lp -= np.log(z64.sum(axis=1)) + zmax[:, 0]
    lp[~in_vocab | ~np.isfinite(lp)] = np.nan
    return margins, lp


def check_sampling(rep: Replay, th: Thresholds = THRESHOLDS) -> CheckResult:
    """Every token must be the seeded rule's choice, except genuine near-ties: a recorded
    token that loses by at most `sampling_margin` logits, at most `sampling_near_ties_max`
    plus `sampling_near_tie_rate` per token of them in a rollout (near-ties are per-token
    events: their honest count grows with completion length). Reports the worst margin."""
    m = rep.margins
    mismatched = m > 0
    worst = float(m.max()) if m.size else 0.0
    metrics = {
        "sampling_mismatches": float(mismatched.sum()),
        "sampling_near_tie_rate": float(mismatched.mean()) if m.size else 0.0,
        "sampling_margin_max": worst if math.isfinite(worst) else 1e30,
    }
    over = np.flatnonzero(m > th.sampling_margin)
    if over.size:
        i = int(over[0])
        return check_failed(
            "sampling", "sampling-replay", f"token {i} loses by {m[i]:.4g} logits", metrics
        )
    if mismatched.sum() > near_ties_allowed(m.size, th):
        return check_failed(
            "sampling", "sampling-replay", f"{int(mismatched.sum())} near-tie tokens", metrics
        )
    return check_ok("sampling", metrics)


def near_ties_allowed(n_tokens: int, th: Thresholds = THRESHOLDS) -> float:
    """Near-tie tokens a rollout of `n_tokens` completion tokens may contain."""
    return th.sampling_near_ties_max + th.sampling_near_tie_rate * n_tokens


def check_logprobs(
    rep: Replay, recorded: Sequence[float], th: Thresholds = THRESHOLDS
) -> CheckResult:
    """Recorded sampler log-probs vs recomputed ones (same rule, recomputed logits)."""
    rec = np.asarray(recorded, dtype=np.float64)
    diff = np.abs(rec - rep.logprobs)
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = float(diff.max()) if diff.size else 0.0
    mean = float(diff.mean()) if diff.size else 0.0
    metrics = {
        "logprob_err_max": worst if math.isfinite(worst) else 1e30,
        "logprob_err_mean": mean if math.isfinite(mean) else 1e30,
    }
    if worst > th.logprob_err_max or mean > th.logprob_err_mean:
        return check_failed(
            "logprobs",
            "logprob-mismatch",
            f"log-prob error max {worst:.3g} mean {mean:.3g}",
            metrics,
        )
    return check_ok("logprobs", metrics)


def check_drift(metrics: dict[str, float], th: Thresholds = THRESHOLDS) -> CheckResult:
    """The fine test for a slightly different model (int8 weights, small perturbations):
    drift = mean |log-prob error| + w * mean mantissa error of the rollout's near proof
    points (far points excluded, see `FAR_MANT_ERR`).

    Each term alone overlaps between honest rounding noise and a quantised model; their
    sum separates them better because the two measure independent views of the same
    deviation (the sampled token's log-prob, the hidden state's largest entries): an
    honest rollout that is unlucky in one view is typical in the other, a different model
    is off in both. `w` weighs the terms equally at their typical honest values.
    """
    lp = metrics.get("logprob_err_mean")
    mant = metrics.get("proof_mant_mean_all")
    if lp is None or mant is None:
        return check_ok("drift")
    drift = lp + th.drift_proof_weight * mant
    m = {"drift": drift}
    if not drift <= th.drift:
        return check_failed("drift", "model-drift", f"drift {drift:.5f} > {th.drift}", m)
    return check_ok("drift", m)


# ------------------------------------------------------------------ task and reward


def check_reward(claimed: float, rescored: float, th: Thresholds = THRESHOLDS) -> CheckResult:
    """The claimed reward against the re-scored one, within `th.reward_tolerance`."""
    err = abs(float(claimed) - float(rescored))
    metrics = {"reward_claimed": float(claimed), "reward_rescored": float(rescored)}
    if not err <= th.reward_tolerance:
        return check_failed(
            "reward", "reward-mismatch", f"claimed {claimed} but re-scored {rescored}", metrics
        )
    return check_ok("reward", metrics)
