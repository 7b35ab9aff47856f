"""Claims of policy versions we have not heard of: who must back them, and who pays.

A gossiped message signed at policy version v more than `max_future_versions` ahead of
ours is refused (FUTURE_VERSION), free for its sender: we may simply be behind. But an
honest sender can always back such a claim. Every version above 0 exists only as a
manifest signed by a trainer key, and an honest peer takes part only in versions it
installed. So the signer of a message at version v holds a signed manifest of version v or
newer, and a relay, whose admission passes versions at most `max_future_versions` ahead of
its own, holds one of version v - max_future_versions or newer. The node therefore asks the
sender for the newest signed manifest it holds (the shard stream's "newest" request). A
sender that answers with none new enough made a claim no honest peer makes and pays
(UNBACKED_VERSION); one that backs it has told us that we are behind (nobody pays); one that
does not answer pays nothing (no evidence: it may be restarting).

Who pays: only the peer that handed us the claim, and only when it answered itself. A third
party cannot make us ask an honest peer anything it cannot back: we ask only the sender of
the very bytes, about a version its own admission would have had to pass.

`VersionClaims` is the bookkeeping: at most one open question per sender, at most one per
`min_interval_s` per sender, at most `max_open` in all (a flood of claims costs us a few
small requests, never a request per message). Pure: time is passed in; no IO.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from protocol.errors import LocalProtocolError


@dataclass(frozen=True, slots=True)
class AskNewest:
    """Action: ask `peer` for the newest trainer-signed manifest it holds; the claim it
    made is backed by one of version `at_least` or newer. Report the answer with
    `Admission.handle(NewestShown(...))`."""

    peer: Hashable
    at_least: int


class VersionClaims:
    """Open questions about claimed versions, per sender (see the module docstring)."""

    def __init__(
        self, *, min_interval_s: float = 10.0, max_open: int = 64, max_peers: int = 4096
    ) -> None:
        if min_interval_s < 0 or max_open < 1 or max_peers < 1:
            raise LocalProtocolError("VersionClaims limits must be positive")
        self.min_interval_s, self.max_open, self.max_peers = min_interval_s, max_open, max_peers
        self._open: dict[Hashable, int] = {}  # peer -> the version its answer must reach
        self._asked_at: OrderedDict[Hashable, float] = OrderedDict()

    def claimed(self, peer: Hashable, at_least: int, now: float) -> AskNewest | None:
        """`peer` handed us a claim backed only by a manifest of version >= `at_least`:
        the question to ask it, or None (one is open, it was asked recently, or too many
        are open)."""
        if at_least <= 0 or peer in self._open or len(self._open) >= self.max_open:
            return None
        last = self._asked_at.get(peer)
        if last is not None and now - last < self.min_interval_s:
            return None
        self._asked_at[peer] = now
        self._asked_at.move_to_end(peer)
        while len(self._asked_at) > self.max_peers:
            old, _ = self._asked_at.popitem(last=False)
            self._open.pop(old, None)
        self._open[peer] = int(at_least)
        return AskNewest(peer, int(at_least))

    def answered(self, peer: Hashable, shown: int | None) -> bool:
        """The answer of `peer`: `shown` is the version of the valid trainer-signed manifest
        it sent (None: none, or not a valid one). True when its claim is unbacked (it
        pays); False when it is backed, or no question was open (an unasked answer is
        no evidence)."""
        need = self._open.pop(peer, None)
        if need is None:
            return False
        return shown is None or shown < need

    def unanswered(self, peer: Hashable) -> None:
        """No answer came (could not connect, timed out): close the question, no blame."""
        self._open.pop(peer, None)

    def open_count(self) -> int:
        """Questions asked and not yet answered."""
        return len(self._open)
