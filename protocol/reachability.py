"""Reachability by agreement: whom to ask whether we are publicly reachable (AutoNAT), and
what their answers add up to, so that a few lying peers cannot flip the verdict.

A round: `pick_servers` chooses the peers to ask, at random (never by id, which anyone
can grind) and at most one per IP subnet (/24 for IPv4, /48 for IPv6: one operator's
identities on one network count once). Each answer is an `Answer` event: the peer said
it dialled us back (`reachable`) or that its dial failed, and whether we saw the
dial-back arrive (`proven`: a new inbound connection authenticated as that peer during
the round, which only a peer that reached us can open, as AutoNAT v2's nonce proves).
A refusal or no answer is no vote. `Round.finish()` gives the verdict:

- A proven dial-back decides: we are public. Every peer of the round that said its dial
  failed is contradicted by it and is charged (`Charge`).
- Otherwise the verdict changes only when at least `quorum` peers (fewer when fewer
  subnets were asked: `min(quorum, asked)`) agree on the new one and more agree on it
  than on the other; else the verdict stays what it was.

The verdict is one of `PUBLIC`, `PRIVATE`, `UNKNOWN` (nothing decided yet). Pure: no
clock, no IO; randomness comes from the `random.Random` the caller passes.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

PUBLIC = "public"
PRIVATE = "private"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ReachabilityRules:
    """How many peers a round asks and how many must agree."""

    servers: int = 5  # peers asked per round, one per subnet
    quorum: int = 3  # agreeing answers needed to change the verdict
    v4_prefix: int = 24
    v6_prefix: int = 48


@dataclass(frozen=True, slots=True)
class Answer:
    """One peer's answer: it dialled us back (`reachable`) or its dial failed; `proven`:
    its dial-back was seen to arrive."""

    peer: str
    reachable: bool
    proven: bool = False


@dataclass(frozen=True, slots=True)
class Charge:
    """Charge `peer`: its answer is contradicted by a proven dial-back."""

    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished round: the verdict, how many agreed with it of how many answered, the
    proven dial-backs, and whom to charge."""

    verdict: str
    agreed: int
    answered: int
    asked: int
    proven: int
    charges: tuple[Charge, ...] = ()


def subnet(ip: str | None, rules: ReachabilityRules = ReachabilityRules()) -> str:
    """The subnet `ip` counts in ("?" for an unknown or unparsable one: they share one)."""
    if not ip:
        return "?"
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "?"
    prefix = rules.v4_prefix if addr.version == 4 else rules.v6_prefix
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


def pick_servers(
    candidates: Sequence[tuple[str, str | None]],
    rng: random.Random,
    rules: ReachabilityRules = ReachabilityRules(),
) -> list[str]:
    """Up to `rules.servers` peers of `candidates` (peer, its IP), at random, at most one
    per subnet (a random one of each)."""
    shuffled = list(candidates)
    rng.shuffle(shuffled)
    chosen: list[str] = []
    seen: set[str] = set()
    for peer, ip in shuffled:
        net = subnet(ip, rules)
        if net in seen or peer in chosen:
            continue
        seen.add(net)
        chosen.append(peer)
        if len(chosen) >= rules.servers:
            break
    return chosen


@dataclass
class Round:
    """One round of answers (see the module docstring)."""

    asked: tuple[str, ...]
    verdict: str = UNKNOWN  # the verdict before this round
    rules: ReachabilityRules = field(default_factory=ReachabilityRules)
    answers: dict[str, Answer] = field(default_factory=dict)

    def answer(self, a: Answer) -> None:
        """Record one asked peer's answer (an unasked peer's is ignored; the last counts)."""
        if a.peer in self.asked:
            self.answers[a.peer] = a

    def finish(self) -> Outcome:
        """The verdict this round supports, and whom to charge."""
        answers = list(self.answers.values())
        proven = [a for a in answers if a.reachable and a.proven]
        said_public = [a for a in answers if a.reachable]
        said_private = [a for a in answers if not a.reachable]
        n = (len(self.asked), len(answers), len(proven))
        if proven:
            charges = tuple(
                Charge(a.peer, f"said its dial-back failed; {len(proven)} reached us")
                for a in said_private
            )
            return Outcome(PUBLIC, len(said_public), *n, charges)
        quorum = max(1, min(self.rules.quorum, len(self.asked)))
        for verdict, agree, other in (
            (PUBLIC, said_public, said_private),
            (PRIVATE, said_private, said_public),
        ):
            if len(agree) >= quorum and len(agree) > len(other):
                return Outcome(verdict, len(agree), *n)
        kept = said_public if self.verdict == PUBLIC else said_private
        agreed = len(kept) if self.verdict != UNKNOWN else 0
        return Outcome(self.verdict, agreed, *n)
