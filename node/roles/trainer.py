"""The trainer role (until the training issue lands): collect verified rollouts, report.

It pulls every body (they land in the store), follows validators' verdicts, and reports
what it would train on at the current policy version. Which rollouts count is the run's
rule, not this module's: `protocol.verified.judge` (only verdicts of keys that may judge,
never the producer's own, naming the right producer, with the manifest's quorum) and
`protocol.accounting.WorkLedger` (dense counters: a producer that withholds counters past
its allowance is refused and scored down, and withheld work counts as reward 0).
It never publishes weights, so the run stays at a fixed policy version.
Memory is bounded: it remembers at most `MAX_TRACKED` rollouts (oldest forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import trio

from node.roles import RoleContext
from protocol.accounting import WorkLedger
from protocol.admission import Admitted, Kind
from protocol.authority import Authority
from protocol.verified import Status, VerifiedRule, Vote, judge

PULLS_BODIES = True
MAX_TRACKED = 100_000
MAX_VOTES = 16  # votes remembered per rollout
REPORT_EVERY_S = 2.0
PRINT_EVERY_S = 30.0
WITHHELD_PENALTY = -20.0  # each time a producer's withheld counters pass its allowance


class _Track:
    __slots__ = ("body", "producer", "reward", "task", "version", "votes")

    def __init__(self) -> None:
        self.body = False
        self.producer = b""
        self.reward = 0.0
        self.version = 0
        self.task: tuple[str, int] | None = None
        self.votes: list[Vote] = []


class Collector:
    """What the trainer heard: rollouts, votes and counters (driven by `on_deliver`)."""

    def __init__(self, authority: Authority, rule: VerifiedRule, ledger: WorkLedger | None = None):
        self.authority, self.rule = authority, rule
        self.ledger = ledger if ledger is not None else WorkLedger()
        self.tracks: OrderedDict[bytes, _Track] = OrderedDict()

    def track(self, rid: bytes) -> _Track:
        t = self.tracks.get(rid)
        if t is None:
            t = self.tracks[rid] = _Track()
            if len(self.tracks) > MAX_TRACKED:
                self.tracks.popitem(last=False)
        return t

    def on_deliver(self, item: Admitted) -> bytes | None:
        """Take one admitted item; returns a producer that just went past its allowance."""
        if item.kind in (Kind.ROLLOUT_RECORD, Kind.ROLLOUT_HEADER):
            header = item.obj.header if item.kind is Kind.ROLLOUT_RECORD else item.obj
            t = self.track(item.content_id)
            t.producer = item.envelope.signer
            t.reward = header.reward
            t.version = item.envelope.policy_version
            t.task = (header.dataset, header.task_index)
            t.body = t.body or item.kind is Kind.ROLLOUT_RECORD
            was = self.ledger.allowed(t.producer)
            self.ledger.add(t.producer, header.counter, header.reward)
            if was and not self.ledger.allowed(t.producer):
                return t.producer
        elif item.kind is Kind.VERDICT:
            t = self.track(item.obj.rollout_id)
            if len(t.votes) < MAX_VOTES:
                t.votes.append(Vote(item.envelope.signer, item.obj.producer, item.obj.passed))
        return None

    def status(self, t: _Track) -> Status:
        if not t.producer:
            return Status.PENDING
        return judge(t.producer, t.votes, self.authority, self.rule)

    def summarize(self, version: int, max_staleness: int) -> dict[str, Any]:
        statuses = [(t, self.status(t)) for t in self.tracks.values() if t.body]
        verified = [t for t, s in statuses if s is Status.VERIFIED]
        usable = [
            t
            for t in verified
            if version - t.version <= max_staleness and self.ledger.allowed(t.producer)
        ]
        producers = {t.producer for t in self.tracks.values() if t.producer}
        refused = sorted(p for p in producers if not self.ledger.allowed(p))
        return {
            "bodies": len(statuses),
            "verified": len(verified),
            "rejected": sum(1 for _, s in statuses if s is Status.REJECTED),
            "unverified": sum(1 for _, s in statuses if s is Status.PENDING),
            "usable_at_version": len(usable),
            "task_groups": len({t.task for t in usable}),
            "usable_reward_mean": round(sum(t.reward for t in usable) / len(usable), 4)
            if usable
            else None,
            "producers_refused": len(refused),
            "withheld": sum(s.withheld for p in producers if (s := self.ledger.standing(p))),
        }


async def run(peer: Any, ctx: RoleContext) -> None:
    collector = Collector(
        peer.admission.authority, VerifiedRule(quorum=peer.manifest.verdict_quorum)
    )

    def on_deliver(item: Admitted) -> None:
        bad = collector.on_deliver(item)
        if bad is not None:
            peer.report(bad, WITHHELD_PENALTY, "withheld assignment counters")

    peer.on_deliver(on_deliver)
    ctx.say("trainer: collecting verified rollouts (training not built yet: fixed policy version)")
    last_print = trio.current_time()
    while True:
        await trio.sleep(REPORT_EVERY_S)
        summary = collector.summarize(peer.policy_version, peer.manifest.max_staleness)
        ctx.status.update(summary)
        if trio.current_time() - last_print >= PRINT_EVERY_S:
            last_print = trio.current_time()
            ctx.say(
                f"trainer: would train on {summary['usable_at_version']} verified rollouts "
                f"({summary['task_groups']} tasks, reward mean {summary['usable_reward_mean']}) "
                f"at version {peer.policy_version}; {summary['bodies']} received, "
                f"{summary['rejected']} rejected by validators, {summary['unverified']} not audited"
            )
