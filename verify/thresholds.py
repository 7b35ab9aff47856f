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
    # drift = logprob_err_mean + drift_proof_weight * proof_mant_mean_all (see checks.check_drift)
    drift: float = 0.0024
    drift_proof_weight: float = 0.001
    # reward re-scoring
    reward_tolerance: float = 1e-6


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
    drift=0.0016,
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


def calibrate(honest: list[dict[str, float]], floor: Thresholds, factor: float = 2.0) -> Thresholds:
    """Thresholds from the metrics of honest rollouts judged at one precision: each
    calibrated limit is `factor` times the largest honest value, never below the floor's
    (the median limit: the largest honest median itself); other limits are the floor's.
    Use a calibration set apart from the rollouts to be judged."""
    changes: dict[str, float] = {}
    for metric, name in CALIBRATED.items():
        values = [row[metric] for row in honest if metric in row]
        if values:
            scale = 1.0 if metric == "proof_mant_median_max" else factor
            changes[name] = max(getattr(floor, name), scale * max(values))
    return replace(floor, **changes)


CALIBRATION = """(filled in from bench verify measurements)"""
