"""Audit thresholds, in one place, with the measurements that justify them.

Each limit is an upper bound on an error measure (bigger is worse). They were set from the
honest noise measured by `swarm-node bench verify` (see CALIBRATION below): every honest
variation (fp32 vs bf16 compute, batch size, padding side, thread count, KV-cache decode
vs prefill, sdpa vs eager attention) must pass with room to spare, and the limit sits
well below what the attacks produce.

TOPLOC's published accept rule is exp mismatches <= 38 of 128, mantissa mean <= 10,
median <= 8; ours is tighter where the data allows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Thresholds:
    # TOPLOC statistics, per chunk (worst chunk of a rollout)
    proof_exp_mismatch_frac: float = 16 / 128
    proof_mant_mean: float = 3.0
    proof_mant_median: float = 2.0
    # the same over all points of the rollout
    proof_exp_mismatch_frac_all: float = 0.1
    proof_mant_mean_all: float = 1.2
    # sign flips among top-k values whose exponents match, summed over the rollout
    proof_sign_mismatches: int = 0
    # sampling replay: the largest loss (in logits) a recorded token may have against the
    # replayed choice, and how many such near-ties a rollout may contain
    sampling_margin: float = 0.02
    sampling_near_ties_max: int = 4
    # sampler log-probs: largest and mean absolute difference (nats)
    logprob_err_max: float = 0.03
    logprob_err_mean: float = 0.01
    # drift = logprob_err_mean + drift_proof_weight * proof_mant_mean_all (see checks.check_drift);
    # the weight makes the terms equal at their typical honest bf16 values (hidden 192:
    # logprob_err_mean p50 0.00093, proof_mant_mean_all p50 0.21 -> 0.0044)
    drift: float = 0.0045
    drift_proof_weight: float = 0.005
    # reward re-scoring
    reward_tolerance: float = 1e-6
    # per producer (verify.producer): the median of logprob_err_mean over a window of a
    # worker's audited records; calibrated at the largest honest value of a single record
    producer_logprob_err_median: float = 0.02


# The loose regime: a verifier prefill in bf16, judging a worker that computed in bf16.
# bf16 KV-cache decode and bf16 prefill round differently, and how much depends on the
# model (see CALIBRATION); these defaults admit the noisiest case we measured.
THRESHOLDS = Thresholds()

# The strict regime: an fp32 verifier judging an fp32 worker. On a CPU, fp32 decode and
# fp32 prefill agree to the last bf16 bit in nearly every value whatever the batch size,
# padding, thread count or attention kernel (CALIBRATION), so the limits sit just above 0.
STRICT = Thresholds(
    proof_exp_mismatch_frac=0.04,
    proof_mant_mean=0.05,
    proof_mant_median=0.0,
    proof_exp_mismatch_frac_all=0.02,
    proof_mant_mean_all=0.02,
    sampling_margin=0.01,
    sampling_near_ties_max=2,
    logprob_err_max=0.002,
    logprob_err_mean=0.0005,
    drift=0.0006,
    producer_logprob_err_median=0.0005,
)

# Floors of the fp32 regime when calibrated. STRICT above is what a model without a
# calibration file gets, so it must hold on any hardware; a calibrated model has measured
# its honest noise, and these floors only keep a lucky calibration set (every value 0)
# from giving limits of 0. The built-in policy's honest fp32 noise over all five
# variations (160 rollouts): drift 3.9e-5, logprob_err_max 3e-5, logprob_err_mean 1e-6;
# a rank-1 change of 1 % to a first-layer q_proj: drift >= 1.0e-4 in all 64 records,
# median 4.2e-4. At STRICT's 0.0006 / 0.002 / 0.0005 such changes passed in most records.
# The producer median's floor: honest fp32 records reach 8.8e-7 one by one, windows of 16
# have medians up to 2.6e-7, and a 0.3% rank-1 change gives medians from 4.7e-6
# (verify.producer).
STRICT_FLOOR = replace(
    STRICT,
    logprob_err_max=1e-4,
    logprob_err_mean=1e-5,
    drift=1e-4,
    producer_logprob_err_median=1e-6,
)

# Floors of the bf16 regime when calibrated: bf16 decode and bf16 prefill round alike
# most of the time (often to the bit on this CPU) but not always, so its floors allow a
# few one-ulp disagreements in a rollout where the strict regime allows almost none.
BF16_FLOOR = Thresholds(
    proof_exp_mismatch_frac=0.06,
    proof_mant_mean=0.2,
    proof_mant_median=1.0,
    proof_exp_mismatch_frac_all=0.03,
    proof_mant_mean_all=0.1,
    sampling_margin=0.02,
    sampling_near_ties_max=4,
    logprob_err_max=0.005,
    logprob_err_mean=0.0015,
    drift=0.002,  # = logprob_err_mean + drift_proof_weight * proof_mant_mean_all floors
    producer_logprob_err_median=0.0015,
)

# Calibrated limits: metric name -> threshold field.
CALIBRATED = {
    "proof_exp_mismatch_frac": "proof_exp_mismatch_frac",
    "proof_mant_mean_max": "proof_mant_mean",
    "proof_exp_mismatch_frac_all": "proof_exp_mismatch_frac_all",
    "proof_mant_mean_all": "proof_mant_mean_all",
    "sampling_margin_max": "sampling_margin",
    "logprob_err_max": "logprob_err_max",
    "logprob_err_mean": "logprob_err_mean",
    "drift": "drift",
    "proof_mant_median_max": "proof_mant_median",
}


# Metrics calibrated with their own factor instead of `calibrate`'s general one:
# - the median limit is the largest honest median itself (an integer statistic);
# - drift, the joint statistic, has a light honest tail and is the one that separates a
#   slightly different model from rounding noise, so it gets less headroom: at hidden 192
#   (bf16 worker, bf16 prefill; three sets of 200) its maximum is 1.4-1.6 x its median
#   and the three sets' maxima lie within 12 % (0.00283, 0.00306, 0.00315), while int8
#   workers start at 0.00657. 1.5 x the calibration maximum (~0.0045) leaves about 1.4 x
#   room on both sides; 2 x (~0.0061) would leave int8 less than 10 %.
METRIC_FACTORS = {"proof_mant_median_max": 1.0, "drift": 1.5}


def calibrate(
    honest: list[dict[str, float]],
    floor: Thresholds,
    factor: float = 2.0,
    metric_factors: dict[str, float] | None = None,
) -> Thresholds:
    """Thresholds from the metrics of honest rollouts judged at one precision: each
    calibrated limit is `factor` times the largest honest value (`metric_factors`, by
    default METRIC_FACTORS, override it per metric), never below the floor's; other limits
    are the floor's. The producer median's limit is the largest honest `logprob_err_mean`
    of a single record itself (a window's median passes it only if half the window does).
    Use a calibration set apart from the rollouts to be judged."""
    own = METRIC_FACTORS if metric_factors is None else metric_factors
    changes: dict[str, float] = {}
    for metric, name in CALIBRATED.items():
        values = [row[metric] for row in honest if metric in row]
        if values:
            changes[name] = max(getattr(floor, name), own.get(metric, factor) * max(values))
    values = [row["logprob_err_mean"] for row in honest if "logprob_err_mean" in row]
    if values:
        changes["producer_logprob_err_median"] = max(floor.producer_logprob_err_median, max(values))
    return replace(floor, **changes)


CALIBRATION = """
Measured with `swarm-node bench verify` on this project's 2-core CPU machine (torch 2.13,
transformers 5), 200 rollouts per case; each entry is [p50, max] over honest rollouts or
[min, p50] over attacked ones. "fp32" = an fp32 verifier prefill, "bf16" = a bf16 one.

Honest noise, fp32 worker vs fp32 verifier (batch 64 KV-cache decode vs batched prefill;
batch 1; 1 thread; eager attention; left-padded prefill):
  built-in policy (trained, hidden 128): every metric exactly 0 in every variation.
  random-init hidden 192: proof_mant_mean_all max 0.0078 (batch 1, eager), all else 0.
  -> STRICT: proof_mant_mean_all 0.02, logprob_err_mean 0.0005, logprob_err_max 0.002 ...
     (uncalibrated models); calibrated: 2 x the honest maxima (drift 1.5 x), at least
     STRICT_FLOOR (logprob_err_max 1e-4, logprob_err_mean 1e-5, drift 1e-4).

Honest noise, bf16 worker:
  built-in, bf16 verifier: 0 in all 200 of the bench's set; 0.10 max in an earlier
    200-rollout set (other prompts); vs an fp32 verifier: proof_mant_mean_all [0.71,
    0.97], logprob_err_mean up to 0.019 (hence a bf16 run is audited at bf16).
  hidden 192, bf16 verifier: proof_mant_mean_all [0.23, 0.82] with rare outliers to
    1.11 as TOPLOC averages it, [0.21, 0.39] with far points counted as mismatches
    (below); logprob_err_mean [0.0010, 0.0014]; vs fp32: [0.46, 0.99], [0.0013, 0.0019].
  -> BF16_FLOOR, raised per model by `calibrate` (2 x the largest honest value on a
     separate calibration set of 200 honest rollouts; drift 1.5 x).

Attacks, at the verifier's fp32 pass (the strict regime):
  int8 weights (fp32 compute): built-in proof_mant_mean_all [0.095, 0.18];
    hidden 192 [0.44, 0.75], logprob_err_mean [0.0021, 0.0037].
  1% weight noise: built-in [1.21, 1.47]; hidden 192 [1.02, 1.88].
  one training step (AdamW lr 1e-5, 6.3% / 15.6% of bf16 weights changed):
    built-in [0.0, 0.0078]; hidden 192 [0.23, 0.40]: inside the honest bf16 noise.
  temperature lie (0.7 claimed 1.0): logprob_err_mean [0.0019, 0.046] (built-in).
  edited token, cherry-pick: sampling margins of whole logits (>= 0.08 vs honest 0.0014).

Where honest and dishonest come close: on the random-init hidden-192 model int8 weights
(per-row scale / 254, about one bf16 ulp) move the activations by about as much as bf16
rounding does. With TOPLOC's mantissa mean the two overlapped at the bf16 pass (honest
bf16 outliers 0.86-1.04 vs int8 from 0.51), so 1% of honest bf16 rollouts failed or 0.5%
of int8 ones passed, whichever way the line was drawn. Measured per point (bf16 worker,
bf16 prefill, 400 honest and 400 int8 rollouts, /tmp script on the bench's helpers):
  - every honest outlier (4 of 400 with mean > 0.8) owes it to ONE point off by 76-109
    mantissa units (a top-k boundary tie the prover resolved differently; the proof's
    polynomial evaluates to noise there and its exponent matched by chance). Honest
    rounding errors never exceed 8 units; counting points off by > 16 units
    (`checks.FAR_MANT_ERR`) as mismatches instead of mantissa error leaves honest
    proof_mant_mean_all [0.21, 0.39] (p50, max) vs int8 [0.51, 0.86] (min, p50).
  - log-prob error alone overlaps too (honest max 0.00165, int8 min 0.00131, a 3-token
    rollout whose mantissa mean is 1.67); no honest rollout is high in both views.
  - drift = logprob_err_mean + 0.005 x proof_mant_mean_all (far points excluded) at the
    bf16 pass: honest bf16 [0.0020, 0.0032] (p50, max over 600), int8 [0.0066, 0.0084]
    (min, p50): 2.1 x apart. Calibrated at 1.5 x the calibration set's maximum (see
    METRIC_FACTORS). bench verify --hidden 192: int8_quantized 1.0, fp32_vs_bf16 0.0.
  - also measured and not used: r16/r32 ratios (how much better the bf16 prefill matches
    than the fp32 one; honest p50 0.46 max 0.89, int8 min 0.93 for the mantissa mean,
    overlapping once log-probs are included), the fraction of points with any mantissa
    error (honest max 0.32, int8 min 0.47: 1.46 x, less than drift's 2.1 x).
On the trained policy the two are far apart (bf16 <= 0.10, int8 >= 0.58 at the bf16 pass;
fp32 0 vs int8 >= 0.095).
Thresholds are per model and per hardware mix: `swarm-node calibrate --model DIR` measures
them (`calibrate` below, 2 x the largest honest value over the honest variations, per
precision) and writes DIR/calibration.json (`verify.calibration`), whose digest the run
manifest pins; the audit command, the validator role and the bench use that file. The
values in this module are the floors and the defaults for a model with no file.
"""
