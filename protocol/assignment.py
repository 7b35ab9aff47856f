"""The sampling seed of a rollout, derived from who made it: the binding of work to its
producer.

`task_seed(run_seed, counter, producer)` is the sampler's seed of rollout `counter` made by
`producer` (`trainer.tasks` derives the task from the same inputs). The policy version is
not an input: one counter is one task whatever version a rollout claims, so a worker
cannot sample a task under several versions and publish whichever solved it (a second
rollout of the same counter is double work, `protocol.admission`). A header carries it, and a record's body carries it as its sampling
seed; since only the producer's key yields it, a header re-signed by anyone else names a
seed that is not its signer's, and admission refuses it before its copy can shadow the
producer's (`protocol.admission`, `Reason.NOT_BOUND`).
"""

from __future__ import annotations

import struct

from protocol.content_id import content_id

__all__ = ["task_seed"]

SAMPLE_DOMAIN = b"swarm-node/sample/v1"


def task_seed(run_seed: int, counter: int, producer: bytes) -> int:
    """u64 of content_id(domain | u64 run seed | u64 counter | producer)."""
    packed = struct.pack(">QQ", run_seed, counter)
    return int.from_bytes(content_id(SAMPLE_DOMAIN + packed + bytes(producer))[:8], "big")
