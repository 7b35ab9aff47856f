"""Checks that a rollout came from the claimed policy: activation proofs, sampling replay, audits."""
