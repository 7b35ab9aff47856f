"""The trainer role (until the training issue lands): collect verified rollouts, report.

It pulls every body (they land in the store), follows validators' verdicts, and reports
what it would train on at the current policy version: rollouts with at least one passing
verdict and no failing one, within the staleness bound, grouped by task, with their mean
reward. It never publishes weights, so the run stays at a fixed policy version.
Memory is bounded: it remembers at most `MAX_TRACKED` rollouts (oldest forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import trio

from node.roles import RoleContext
from protocol.admission import Admitted, Kind

PULLS_BODIES = True
MAX_TRACKED = 100_000
REPORT_EVERY_S = 2.0
PRINT_EVERY_S = 30.0


class _Track:
    __slots__ = ("body", "failed", "passed", "reward", "task", "version")

    def __init__(self) -> None:
        self.body = False
        self.passed = 0
        self.failed = 0
        self.reward = 0.0
        self.version = 0
        self.task: tuple[str, int] | None = None


def summarize(tracks: OrderedDict[bytes, _Track], version: int, max_staleness: int) -> dict[str, Any]:
    verified = [t for t in tracks.values() if t.body and t.passed and not t.failed]
    usable = [t for t in verified if version - t.version <= max_staleness]
    groups = {t.task for t in usable}
    return {
        "bodies": sum(t.body for t in tracks.values()),
        "verified": len(verified),
        "rejected": sum(1 for t in tracks.values() if t.failed),
        "unverified": sum(1 for t in tracks.values() if t.body and not t.passed and not t.failed),
        "usable_at_version": len(usable),
        "task_groups": len(groups),
        "usable_reward_mean": round(sum(t.reward for t in usable) / len(usable), 4) if usable else None,
    }


async def run(peer: Any, ctx: RoleContext) -> None:
    tracks: OrderedDict[bytes, _Track] = OrderedDict()

    def track(rid: bytes) -> _Track:
        t = tracks.get(rid)
        if t is None:
            t = tracks[rid] = _Track()
            if len(tracks) > MAX_TRACKED:
                tracks.popitem(last=False)
        return t

    def on_deliver(item: Admitted) -> None:
        if item.kind is Kind.ROLLOUT_RECORD:
            t = track(item.content_id)
            t.body = True
            t.reward = item.obj.header.reward
            t.version = item.envelope.policy_version
            t.task = (item.obj.header.dataset, item.obj.header.task_index)
        elif item.kind is Kind.VERDICT:
            t = track(item.obj.rollout_id)
            if item.obj.passed:
                t.passed += 1
            else:
                t.failed += 1

    peer.on_deliver(on_deliver)
    ctx.say("trainer: collecting verified rollouts (training not built yet: fixed policy version)")
    last_print = trio.current_time()
    while True:
        await trio.sleep(REPORT_EVERY_S)
        summary = summarize(tracks, peer.policy_version, peer.manifest.max_staleness)
        ctx.status.update(summary)
        if trio.current_time() - last_print >= PRINT_EVERY_S:
            last_print = trio.current_time()
            ctx.say(
                f"trainer: would train on {summary['usable_at_version']} verified rollouts "
                f"({summary['task_groups']} tasks, reward mean {summary['usable_reward_mean']}) "
                f"at version {peer.policy_version}; {summary['bodies']} received, "
                f"{summary['rejected']} rejected by validators, {summary['unverified']} not audited"
            )
