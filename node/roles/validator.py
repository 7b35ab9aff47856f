"""The validator role: audit a fraction of the rollouts it admits and gossip signed verdicts.

Which rollouts: those whose audit-sample ticket (`protocol.audit_sample`: our own
deterministic signature over the rollout id) falls below `audit_fraction`. Only we can
compute it, so a producer cannot re-sign its rollout until no validator samples it; the
ticket travels in the verdict, so anyone can check afterwards that the sample was honest.
In what order:
`protocol.audit_queue.AuditQueue` (fraud re-checks, then the newest policy version first;
records the trainer can no longer use are dropped unaudited, `dropped_stale`). How: one
batched prefill per batch with `verify.auditor.audit_many` (proof statistics, sampling
replay, log-probs, task and reward re-derived by `trainer.judge.make_judge`), in a
worker thread. A failed audit also costs the producer score (`Peer.report`), which bans
a peer that keeps cheating.

Fraud evidence (`protocol.fraud`): another validator's failed verdict opens a case; we
take the record (the store, or the body pull that every header starts) and audit it
ourselves, unsampled, with the same machinery. Reproduced, the producer is banned; not
reproduced, the accusing validator pays. Such re-checks publish no verdict.

Per producer (`verify.producer`): every audited record's `logprob_err_mean` joins its
producer's window (an aligned block of its task counters). Records sampled one by one
almost never fill a window, so a window whose own ticket is sampled
(`producer_window_fraction`, `protocol.audit_sample.window_ticket`) is audited whole; its
records that no record ticket sampled publish no verdict (`window_audited`). A full
window (`producer_windows` counts them) whose median is over the calibrated limit costs the producer `PRODUCER_PENALTY` here and is gossiped as a
signed `ProducerClaim`. Another validator's claim is re-checked like a failed verdict
(`protocol.producer_cases`): we take every record of the window, audit each ourselves,
and the producer or the accuser pays by our median (`producer_findings`,
`producer_findings_last`, `producer_claims` in status).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import trio

from node.errors import CommandError
from node.roles import RoleContext
from protocol.admission import Admitted, Kind
from protocol.audit_queue import AuditQueue
from protocol.audit_sample import sample_ticket, sampled, window_ticket
from protocol.codec import encode
from protocol.fraud import Audit, FraudCases, NeedRecord, Punish
from protocol.identity import Identity
from protocol.producer_cases import PRODUCER_PENALTY, ProducerCases
from protocol.rollout import open_record
from protocol.wire import ProducerClaim, RolloutRecord
from verify.producer import ProducerTally

PULLS_BODIES = True
NEEDS_MODEL = True
FAILED_AUDIT_PENALTY = -20.0
QUEUE = 1024

# Queued for a window audit only (`protocol.audit_sample.window_ticket`): the record's own
# ticket did not sample it, so its verdict counts here and is not published.
WINDOW_ONLY = b""


def selected(identity: Identity, run_id: str, rollout_id: bytes, fraction: float) -> bool:
    """Our sample: True for about `fraction` of rollout ids, unpredictable to producers."""
    return sampled(sample_ticket(identity, run_id, rollout_id), fraction)


def load(ctx: RoleContext, manifest: Any) -> tuple[Any, Any, Any, Any]:
    """Model, judge, audit settings and EOS ids (blocking: call in a thread)."""
    from node.local_model import load_calibration
    from node.paths import resolve_model
    from trainer.engine_hf import torch_threads
    from trainer.judge import make_judge
    from trainer.model_dir import load_model_dir
    from verify.auditor import eos_token_ids, settings_for_run

    path = resolve_model(ctx.model, manifest.model, ctx.models_dir)
    with torch_threads(ctx.threads):
        model, tokenizer = load_model_dir(path)
    settings, note = load_calibration(path, settings_for_run(manifest), manifest)
    ctx.say(f"validator: {manifest.worker_precision} workers; {note}")
    return model, make_judge(manifest, tokenizer), settings, eos_token_ids(model)


FETCH_WAIT_S = 30.0


class HeldVersions:
    """The policy versions this validator can judge: version 0 (the model directory) and
    versions the node's weight store installed (`peer.weights`, the broadcast), loaded on
    first use into a copy of the base model; at most `KEEP` besides version 0."""

    KEEP = 2

    def __init__(self, base: Any) -> None:
        self.base = base
        self.models: dict[int, Any] = {0: base}
        self.failed: set[int] = set()

    def get(self, version: int) -> Any | None:
        return self.models.get(version)

    async def fetch(self, peer: Any, version: int) -> None:
        weights = getattr(peer, "weights", None)
        if version in self.models or version in self.failed or weights is None:
            return
        if version not in weights.installed() and version <= weights.target:
            with trio.move_on_after(FETCH_WAIT_S):  # announced, downloading: worth a wait
                await weights.wait_installed(version)
        if version not in weights.installed():
            return
        try:
            state = await weights.load_state_dict(version)
            model = await trio.to_thread.run_sync(self._load, state)
        except (OSError, KeyError, RuntimeError, ValueError, CommandError):
            self.failed.add(version)  # not loadable here: such records stay unjudged
            return
        for old in sorted(v for v in self.models if v != 0)[: max(0, len(self.models) - self.KEEP)]:
            del self.models[old]
        self.models[version] = model

    def _load(self, state: dict[str, Any]) -> Any:
        import copy

        from node.roles.policy_versions import load_weights

        model = copy.deepcopy(self.base)
        load_weights(model, state)  # strict, except tied tensors a checkpoint holds once
        return model.eval()


async def run(peer: Any, ctx: RoleContext) -> None:
    from trainer.engine_hf import torch_threads
    from verify.auditor import audit_many

    model, judge, settings, eos_ids = await trio.to_thread.run_sync(load, ctx, peer.manifest)
    queue = AuditQueue(peer.manifest.max_staleness, QUEUE)
    kick_send, kick_receive = trio.open_memory_channel[None](1)
    counts = {"seen": 0, "sampled": 0, "passed": 0, "failed": 0, "queue_full": 0, "unauthorized": 0,
              "rechecks": 0, "dropped_stale": 0, "producer_findings": 0, "window_audited": 0}  # fmt: skip
    reasons: dict[str, int] = {}
    fraud = FraudCases()
    th = settings.thresholds if settings.precision == "fp32" else settings.bf16_thresholds
    producers = ProducerTally(th.producer_logprob_err_median)
    claims = ProducerCases(th.producer_logprob_err_median)
    findings: list[dict[str, Any]] = []

    def carry_out(actions: list[Any], record: Any = None) -> None:
        for action in actions:
            if isinstance(action, Punish):
                peer.report(action.peer, action.penalty, action.reason)
            elif isinstance(action, NeedRecord):
                nursery.start_soon(from_store, action.rollout_id)
            elif isinstance(action, Audit) and record is not None:
                enqueue(record, None)  # no ticket: a re-check, not our sample
                counts["rechecks"] += 1

    def enqueue(ro: Any, ticket: bytes | None) -> None:
        version = ro.envelope.policy_version
        for old_ro, old_ticket in queue.push((ro, ticket), version, recheck=ticket is None):
            counts["queue_full"] += 1
            if old_ticket is None:
                cannot_judge(old_ro.rollout_id)
        with contextlib.suppress(trio.WouldBlock):
            kick_send.send_nowait(None)

    def cannot_judge(rid: bytes) -> None:
        fraud.cannot_judge(rid)
        claims.cannot_judge(rid)

    def wanted(rid: bytes) -> bool:
        return fraud.is_open(rid) or claims.wants(rid)

    def record_here(ro: Any) -> None:
        """A record that an open fraud case or producer claim needs is held: audit it
        (once, whichever case asked)."""
        rid, now = ro.rollout_id, time.time()
        acts = list(fraud.record_held(rid, now)) if fraud.is_open(rid) else []
        if claims.wants(rid):
            acts += claims.record_held(rid, ro.envelope.signer, ro.header.counter, now)
        audits = [a for a in acts if isinstance(a, Audit)]
        carry_out([a for a in acts if not isinstance(a, Audit)] + audits[:1], ro)

    async def from_store(rid: bytes) -> None:
        row = await trio.to_thread.run_sync(peer.store.get_rollout, rid)
        if row is None or row.body is None or not wanted(rid):
            return  # the body pull brings it to on_deliver, or the case expires
        try:
            ro = open_record(encode(RolloutRecord(header=row.header, body=row.body)))
        except Exception:  # stored records were checked on the way in; be safe anyway
            cannot_judge(rid)
            return
        record_here(ro)

    def on_verdict(item: Admitted) -> None:
        v = item.obj
        if v.passed or item.envelope.signer == peer.identity.peer_id:
            return
        now = time.time()
        fraud.tick(now)
        carry_out(fraud.accused(v.rollout_id, v.producer, item.envelope.signer, v.reason, now))

    def on_claim(item: Admitted) -> None:
        c = item.obj
        if item.envelope.signer == peer.identity.peer_id:
            return
        now = time.time()
        claims.tick(now)
        carry_out(claims.claimed(c.producer, c.rollout_ids, item.envelope.signer, now))

    def on_deliver(item: Admitted) -> None:
        if item.kind is Kind.VERDICT:
            on_verdict(item)
            return
        if item.kind is Kind.PRODUCER_CLAIM:
            on_claim(item)
            return
        if item.kind is not Kind.ROLLOUT_RECORD:
            return
        if wanted(item.content_id):
            record_here(item.obj)
        counts["seen"] += 1
        ticket = sample_ticket(peer.identity, peer.run_id, item.content_id)
        if sampled(ticket, ctx.audit_fraction):
            enqueue(item.obj, ticket)
            counts["sampled"] += 1
            return
        ro = item.obj
        window = ro.header.counter // producers.window
        if sampled(window_ticket(peer.identity, peer.run_id, ro.envelope.signer, window),
                   ctx.producer_window_fraction):  # fmt: skip
            enqueue(ro, WINDOW_ONLY)

    held = HeldVersions(model)

    def audit_held(batch: list[Any]) -> list[tuple[Any, Any]]:
        """(item, verdict) per item, each version's records against that version's model."""
        by_version: dict[int, list[Any]] = {}
        for item in batch:
            by_version.setdefault(item[0].envelope.policy_version, []).append(item)
        out = []
        with torch_threads(ctx.threads):
            for version, items in sorted(by_version.items()):
                rollouts = [ro for ro, _ in items]
                verdicts = audit_many(
                    rollouts, held.get(version), judge=judge, eos_ids=eos_ids, settings=settings
                )
                out += list(zip(items, verdicts, strict=True))
                counts[f"audited_v{version}"] = counts.get(f"audited_v{version}", 0) + len(items)
        return out

    async def audit_forever() -> None:
        while True:
            while not queue:
                await kick_receive.receive()
            newest = peer.weights.newest() if getattr(peer, "weights", None) is not None else None
            if newest is not None:
                queue.set_newest(newest)
            batch = queue.take(ctx.batch_size)
            counts["dropped_stale"] = queue.dropped["stale"]
            if not batch:
                continue
            # Version-aware: each record is judged with the weights of the version it claims.
            # A version this validator does not hold is not judged at all (no verdict, no
            # penalty: our lack must not cost the producer); `unknown_version` counts them.
            for version in {ro.envelope.policy_version for ro, _ in batch}:
                await held.fetch(peer, version)
            known = [
                item for item in batch if held.get(item[0].envelope.policy_version) is not None
            ]
            for ro, ticket in batch:
                if ticket is None and held.get(ro.envelope.policy_version) is None:
                    cannot_judge(ro.rollout_id)
            counts["unknown_version"] = counts.get("unknown_version", 0) + len(batch) - len(known)
            if not known:
                continue
            started = time.monotonic()
            judged = await trio.to_thread.run_sync(audit_held, known)
            batch = [item for item, _ in judged]
            verdicts = [v for _, v in judged]
            authorized = peer.admission.authority.may_judge(peer.identity.peer_id)
            if not authorized and not counts["unauthorized"]:
                ctx.say(
                    "validator: this key is not in the run's validator_keys and holds no "
                    "delegation: auditing, but not publishing verdicts nobody would count"
                )
            for (ro, ticket), verdict in zip(batch, verdicts, strict=True):
                now = time.time()
                metrics = {m.name: m.value for m in verdict.metrics}
                carry_out(fraud.audited(ro.rollout_id, verdict.passed, verdict.reason, now))
                carry_out(claims.audited(ro.rollout_id, metrics.get(producers.stat), now))
                if ticket is None:
                    continue  # a re-check: the case's outcome is all it decides
                found = producers.add(ro.envelope.signer, ro.header.counter, ro.rollout_id, metrics)
                if found is not None:
                    counts["producer_findings"] += 1
                    peer.report(found.producer, PRODUCER_PENALTY,
                                f"producer median {found.median:.3g} over {found.limit:.3g}")  # fmt: skip
                    findings.append({"producer": found.producer.hex()[-12:], "median": found.median,
                                     "limit": found.limit, "records": len(found.rollout_ids)})  # fmt: skip
                    del findings[:-8]
                    if authorized:
                        await peer.publish_producer_claim(ProducerClaim(
                            producer=found.producer, rollout_ids=found.rollout_ids,
                            statistic=producers.stat, median=found.median, limit=found.limit,
                        ))  # fmt: skip
                if ticket == WINDOW_ONLY:
                    counts["window_audited"] += 1  # no ticket samples it: nothing to publish
                elif authorized:
                    await peer.publish_verdict(dataclasses.replace(verdict, sample_ticket=ticket))
                else:
                    counts["unauthorized"] += 1
                if verdict.passed:
                    counts["passed"] += 1
                else:
                    counts["failed"] += 1
                    reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
                    peer.report(
                        ro.envelope.signer, FAILED_AUDIT_PENALTY, f"failed audit: {verdict.reason}"
                    )
            ctx.status.update(
                **counts,
                fail_reasons=dict(reasons),
                fraud=dict(fraud.counts),
                producer_findings_last=list(findings),
                producer_windows=producers.judged,
                producer_claims=dict(claims.counts),
                audit_s_per_rollout=round((time.monotonic() - started) / len(batch), 3),
            )

    async with trio.open_nursery() as nursery:
        peer.on_deliver(on_deliver)
        ctx.say(f"validator: model loaded; auditing {ctx.audit_fraction:.0%} of rollouts")
        await audit_forever()
