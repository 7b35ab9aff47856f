"""Quotas: what a sender may hand us and what a signer may publish, per unit of time.

Pure, time passed in. `TokenBucket` and `RateLimiter` are the buckets; `YoungView` the
new-signer allowance of a view that started empty; `Quota` the RATE stage (per sender,
before any decoding) and the QUOTA stage (per signer, and how many signers never admitted
before one sender or all together may introduce).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.admission.config import AdmissionConfig
from protocol.admission.inflight import InFlight, Refused, same_peer
from protocol.admission.vocabulary import AUTHORED_NEW_IDENTITY_PENALTY, Reason, Stage

__all__ = ["Quota", "RateLimiter", "TokenBucket", "YoungView"]


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; a clock going backwards refills nothing."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float, n: float = 1.0) -> bool:
        """Take `n` tokens if there are that many (refilled up to `now` first)."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class RateLimiter:
    """Token buckets by key, at most `max_keys` (least recently used forgotten first)."""

    def __init__(self, rate: float, burst: float, max_keys: int) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[Any, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: Any, now: float, scale: float = 1.0) -> bool:
        """Take a token of `key`'s bucket; `scale` multiplies its rate and burst."""
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = TokenBucket(self.rate, self.burst, self.burst, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if scale != 1.0 or b.rate != self.rate:
            b.rate, b.burst = self.rate * scale, self.burst * scale
        return b.take(now)


class YoungView:
    """The new-signer allowance of a view that started empty (see `AdmissionConfig`).

    Why it is safe: the rates of new signers protect a running view from a flood of fresh
    keys (each would shed a bad key's record and get its own signer rate). A view that
    restored its signers (`Known`) is never young, so a restart opens nothing; a young view
    has no records to shed yet, and what it admits is bounded in count, per sender and in
    time. Headers a sender authored for another key never draw on it."""

    def __init__(self, signers: int, per_sender: int, window_s: float) -> None:
        self.left, self.per_sender, self.window_s = signers, per_sender, window_s
        self.started: float | None = None
        self.by_sender: dict[Any, int] = {}  # at most `signers` keys: each took one

    def close(self) -> None:
        """No more allowance (a view restored from the store, or its window ended)."""
        self.left = 0
        self.by_sender.clear()

    def take(self, sender: Any, now: float) -> bool:
        """Take one new signer of the allowance for `sender`, if any is left to it."""
        if self.left <= 0:
            return False
        if self.started is None:
            self.started = now
        if now - self.started > self.window_s:
            self.close()
            return False
        n = self.by_sender.get(sender, 0)
        if n >= self.per_sender:
            return False
        self.by_sender[sender] = n + 1
        self.left -= 1
        return True


class Quota:
    """The RATE and QUOTA stages and their state: sender buckets (and the overrun past
    which a sender pays), signer buckets scaled by `rate_factor(signer)` (the signer's
    verified standing), the signers admitted before, and the young view's allowance."""

    def __init__(self, cfg: AdmissionConfig, rate_factor: Callable[[bytes], float]) -> None:
        self._rate_factor = rate_factor
        self._max_signers = cfg.max_signers
        self._sender_rate = RateLimiter(cfg.sender_rate, cfg.sender_burst, cfg.max_rate_keys)
        self._overrun = RateLimiter(cfg.sender_overrun_rate, cfg.sender_burst, cfg.max_rate_keys)
        self._signer_rate = RateLimiter(cfg.signer_rate, cfg.signer_burst, cfg.max_rate_keys)
        self._new_signers = RateLimiter(
            cfg.new_signer_rate, cfg.new_signer_burst, cfg.max_rate_keys
        )
        self._new_signers_all = TokenBucket(
            cfg.new_signer_rate_all, cfg.new_signer_burst_all, cfg.new_signer_burst_all, -math.inf
        )
        self._known_signers: OrderedDict[bytes, None] = OrderedDict()
        self.young = YoungView(cfg.young_view_signers, cfg.young_view_per_sender, cfg.young_view_s)

    def check_sender(self, m: InFlight) -> None:
        """RATE: the cheap per-sender limit, before any decoding or signature check. Over
        it the message is dropped unopened; the sender pays only past a second allowance
        (`sender_overrun_rate` more per second): honest relays may be busy."""
        if not self._sender_rate.allow(m.peer, m.now):
            pen = 0.0 if self._overrun.allow(m.peer, m.now) else None
            raise Refused(Stage.RATE, Reason.RATE_LIMITED, "sender over its rate", pen)

    def check_signer(self, m: InFlight) -> None:
        """QUOTA: what one signer may publish, counted only for fresh, unique messages:
        copies and replays sent by a third party never reach this stage, so never cost it.
        Fresh identities earn their place slowly: each sender may introduce only a few
        signers we have never admitted before (and all senders together a few more),
        except in a young view (`YoungView`: at a cold start every signer is new)."""
        assert m.opened is not None
        signer = m.opened.envelope.signer
        authored = m.origin == m.peer and not same_peer(m.peer, signer)
        if signer not in self._known_signers and not (
            (not authored and self.young.take(m.peer, m.now))
            or (self._new_signers.allow(m.peer, m.now) and self._new_signers_all.take(m.now))
        ):
            # Free for a relay (it may know these signers; we do not yet). But an honest
            # node publishes only what it signed itself, so a sender that is the gossip
            # origin of another signer's message is no relay: it pays for the refusal.
            raise Refused(
                Stage.QUOTA,
                Reason.NEW_IDENTITIES,
                "too many new signers at once",
                AUTHORED_NEW_IDENTITY_PENALTY if authored else None,
            )
        if not self._signer_rate.allow(signer, m.now, self._rate_factor(signer)):
            # Dropped, never charged: an honest producer may be faster than we accept (a
            # flood still pays at the per-sender stage), and its relays are not to blame.
            raise Refused(Stage.QUOTA, Reason.RATE_LIMITED, "signer over its rate", 0.0)

    def know_signer(self, signer: bytes) -> None:
        """`signer` had a message admitted (or is in our store): it is not new any more."""
        self._known_signers[signer] = None
        self._known_signers.move_to_end(signer)
        if len(self._known_signers) > self._max_signers:
            self._known_signers.popitem(last=False)
