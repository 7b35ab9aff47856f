"""Synthetic but well-formed signed rollout records, for network tests and `bench gossip`.

These are NOT model output: random token ids, log-probs, and activation proofs built with
`verify.toploc` from random activations (so their bytes have the real size and format)
or, with `real_proofs=False`, random bytes of a proof's size (tests that never audit).
They pass admission (signature, digest, run, version) and nothing more; no role uses them.
"""

from __future__ import annotations

import random
import struct
import time

from node.run_file import manifest_from_table
from protocol.assignment import task_seed
from protocol.identity import Identity
from protocol.rollout import make_record
from protocol.wire import RolloutBody, RunManifest

PROOF_BYTES = 258  # 2 + 2 * 128, one per 32 tokens


def synthetic_record(
    identity: Identity,
    manifest: RunManifest,
    counter: int,
    *,
    policy_version: int = 0,
    n_prompt: int = 128,
    n_completion: int = 1024,
    seq: int | None = None,
    real_proofs: bool = False,
    proof_pool: list[tuple[bytes, ...]] | None = None,
    rng: random.Random | None = None,
) -> bytes:
    """One signed record; ~20 KB with the defaults (tokens, log-probs, 32 proofs)."""
    rng = rng or random.Random(counter)
    n_chunks = (n_completion + 31) // 32
    if proof_pool:
        proofs = rng.choice(proof_pool)[:n_chunks]
    elif real_proofs:
        import torch  # deferred: heavy import

        from verify.toploc import build_proofs_bytes  # deferred: heavy import

        gen = torch.Generator().manual_seed(rng.getrandbits(32))
        proofs = tuple(build_proofs_bytes(torch.randn(n_completion, 64, generator=gen)))
    else:
        proofs = tuple(rng.randbytes(PROOF_BYTES) for _ in range(n_chunks))
    body = RolloutBody(
        prompt_ids=tuple(rng.randrange(32_000) for _ in range(n_prompt)),
        completion_ids=tuple(rng.randrange(32_000) for _ in range(n_completion)),
        logprobs=tuple(
            struct.unpack(
                f"<{n_completion}f",
                struct.pack(
                    f"<{n_completion}f", *(-rng.random() * 5.0 for _ in range(n_completion))
                ),
            )
        ),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max(1, n_completion),
        sampling_seed=task_seed(manifest.seed, counter, identity.peer_id),  # bound, as a worker's
        finish_reason="length",
        proofs=proofs,
    )
    now_ms = int(time.time() * 1000)
    return make_record(
        identity,
        body,
        dataset=manifest.datasets[0].name,
        task_index=counter,
        counter=counter,
        task_seed=task_seed(manifest.seed, counter, identity.peer_id),
        reward=rng.random(),
        run_id=manifest.run_id,
        policy_version=policy_version,
        seq=seq if seq is not None else time.time_ns() // 1000,
        timestamp_ms=now_ms,
    )


def make_proof_pool(n: int, n_completion: int = 1024, seed: int = 0) -> list[tuple[bytes, ...]]:
    """`n` lists of real TOPLOC proofs (from random activations) to draw from cheaply."""
    import torch  # deferred: heavy import

    from verify.toploc import build_proofs_bytes  # deferred: heavy import

    gen = torch.Generator().manual_seed(seed)
    return [
        tuple(build_proofs_bytes(torch.randn(n_completion, 64, generator=gen))) for _ in range(n)
    ]


def net_manifest(run_id: str = "net-test", max_staleness: int = 2) -> RunManifest:
    """A minimal run manifest for network tests and benchmarks (no model is loaded)."""

    return manifest_from_table(
        {
            "run": {"id": run_id, "seed": 7, "max_staleness": max_staleness},
            "datasets": [{"name": "basic_arithmetic", "weight": 1}],
        }
    )
