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


CALIBRATION = """
Measured with `swarm-node bench verify` on this project's 2-core CPU machine (torch 2.13,
transformers 5), 200 rollouts per case; each entry is [p50, max] over honest rollouts or
[min, p50] over attacked ones. "fp32" = an fp32 verifier prefill, "bf16" = a bf16 one.

Honest noise, fp32 worker vs fp32 verifier (batch 64 KV-cache decode vs batched prefill;
batch 1; 1 thread; eager attention; left-padded prefill):
  built-in policy (trained, hidden 128): every metric exactly 0 in every variation.
  random-init hidden 192: proof_mant_mean_all max 0.0078 (batch 1, eager), all else 0.
  -> STRICT: proof_mant_mean_all 0.02, logprob_err_mean 0.0005, logprob_err_max 0.002 ...

Honest noise, bf16 worker:
  built-in, bf16 verifier: 0 in all 200 of the bench's set; 0.10 max in an earlier
    200-rollout set (other prompts); vs an fp32 verifier: proof_mant_mean_all [0.71,
    0.97], logprob_err_mean up to 0.019 (hence the second, bf16 pass).
  hidden 192, bf16 verifier: proof_mant_mean_all [0.23, 0.82] with rare outliers to
    1.11; logprob_err_mean [0.0010, 0.0014]; vs fp32: [0.46, 0.99], [0.0013, 0.0019].
  -> BF16_FLOOR, raised per model by `calibrate` (2 x the largest honest value on a
     separate calibration set of 200 honest rollouts).

Attacks, at the verifier's fp32 pass (the strict regime):
  int8 weights (fp32 compute): built-in proof_mant_mean_all [0.095, 0.18];
    hidden 192 [0.44, 0.75], logprob_err_mean [0.0021, 0.0037].
  1% weight noise: built-in [1.21, 1.47]; hidden 192 [1.02, 1.88].
  one training step (AdamW lr 1e-5, 6.3% / 15.6% of bf16 weights changed):
    built-in [0.0, 0.0078]; hidden 192 [0.23, 0.40]: inside the honest bf16 noise.
  temperature lie (0.7 claimed 1.0): logprob_err_mean [0.0019, 0.046] (built-in).
  edited token, cherry-pick: sampling margins of whole logits (>= 0.08 vs honest 0.0014).

Where honest and dishonest overlap: on the random-init hidden-192 model int8 weights move
the activations by about as much as bf16 rounding does (bf16 honest outliers 0.86-1.11
vs int8 0.44-1.5 at the bf16 pass), so 1% of honest bf16 rollouts fail or 0.5% of int8
rollouts pass there, whichever way the line is drawn; on the trained policy the two are
apart (bf16 <= 0.10, int8 >= 0.58 at the bf16 pass; fp32 0 vs int8 >= 0.095).
Thresholds are per model and per hardware mix: a run should calibrate them (the bench
shows how) on the GPUs and CPUs its workers and verifiers really use.
"""
