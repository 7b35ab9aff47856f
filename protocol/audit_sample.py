"""Audit sampling that a producer cannot predict and anyone can check afterwards.

A validator decides whether to audit a rollout from a *ticket*: its own Ed25519
signature over a domain tag, the run id and the rollout id. Ed25519 signatures are
deterministic (RFC 8032), so the ticket is a fixed function of (validator key, rollout)
that only the validator can compute: the producer, who chooses the rollout id, cannot
tell in advance which of its rollouts will be sampled, however often it re-signs. After
the fact the validator publishes the ticket in its verdict and any peer checks it with
the validator's public key (a VRF-like construction; it is not a full VRF, which would
also hide the ticket's bias from the signer, but the signer gains nothing by not
sampling: skipping audits only lowers its own count of verdicts).

The decision: the first 8 bytes of SHA-256(ticket), read big-endian, below
`fraction * 2**64`.

Windows: the per-producer rule (`protocol.producer_cases`) judges a producer by whole
windows of its task counters, which records sampled one by one almost never fill (all 16
of a window at a fraction of 0.25: 0.25**16). A validator also audits whole the windows
whose *window ticket*, its signature over (run, producer, window index) under its own
domain, is sampled. That ticket is never published (the verdicts of a window audit are
not, only a claim if the window's median is over the limit), so a producer learns which
of its windows are audited whole only by cheating in one.
"""

from __future__ import annotations

import hashlib

from protocol.identity import Identity, verify_signature

__all__ = [
    "SAMPLE_DOMAIN",
    "WINDOW_DOMAIN",
    "check_ticket",
    "sample_ticket",
    "sampled",
    "window_ticket",
]

SAMPLE_DOMAIN = b"swarm-rl/audit-sample/1\x00"
WINDOW_DOMAIN = b"swarm-rl/audit-window/1\x00"


def _message(run_id: str, rollout_id: bytes) -> bytes:
    return SAMPLE_DOMAIN + run_id.encode() + b"\x00" + rollout_id


def sample_ticket(identity: Identity, run_id: str, rollout_id: bytes) -> bytes:
    """The validator's ticket for one rollout (64 bytes)."""
    return identity.sign(_message(run_id, rollout_id))


def window_ticket(identity: Identity, run_id: str, producer: bytes, window: int) -> bytes:
    """The validator's ticket for one window of `producer`'s task counters (64 bytes)."""
    return identity.sign(
        WINDOW_DOMAIN + run_id.encode() + b"\x00" + producer + window.to_bytes(8, "big")
    )


def check_ticket(validator: bytes, run_id: str, rollout_id: bytes, ticket: bytes) -> bool:
    """Whether `ticket` is `validator`'s ticket for this rollout."""
    return verify_signature(validator, _message(run_id, rollout_id), ticket)


def sampled(ticket: bytes, fraction: float) -> bool:
    """Whether a ticket falls in the audited `fraction` of rollouts."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    h = int.from_bytes(hashlib.sha256(ticket).digest()[:8], "big")
    return h < fraction * 2.0**64
