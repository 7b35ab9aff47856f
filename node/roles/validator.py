"""The validator role: audit a fraction of the rollouts it admits and gossip signed verdicts.

Which rollouts: a deterministic sample (hash of our peer id and the rollout id below
`audit_fraction`), so each validator checks a different, reproducible subset. How: one
batched prefill per batch with `verify.auditor.audit_many` (proof statistics, sampling
replay, log-probs, task and reward re-derived by `node.commands.audit.make_judge`), in a
worker thread. A failed audit also costs the producer score (`Misbehaved`), which bans a
peer that keeps cheating.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from node.roles import RoleContext
from protocol.admission import Admitted, Kind, Misbehaved
from protocol.content_id import content_id
from protocol.identity import peer_id_to_b58

PULLS_BODIES = True
NEEDS_MODEL = True
FAILED_AUDIT_PENALTY = -20.0
QUEUE = 1024


def selected(own_peer: bytes, rollout_id: bytes, fraction: float) -> bool:
    """The deterministic sample: True for about `fraction` of rollout ids."""
    if fraction >= 1.0:
        return True
    h = int.from_bytes(content_id(own_peer + rollout_id)[:8], "big")
    return h < fraction * 2.0**64


def load(ctx: RoleContext, manifest: Any) -> tuple[Any, Any, Any, Any]:
    """Model, judge, audit settings and EOS ids (blocking: call in a thread)."""
    from node.commands.audit import make_judge
    from node.commands.rollouts import resolve_model
    from trainer.engine_hf import torch_threads
    from trainer.model_dir import load_model_dir
    from verify.auditor import AuditSettings, eos_token_ids

    path = resolve_model(ctx.model, manifest.model, ctx.models_dir)
    with torch_threads(ctx.threads):
        model, tokenizer = load_model_dir(path)
    settings = AuditSettings(
        chunk=manifest.proof_chunk, topk=manifest.proof_topk, expected_settings=manifest
    )
    return model, make_judge(manifest, tokenizer), settings, eos_token_ids(model)


async def run(peer: Any, ctx: RoleContext) -> None:
    from trainer.engine_hf import torch_threads
    from verify.auditor import audit_many

    model, judge, settings, eos_ids = await trio.to_thread.run_sync(load, ctx, peer.manifest)
    send, receive = trio.open_memory_channel[Any](QUEUE)
    counts = {"seen": 0, "sampled": 0, "passed": 0, "failed": 0, "queue_full": 0}
    reasons: dict[str, int] = {}

    def on_deliver(item: Admitted) -> None:
        if item.kind is not Kind.ROLLOUT_RECORD:
            return
        counts["seen"] += 1
        if not selected(peer.identity.peer_id, item.content_id, ctx.audit_fraction):
            return
        try:
            send.send_nowait(item.obj)
            counts["sampled"] += 1
        except trio.WouldBlock:
            counts["queue_full"] += 1

    peer.on_deliver(on_deliver)
    ctx.say(f"validator: model loaded; auditing {ctx.audit_fraction:.0%} of rollouts")

    def audit(batch: list[Any]) -> list[Any]:
        with torch_threads(ctx.threads):
            return audit_many(batch, model, judge=judge, eos_ids=eos_ids, settings=settings)

    while True:
        batch = [await receive.receive()]
        while len(batch) < ctx.batch_size:
            try:
                batch.append(receive.receive_nowait())
            except trio.WouldBlock:
                break
        started = time.monotonic()
        verdicts = await trio.to_thread.run_sync(audit, batch)
        for ro, verdict in zip(batch, verdicts, strict=True):
            await peer.publish_verdict(verdict)
            if verdict.passed:
                counts["passed"] += 1
            else:
                counts["failed"] += 1
                reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
                peer._apply(peer.admission.handle(Misbehaved(
                    peer_id_to_b58(ro.envelope.signer), FAILED_AUDIT_PENALTY,
                    f"failed audit: {verdict.reason}", time.time(),
                )))
        ctx.status.update(
            **counts, fail_reasons=dict(reasons),
            audit_s_per_rollout=round((time.monotonic() - started) / len(batch), 3),
        )
