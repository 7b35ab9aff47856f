"""Credit: what a producer's work is worth, from bodies someone holds, never from headers.

A header claims a reward; it proves nothing. A producer's credit for a counter is the
reward *re-scored* from a body the trainer holds (or that a validator re-scored in its
verdict); a judgement against the weights of the version it claims (a verdict: a validator
holds those weights) can only take it back. Per counter, in order:

    header heard        open: it claims (version, reward); nothing is credited yet
    body re-scored      held: credited our re-score at once; a claim that differs from it
                        by more than `tolerance` is a `FalseClaim` (its producer pays
                        `penalties.FALSE_CLAIM`, once per counter)
    judged              a held body that failed its judgement is settled at 0 (its re-score
                        taken back); one that passed keeps its re-score
    pull window closes  a header still without a held body is settled at the judge's
    (`pull_window_s`)   re-score if a judge passed it (the judge holds the body), else it
                        is *skipped*: reward 0 (a body nobody could pull is work nobody can
                        check, so a claim never served is worth nothing)

The credited mean reward counts every counter once, and every held body's re-score, not
only the judged sample's (an estimate from the sample would carry its sampling noise):

    credited = reward_sum / (held + skipped + out_of_order + stale + withheld)

`reward_sum`: the re-scores of the held counters, 0 for each that failed its judgement;
`held`: counters whose body we re-scored or a judge judged; `withheld`: counters the
producer never published (`protocol.accounting.WorkLedger`). Every counter not held is
worth 0: a worker that publishes only what solved, or serves only the bodies that solved,
is credited its true rate; an honest one its true rate over the bodies it served, whatever
the audit fraction. What the judgements add is the producer's standing: a record that
fails its audit is 0 here, and it bans its producer (`protocol.standing`), whose
`credit_weight` is then 0 (everything clawed back), so credit for an unjudged record is
only ever provisional on the producer's audits.

The first header or body heard for (producer, counter) fixes its claim; a later one that
names another version is not this claim and changes nothing (admission refuses it as double
work).

Versions go forward. A worker makes its counters in order and moves to a newer version
when it installs one, so of two of its claims, the one with the higher counter never names
the lower version. A claim that would (a version below one it claimed at a lower counter,
or above one it claimed at a higher counter) is *out of order*: settled at 0 at once and
never trained on (`out_of_order`). That is what is left to a worker holding several
published versions that samples one task under each and publishes whichever solved it:
once it has published a counter at the newest version, the older ones earn nothing. Per
producer the counter span of each of its `max_versions` newest versions is kept; the first
claim heard keeps its place.

Going back once is free, going back again costs. An honest worker that restarts may make
one batch with older weights before it has loaded its newest: every claim of that batch
names one older version. So per producer, the first version it goes back to is free for
`back_window_s` (10 minutes, the half-life of a peer's score) from its first claim there:
every out-of-order claim at that version in the window costs nothing. An out-of-order claim
at any other version within the window is an `OutOfOrder` action: its producer (the key
that signed the claim, never a peer that relayed it) pays `penalties.OUT_OF_ORDER`, each
time. Once the window has passed, the next version gone back to is free again: an honest
worker restarting less often than every 10 minutes never pays. A window per producer
rather than one free going-back per lifetime, because the book forgets producers (bounded)
and honest workers restart more than once in a run. Windows are judged by the time the
producer signed each claim, never by when it reached us: a relay that holds a restart
batch for minutes (or serves it late as a pulled record) must not bring two restarts
into one window. A signed time is believed up to `max_skew_s` (admission's clock skew) in
our future; a claim is judged against every window kept (`_BACK_WINDOWS` per producer)
within `back_window_s` of it, before or after, so the order claims arrive in does not
matter. A producer that back-dates its own claims can at most spread its go-backs into
windows of their own and escape the charge, never earn: an out-of-order claim is 0 anyway.

Young keys earn at most the swarm's mean. A key's credit is a mean over the counters it
made public, and a fresh key chooses where its counters end: one that publishes while its
counters solve and is abandoned at the first that does not shows a mean of 1.0 (key
shopping). So a key with fewer than `young_counters` (`YOUNG_COUNTERS`) counters accounted
is credited at most the mean of the keys that are not young (`swarm_mean`; of every key
while none is old): an abandoned key is worth what an honest key earns at the swarm's
mean, whatever it hid. An honest key loses nothing once it is old (its own mean over all
its counters again); docs/DESIGN.md says why this rule and not crediting a key's whole
announced range.

Versions are left behind. Forward-only claims still leave a worker holding several
published versions one choice: to stay on an older one while it solves and step up only
when a newer one solves instead (it never goes back). An honest worker moves to a newer
version within a download and a batch of its publication. So the trainer, which knows when
it published each version (`on_published`; one it resumed at counts as published when it
started), settles a claim at version v as *stale* when it is first heard `stale_after_s`
(`STALE_AFTER_S`, 5 minutes) or more after the first newer version was published: reward
0, never trained on, free (a slow honest worker may be that late, and loses only that
tail). What staying low can still gain is the choice among the versions published in the
last 5 minutes (and admitted: at most S behind), an honest worker's lag; each choice costs
the shopper a sample per version for one counter, about what as many honest counters
cost. A claim that goes back is out of order (above) before it is stale: going back again
costs, however old the version.

Pure and bounded: no IO, time passed in; at most `max_open` claims not yet settled (oldest
settled as skipped first) and `max_producers` producers.

Public API
----------
`CreditBook(pull_window_s=300.0, tolerance=1e-4, max_open=262_144, max_producers=100_000,
max_versions=8, back_window_s=600.0, stale_after_s=STALE_AFTER_S, max_skew_s=120.0,
young_counters=YOUNG_COUNTERS)`
    `.on_published(version, now)`         we published `version` at `now`
    `.on_header(producer, counter, version, claimed, now, signed_at=None) -> OutOfOrder | None`
    `.on_body(producer, counter, version, claimed, rescored, now, signed_at=None)
        -> FalseClaim | OutOfOrder | None`
    `.on_judged(producer, counter, version, passed, rescored, now)`
    `.on_time(now)`                        close the pull windows that ended by `now`
    `.standing(producer) -> CreditStanding | None`
    `.out_of_order(producer, counter) -> bool`  settled as out of order
    `.not_trained(producer, counter) -> bool`   settled as out of order or stale: never train it
    `.credited_reward(producer, withheld=0) -> float | None`  (young keys: at most `swarm_mean`)
    `.swarm_mean() -> float | None`
`FalseClaim(producer, counter, claimed, rescored)`; `OutOfOrder(producer, counter, version)`;
`CreditStanding(held, judged, skipped, false_claims, reward_sum, out_of_order, stale)`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from protocol.errors import LocalProtocolError

__all__ = [
    "STALE_AFTER_S",
    "YOUNG_COUNTERS",
    "CreditBook",
    "CreditStanding",
    "FalseClaim",
    "OutOfOrder",
]

# A claim at a version heard this long after a newer one was published is stale: long
# enough for an honest worker to download the new version and finish the batch it was on.
STALE_AFTER_S = 300.0
# A key with fewer counters accounted than this is young: credited at most the swarm's mean.
YOUNG_COUNTERS = 64
# Free go-back windows remembered per producer (each opened at a signed time).
_BACK_WINDOWS = 4


@dataclass(frozen=True, slots=True)
class FalseClaim:
    """Action: `producer` signed a header claiming `claimed` for a body we re-scored at
    `rescored`; charge it `penalties.FALSE_CLAIM`."""

    producer: bytes
    counter: int
    claimed: float
    rescored: float


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    """Action: `producer` signed a claim going back to `version` at `counter`, not the
    version it went back to for free in this window; charge it `penalties.OUT_OF_ORDER`."""

    producer: bytes
    counter: int
    version: int


@dataclass(slots=True)
class CreditStanding:
    """What a producer's counters earned: held, judged, skipped, refused and their reward sum."""

    held: int = 0  # counters whose body we re-scored or a judge judged
    judged: int = 0  # ... of which judged
    skipped: int = 0  # headers whose body never came within the pull window
    false_claims: int = 0
    reward_sum: float = 0.0  # re-scores of the held counters, 0 for each that failed
    out_of_order: int = 0  # claims of a version behind one of a lower counter, or ahead of a higher
    stale: int = 0  # claims of a version first heard long after a newer one was published


class _Claim:
    __slots__ = ("claimed", "heard_at", "judge_score", "passed", "rescored", "version")

    def __init__(self, version: int, claimed: float | None, now: float) -> None:
        self.version, self.claimed, self.heard_at = version, claimed, now  # claimed: the header's
        self.rescored: float | None = None  # our own re-score of the body we hold
        self.passed: bool | None = None  # the judgement, once heard
        self.judge_score = 0.0  # the judge's re-score


class CreditBook:
    """Claims, held bodies and judgements per (producer, counter) (module docstring)."""

    def __init__(
        self,
        *,
        pull_window_s: float = 300.0,
        tolerance: float = 1e-4,
        max_open: int = 262_144,
        max_producers: int = 100_000,
        max_versions: int = 8,
        back_window_s: float = 600.0,
        stale_after_s: float = STALE_AFTER_S,
        max_skew_s: float = 120.0,
        young_counters: int = YOUNG_COUNTERS,
    ) -> None:
        if not (math.isfinite(pull_window_s) and pull_window_s > 0) or tolerance < 0:
            raise LocalProtocolError("CreditBook: pull_window_s > 0 and tolerance >= 0")
        if not (math.isfinite(back_window_s) and back_window_s >= 0 and stale_after_s >= 0):
            raise LocalProtocolError("CreditBook: back_window_s finite, >= 0; stale_after_s >= 0")
        if max_open < 1 or max_producers < 1 or max_versions < 1:
            raise LocalProtocolError("CreditBook: max_open, max_producers, max_versions >= 1")
        if not (math.isfinite(max_skew_s) and max_skew_s >= 0) or young_counters < 0:
            raise LocalProtocolError("CreditBook: max_skew_s finite, >= 0; young_counters >= 0")
        self.pull_window_s, self.tolerance = pull_window_s, tolerance
        self.max_open, self.max_producers, self.max_versions = max_open, max_producers, max_versions
        self.back_window_s, self.stale_after_s = back_window_s, stale_after_s
        self.max_skew_s, self.young_counters = max_skew_s, young_counters
        self._published: dict[int, float] = {}  # version -> when we published it (newest few)
        # producer -> its free go-back windows: (the version gone back to, signed time opened)
        self._free_back: OrderedDict[bytes, list[tuple[int, float]]] = OrderedDict()
        self._swarm: tuple[int, float | None] = (-1, None)  # (changes, mean) cached
        self._changes = 0  # settlements and held bodies so far (the cache's key)
        self._charge: OutOfOrder | None = None  # the charge of the claim just refused
        # producer -> version -> (lowest, highest) counter claimed at it
        self._spans: OrderedDict[bytes, dict[int, tuple[int, int]]] = OrderedDict()
        self._open: OrderedDict[tuple[bytes, int], _Claim] = OrderedDict()  # no body yet
        self._held: OrderedDict[tuple[bytes, int], _Claim] = OrderedDict()  # body, no verdict
        # -> "" settled, else why it is never trained on ("out_of_order", "stale")
        self._settled: OrderedDict[tuple[bytes, int], str] = OrderedDict()
        self._producers: OrderedDict[bytes, CreditStanding] = OrderedDict()

    def _claim(
        self,
        producer: bytes,
        counter: int,
        version: int,
        claimed: float | None,
        now: float,
        signed_at: float | None = None,
    ) -> _Claim | None:
        """The claim of (producer, counter), opened if new; None if settled or if it names
        another version than the claim heard first. `claimed`: the header's reward, None
        when what we heard was not the header (a verdict); `signed_at`: the time its
        producer signed it (None: `now`)."""
        key = (producer, counter)
        if key in self._settled:
            return None
        c = self._open.get(key) or self._held.get(key)
        if c is None:
            if not self._in_order(producer, counter, version):  # first: going back may cost
                self._standing(producer).out_of_order += 1
                self._settle(producer, counter, None, refused="out_of_order")
                if not self._back_is_free(producer, version, self._signed(now, signed_at)):
                    self._charge = OutOfOrder(producer, counter, version)
                return None
            if self._stale(version, now):
                self._standing(producer).stale += 1
                self._settle(producer, counter, None, refused="stale")
                return None
            c = self._open[key] = _Claim(version, claimed, now)
            if len(self._open) + len(self._held) > self.max_open:
                self._evict()
        if c.version != version:
            return None
        if c.claimed is None and claimed is not None:
            c.claimed = float(claimed)
        return c

    def _in_order(self, producer: bytes, counter: int, version: int) -> bool:
        """Whether a claim of `version` at `counter` keeps the producer's versions going
        forward; if so its counter joins the version's span."""
        spans = self._spans.get(producer)
        if spans is None:
            spans = self._spans[producer] = {}
            if len(self._spans) > self.max_producers:
                self._spans.popitem(last=False)
        else:
            self._spans.move_to_end(producer)
        for v, (lo, hi) in spans.items():
            if (v > version and lo < counter) or (v < version and hi > counter):
                return False
        lo, hi = spans.get(version, (counter, counter))
        spans[version] = (min(lo, counter), max(hi, counter))
        while len(spans) > self.max_versions:
            del spans[min(spans)]
        return True

    def _signed(self, now: float, signed_at: float | None) -> float:
        """When a claim heard at `now` was made: its signed time, at most `max_skew_s` in
        our future (a relay may delay a claim, never make it younger)."""
        return now if signed_at is None else min(float(signed_at), now + self.max_skew_s)

    def _back_is_free(self, producer: bytes, version: int, at: float) -> bool:
        """Whether a claim going back to `version`, made at `at` (its signed time), is free
        (module docstring): a window of the same version within `back_window_s` of it, or
        none of another version (then it opens one). In whatever order claims arrive."""
        windows = self._free_back.pop(producer, [])
        self._free_back[producer] = windows
        while len(self._free_back) > self.max_producers:
            self._free_back.popitem(last=False)
        near = [v for v, t in windows if abs(at - t) < self.back_window_s]
        if version in near:
            return True
        if near:
            return False
        windows.append((version, at))
        del windows[:-_BACK_WINDOWS]
        return True

    def _take_charge(self) -> OutOfOrder | None:
        charge, self._charge = self._charge, None
        return charge

    def on_published(self, version: int, now: float) -> None:
        """We published `version` at `now` (a version heard again keeps its first time)."""
        self._published.setdefault(version, now)
        while len(self._published) > self.max_versions:
            del self._published[min(self._published)]

    def _stale(self, version: int, now: float) -> bool:
        """Whether a claim of `version` first heard at `now` comes `stale_after_s` or more
        after a newer version was published."""
        newer = [t for v, t in self._published.items() if v > version]
        return bool(newer) and now - min(newer) >= self.stale_after_s

    def out_of_order(self, producer: bytes, counter: int) -> bool:
        """Whether the (producer, counter) claim was refused as out of order."""
        return self._settled.get((producer, counter)) == "out_of_order"

    def not_trained(self, producer: bytes, counter: int) -> bool:
        """Whether the (producer, counter) claim was settled without being trained on."""
        return bool(self._settled.get((producer, counter)))

    def _evict(self) -> None:
        if self._held:  # held and never judged: settled at the re-score it was credited
            key, _ = self._held.popitem(last=False)
            self._settled[key] = ""
            while len(self._settled) > self.max_open:
                self._settled.popitem(last=False)
        else:
            key, _ = self._open.popitem(last=False)
            self._settle(*key, None, skipped=True)

    def on_header(
        self,
        producer: bytes,
        counter: int,
        version: int,
        claimed: float,
        now: float,
        signed_at: float | None = None,
    ) -> OutOfOrder | None:
        """A header (or a record's header) heard at `now`, signed by its producer at
        `signed_at`; the `OutOfOrder` to charge if it goes back to a version that is not
        its free one."""
        self._claim(producer, counter, version, claimed, now, signed_at)
        return self._take_charge()

    def on_body(
        self,
        producer: bytes,
        counter: int,
        version: int,
        claimed: float,
        rescored: float,
        now: float,
        signed_at: float | None = None,
    ) -> FalseClaim | OutOfOrder | None:
        """We hold the body of (producer, counter) and re-scored it at `rescored`; the
        `FalseClaim` to charge if its claim differs (once per counter), or the
        `OutOfOrder` if the claim, heard first here, goes back (`on_header`)."""
        key = (producer, counter)
        c = self._claim(producer, counter, version, claimed, now, signed_at)
        if c is None or c.rescored is not None:
            return self._take_charge()
        c.rescored = float(rescored)
        del self._open[key]
        s = self._standing(producer)
        s.held += 1
        self._changes += 1
        if c.passed is None:  # credited now; a failed judgement takes it back
            self._held[key] = c
            s.reward_sum += c.rescored
        else:
            self._settle(producer, counter, c.rescored if c.passed else 0.0, judged=True)
        if c.claimed is not None and abs(c.claimed - c.rescored) > self.tolerance:
            self._standing(producer).false_claims += 1
            return FalseClaim(producer, counter, c.claimed, c.rescored)
        return None

    def on_judged(
        self, producer: bytes, counter: int, version: int, passed: bool, rescored: float, now: float
    ) -> None:
        """A judgement of (producer, counter) at `version`: passed or not, and the judge's
        re-score. Settles the counter if we hold its body (a failure takes back the re-score
        it was credited); otherwise the judge's re-score is credited when the pull window
        closes without the body."""
        key = (producer, counter)
        c = self._claim(producer, counter, version, None, now)
        self._charge = None  # a judgement is not the producer's claim: nothing to charge
        if c is None or c.passed is not None:
            return
        c.passed, c.judge_score = bool(passed), float(rescored)
        if c.rescored is not None:
            del self._held[key]
            self._settle(producer, counter, 0.0 if passed else -c.rescored, judged=True)

    def on_time(self, now: float) -> None:
        """Close the pull windows that ended by `now`: a header with no body held is
        settled at its judge's re-score if judged (and passed), else skipped (reward 0)."""
        while self._open:
            key, c = next(iter(self._open.items()))
            if now - c.heard_at < self.pull_window_s:
                break
            del self._open[key]
            if c.passed is None:
                self._settle(*key, None, skipped=True)
            else:  # the judge held the body
                self._standing(key[0]).held += 1
                self._settle(*key, c.judge_score if c.passed else 0.0, judged=True)

    def _standing(self, producer: bytes) -> CreditStanding:
        s = self._producers.get(producer)
        if s is None:
            s = self._producers[producer] = CreditStanding()
            if len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(producer)
        return s

    def _settle(
        self,
        producer: bytes,
        counter: int,
        reward: float | None,
        *,
        skipped: bool = False,
        refused: str = "",
        judged: bool = False,
    ) -> None:
        """Settle a counter: `reward` added to what it was credited, skipped, or `refused`
        (out of order, stale: never trained on; `reward` None)."""
        s = self._standing(producer)
        self._changes += 1
        if reward is not None:
            s.reward_sum += reward
        s.judged += judged
        s.skipped += skipped
        self._settled[(producer, counter)] = refused
        while len(self._settled) > self.max_open:
            self._settled.popitem(last=False)

    def standing(self, producer: bytes) -> CreditStanding | None:
        """`producer`'s credit record (None if never seen)."""
        return self._producers.get(producer)

    def credited_reward(self, producer: bytes, withheld: int = 0) -> float | None:
        """The credited mean reward (module docstring), at most the swarm's mean while the
        key is young; None while nothing of the producer is settled or held."""
        s = self._producers.get(producer) or CreditStanding()
        total = _accounted(s) + max(0, withheld)
        if total == 0:
            return None
        mean = s.reward_sum / total
        if total < self.young_counters:
            swarm = self.swarm_mean()
            if swarm is not None:
                mean = min(mean, swarm)
        return mean

    def swarm_mean(self) -> float | None:
        """The mean reward per accounted counter of the keys that are not young (of every
        key while none is old); None before anything is accounted."""
        if self._swarm[0] == self._changes:
            return self._swarm[1]
        old = [s for s in self._producers.values() if _accounted(s) >= self.young_counters]
        pool = old or list(self._producers.values())
        total = sum(_accounted(s) for s in pool)
        mean = sum(s.reward_sum for s in pool) / total if total else None
        self._swarm = (self._changes, mean)
        return mean


def _accounted(s: CreditStanding) -> int:
    """The counters a producer's credit is divided over (withheld ones aside)."""
    return s.held + s.skipped + s.out_of_order + s.stale
