"""Audit thresholds, in one place: the defaults, the floors of each precision regime,
and `calibrate`, which raises the floors to a model's measured honest noise.

Each limit is an upper bound on an error measure (bigger is worse): every honest variation
(fp32 vs bf16 compute, batch size, padding side, thread count, KV-cache decode vs prefill,
sdpa vs eager attention) must pass with room to spare, and the limit sits well below what
the attacks produce. The measurements behind each value are in docs/CALIBRATION.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The limits of one audit regime; each field bounds one error measure."""

    # TOPLOC statistics, per chunk: judged on the worst chunk of a rollout but the
    # `proof_chunks_over_rate` x chunks worst ones (rounded down), so that the honest
    # statistic does not grow with completion length (more chunks, a worse worst one)
    proof_exp_mismatch_frac: float = 16 / 128
    proof_mant_mean: float = 3.0
    proof_mant_median: float = 2.0
    proof_chunks_over_rate: float = 1 / 32
    # the same over all points of the rollout
    proof_exp_mismatch_frac_all: float = 0.1
    proof_mant_mean_all: float = 1.2
    # sign flips among top-k values whose exponents match, summed over the rollout
    proof_sign_mismatches: int = 0
    # sampling replay: the largest loss (in logits) a recorded token may have against the
    # replayed choice, and how many such near-ties a rollout may contain: this many in
    # any rollout, plus this rate per completion token
    sampling_margin: float = 0.02
    sampling_near_ties_max: int = 4
    sampling_near_tie_rate: float = 1 / 64
    # sampler log-probs: largest and mean absolute difference (nats)
    logprob_err_max: float = 0.03
    logprob_err_mean: float = 0.01
    # drift = logprob_err_mean + drift_proof_weight * proof_mant_mean_all (see checks.check_drift);
    # the weight makes the two terms equal at their typical honest bf16 values
    drift: float = 0.0045
    drift_proof_weight: float = 0.005
    # reward re-scoring
    reward_tolerance: float = 1e-6
    # per producer (verify.producer): the median of logprob_err_mean over a window of a
    # worker's audited records; calibrated at the largest honest value of a single record
    producer_logprob_err_median: float = 0.02


# The loose regime: a verifier prefill in bf16, judging a worker that computed in bf16.
# bf16 KV-cache decode and bf16 prefill round differently, and how much depends on the
# model; these defaults admit the noisiest honest case of docs/CALIBRATION.md.
THRESHOLDS = Thresholds()

# The strict regime: an fp32 verifier judging an fp32 worker. On a CPU, fp32 decode and
# fp32 prefill agree to the last bf16 bit in nearly every value whatever the batch size,
# padding, thread count or attention kernel, so the limits sit just above 0.
STRICT = Thresholds(
    proof_exp_mismatch_frac=0.04,
    proof_mant_mean=0.05,
    proof_mant_median=0.0,
    proof_exp_mismatch_frac_all=0.02,
    proof_mant_mean_all=0.02,
    sampling_margin=0.01,
    sampling_near_ties_max=2,
    sampling_near_tie_rate=1 / 128,
    logprob_err_max=0.002,
    logprob_err_mean=0.0005,
    drift=0.0006,
    producer_logprob_err_median=0.0005,
)

# Floors of the fp32 regime when calibrated. STRICT above is what a model without a
# calibration file gets, so it must hold on any hardware; a calibrated model has measured
# its honest noise, and these floors only keep a lucky calibration set (every value 0)
# from giving limits of 0. They sit above the built-in policy's honest fp32 noise and
# below what a small rank-1 weight change produces (docs/CALIBRATION.md).
STRICT_FLOOR = replace(
    STRICT,
    logprob_err_max=1e-4,
    logprob_err_mean=1e-5,
    drift=1e-4,
    producer_logprob_err_median=1e-6,
)

# Floors of the bf16 regime when calibrated: bf16 decode and bf16 prefill round alike
# most of the time (often to the bit on a CPU) but not always, so its floors allow a
# few one-ulp disagreements in a rollout where the strict regime allows almost none.
BF16_FLOOR = Thresholds(
    proof_exp_mismatch_frac=0.06,
    proof_mant_mean=0.2,
    proof_mant_median=1.0,
    proof_exp_mismatch_frac_all=0.03,
    proof_mant_mean_all=0.1,
    sampling_margin=0.02,
    sampling_near_ties_max=4,
    sampling_near_tie_rate=1 / 64,
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
#   slightly different model from rounding noise, so it gets less headroom, leaving room
#   on both sides of the int8 attack (docs/CALIBRATION.md).
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
