"""The adversary lab's stand-in model and its records.

What stands in for the model in the adversary peers (`swarm_node_bench.parts.adv_peer`)
and in the attacks on them: a record's true reward is `true_reward(body)` (1.0 for about
23% of bodies, by their digest, else 0.0), and what model made a record is its first
log-prob (`model_change`). `honest_record` signs a synthetic record that claims its true
reward (or lies), bound to its run and signer as admission requires.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from node.testing.records import net_manifest, synthetic_record
from protocol.assignment import task_seed
from protocol.codec import decode, encode
from protocol.content_id import content_id
from protocol.identity import Identity, peer_id_from_b58
from protocol.rollout import make_record
from protocol.wire import RolloutBody, RolloutRecord

VERSION = 5  # everyone runs at this policy version (S = 2: version 2 and below is stale)
# The stand-in model audit: a record's first log-prob says what model made it (an honest
# one is in [-5, 0]): SLIGHT_MARK a slightly changed model, CHANGED_MARK a changed one.
SLIGHT_MARK, CHANGED_MARK = -150.0, -300.0


def model_change(body: RolloutBody) -> str:
    """ "honest", "slight" (passes alone, over the producer limit) or "changed" (fails)."""
    first = body.logprobs[0] if body.logprobs else 0.0
    return "honest" if first > -100.0 else "slight" if first > -200.0 else "changed"


def true_reward(body: RolloutBody) -> float:
    """The stand-in for re-scoring a task: fixed by the body, ~23% solved."""
    return 1.0 if content_id(encode(body))[0] < 59 else 0.0


def manifest(run: str, validator: str) -> Any:
    """The adversary run's manifest: `net_manifest(run)` with `validator` its one validator
    key (none when empty)."""
    return dataclasses.replace(
        net_manifest(run), validator_keys=(peer_id_from_b58(validator),) if validator else ()
    )


def honest_record(
    ident: Identity,
    m: Any,
    counter: int,
    seq: int,
    *,
    lie: bool = False,
    version: int = VERSION,
    run_id: str | None = None,
    rng: random.Random,
    change: float = 0.0,
    claim: float | None = None,
    signed_at: float | None = None,
) -> bytes:
    """A synthetic record claiming its true reward (or lying: claiming the opposite, or
    `claim` whatever the truth); `change` (SLIGHT_MARK, CHANGED_MARK) makes it a changed
    model's (`model_change`); `signed_at` its envelope's time (default now)."""
    base = synthetic_record(ident, m, counter, n_prompt=16, n_completion=64, seq=seq, rng=rng)
    rec = decode(RolloutRecord, base)
    # The task seed derives from the run, the counter and the signer's key
    # (admission refuses any other as `not_bound`), and the body was sampled with it.
    seed = task_seed(m.seed, counter, ident.peer_id)
    body = dataclasses.replace(decode(RolloutBody, rec.body), sampling_seed=seed)
    if change:
        body = dataclasses.replace(body, logprobs=(change, *body.logprobs[1:]))
    reward = true_reward(body)
    if lie:
        reward = 1.0 - reward
    if claim is not None:
        reward = claim
    return make_record(
        ident,
        body,
        dataset=m.datasets[0].name,
        task_index=counter,
        counter=counter,
        task_seed=seed,
        reward=reward,
        run_id=run_id or m.run_id,
        policy_version=version,
        seq=seq,
        timestamp_ms=int((time.time() if signed_at is None else signed_at) * 1000),
    )
