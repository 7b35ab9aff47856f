"""Which shard to request from which peer, and when to give up on one: a sans-IO scheduler.

The swarm exchange of weight shards (BitTorrent's idea, every holder serves onward) as a
pure state machine in the h11 manner: the caller feeds events with the time passed in and
carries out the returned requests; no sockets, clocks, threads or randomness here, so the
node and the simulator drive the same rules.

What it owns
------------
- What we want: shards (manifest id, index, size) of the manifests in our plan.
- Have-maps: per peer and manifest, the shard indices it announced (`on_have`); a peer
  announces per version/manifest, and a later announcement replaces the earlier one.
- Request order: **rarest first** (fewest live holders), ties broken by a fixed hash of
  (salt, manifest, index) so peers that share a view still spread over different shards.
- Source choice: among holders with a free slot, the one with the best throughput
  estimate (EWMA of bytes/s of its completed shards; an unmeasured peer is assumed
  `optimistic_bytes_s` so new peers get tried), then the fewest requests in flight.
  Different shards come from different peers at once (multi-source).
- Bounds: at most `per_peer` requests in flight to one peer and `total` overall.
- **Endgame**: once every missing shard is in flight, idle slots request in-flight shards
  again from other holders (at most `endgame_copies` copies of a shard); the first copy
  that completes wins and the others are cancelled (`Cancel`). A shard whose holders are
  all busy or dropped is missing and not in flight: no endgame yet (duplicating the
  shards in flight meanwhile would only load the uplinks the waiting shard needs).
- **Busy**: a peer that answers "busy" (its uplink is full, `upload_busy`; `on_busy`) is
  not asked for anything for `HAVE_KEEPALIVE_S` (asking it for its next shard at once
  would only draw the next refusal). "Not held" (a stale have-map, or first copies first)
  is not busy: that peer is asked for other shards at once, so receivers are not kept off
  the trainer's uplink by its first-copies answer.
- Stalls: a request not done by its deadline (`stall_s` plus the time its size needs at
  `min_rate_bytes_s`) is cancelled, its peer dropped for `drop_s` (`DropPeer`) and the
  shard becomes requestable elsewhere. The node also puts a deadline on every read and
  write; a transfer error it sees comes in as `on_failed`: the peer is not asked for
  `fail_backoff_s` (a reset is no evidence of bad faith: a busy honest peer, a lost
  connection), and an error of a request no longer in flight (cancelled by us) costs
  nothing. A peer that leaves (`on_peer_gone`) gets its requests cancelled.
- Bad data: a shard whose digest did not match (`on_bad`) is re-requested from another
  peer; the sender is dropped for `bad_drop_s` (the node also scores it down through
  admission's `Misbehaved`).

Who is blamed: only the peer that sent the bytes or failed the request; a shard that is
merely rare costs nobody anything.

Public API
----------
`ScheduleConfig(...)`; `ShardScheduler(config, salt=b"")`
    `.want(manifest_id, sizes, have=())`  add a manifest's shards (`have`: already verified)
    `.forget(manifest_id)`                 stop wanting it (cancels its requests)
    `.on_have(peer, manifest_id, indices, now)`, `.on_peer_gone(peer, now) -> list[Cancel]`
    `.next_requests(now) -> list[Request]` what to request now (marks them in flight)
    `.on_done(peer, manifest_id, index, now) -> list[Cancel]`  verified and stored
    `.on_bad(peer, manifest_id, index, now) -> list[Action]`   failed its digest
    `.on_failed(peer, manifest_id, index, now) -> list[Action]` transfer error/timeout
    `.on_missing(peer, manifest_id, index, now)` it does not hold it / sends others first (no blame)
    `.on_busy(peer, manifest_id, index, now)`     its uplink is full (no blame)
    `.tick(now) -> list[Action]`           stalled requests
    `.missing(manifest_id)`, `.complete(manifest_id)`, `.progress()`, `.rate(peer)`
Actions (frozen dataclasses): `Request(peer, manifest_id, index, size)`,
`Cancel(peer, manifest_id, index, reason)`, `DropPeer(peer, until, reason)`.

The serving side has three rules. `next_upload(waiting, now)`: a capped uplink is one queue
of chunks, and the chunk whose shard has the fewest bytes left goes next (shortest
remaining first), except that a chunk that has waited `UPLOAD_MAX_WAIT_S` goes before
any other (oldest first), so no transfer waits past the readers' deadlines. Sharing the
uplink chunk by chunk in turn would make every shard in flight finish late together, with
nothing relayable meanwhile; shortest-first completes shards one after the other, each
relayable at once (the mean completion time is the least any order gives).
`upload_busy(queued_bytes, rate)`: a server declines a new request ("busy" on the wire,
no blame; BitTorrent's choke) while what its uplink already has to send takes longer
than `UPLOAD_MAX_WAIT_S` at its upload rate; an idle server takes any request. A queue
that takes everything would let a slow uplink collect requests it serves minutes later
while faster holders idle. Declined, the asker takes the shard from a holder that has
room (see **Busy**).
And `first_copies_first(served, shards, index)`: the publisher of a manifest (the trainer,
whose copies are the only ones) sends a shard a second time only once every shard of it
has gone out at least once; until then it answers "not held" (no blame: the asker takes it
from whoever got the first copy, or asks for another shard), so the origin's uplink does
not carry the same rare shards to several receivers at once (BitTorrent's reason for
super-seeding). Only the publisher applies it: a receiver that finished got every shard
from another holder, and applying it there can deadlock (finished neighbours that each
sent one shard once would decline it to the last receivers for ever).

Have-maps are pushed over one watch per pair of peers (the node's `shard_exchange`): at
most every `HAVE_DEBOUNCE_S`, again after `HAVE_KEEPALIVE_S` without a change, for at most
`WATCH_MAX_S` per watch and `MAX_WATCHES_PER_PEER` watches served to one peer at once;
`pushes_too_fast(frames, elapsed_s)` tells a client when a server pushes faster than that
(it is cut off). The simulator uses the same keepalive.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError

__all__ = [
    "Cancel",
    "DropPeer",
    "Request",
    "ScheduleConfig",
    "ShardScheduler",
    "first_copies_first",
    "next_upload",
    "pushes_too_fast",
    "upload_busy",
]

HAVE_DEBOUNCE_S = 0.1  # at most this often a have-map per watcher
HAVE_KEEPALIVE_S = 3.0  # an unchanged have-map is pushed again after this
WATCH_MAX_S = 300.0  # a server ends a watch after this long; the client opens a new one
MAX_WATCHES_PER_PEER = 2  # watches served to one peer at once (one, and one reconnecting)
UPLOAD_MAX_WAIT_S = 4.0  # a chunk waiting this long for the uplink goes first (< io deadlines)

Key = tuple[bytes, int]


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    """Concurrency, deadlines and penalties of shard requests."""

    per_peer: int = 2  # requests in flight to one peer
    total: int = 8  # requests in flight overall
    endgame_copies: int = 2  # copies of one shard in flight during the endgame
    stall_s: float = 10.0  # base deadline of a request
    min_rate_bytes_s: float = 256 * 1024.0  # slowest acceptable transfer rate
    drop_s: float = 30.0  # a stalled peer is not asked again for this long
    fail_backoff_s: float = 2.0  # ... a peer whose transfer broke off
    bad_drop_s: float = 600.0  # ... a peer that sent a shard failing its digest
    ewma: float = 0.4  # weight of the newest throughput sample
    optimistic_bytes_s: float = 64 * 1024 * 1024.0  # assumed rate of an unmeasured peer

    def __post_init__(self) -> None:
        if self.per_peer < 1 or self.total < 1 or self.endgame_copies < 1:
            raise LocalProtocolError("ScheduleConfig: per_peer, total, endgame_copies must be >= 1")
        for name in (
            "stall_s",
            "min_rate_bytes_s",
            "drop_s",
            "fail_backoff_s",
            "bad_drop_s",
            "optimistic_bytes_s",
        ):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise LocalProtocolError(f"ScheduleConfig.{name} must be a positive number")
        if not 0 < self.ewma <= 1:
            raise LocalProtocolError("ScheduleConfig.ewma must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Request:
    """Request shard `index` of `manifest_id` (`size` bytes) from `peer` (action)."""

    peer: str
    manifest_id: bytes
    index: int
    size: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the request of shard `index` of `manifest_id` at `peer` (action)."""

    peer: str
    manifest_id: bytes
    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class DropPeer:
    """Ask `peer` for nothing until `until` (action)."""

    peer: str
    until: float
    reason: str


Action = Request | Cancel | DropPeer


@dataclass(slots=True)
class _Flight:
    peer: str
    started: float
    deadline: float


@dataclass(slots=True)
class _Peer:
    have: dict[bytes, frozenset[int]] = field(default_factory=dict)
    in_flight: int = 0
    rate: float | None = None  # bytes/s EWMA
    dropped_until: float = -math.inf
    busy_until: float = -math.inf  # it declined a shard its have-map offered


class ShardScheduler:
    """See the module docstring."""

    def __init__(self, config: ScheduleConfig | None = None, salt: bytes = b"") -> None:
        self.config = config or ScheduleConfig()
        self._salt = salt
        self._sizes: dict[bytes, tuple[int, ...]] = {}
        self._missing: dict[bytes, set[int]] = {}
        self._flights: dict[Key, list[_Flight]] = {}
        self._peers: dict[str, _Peer] = {}
        self._order: dict[Key, bytes] = {}
        self._done_bytes = 0

    # -- what we want -----------------------------------------------------------------

    def want(self, manifest_id: bytes, sizes: Sequence[int], have: Iterable[int] = ()) -> None:
        """Fetch the shards of `manifest_id` (sizes in index order), except those in `have`."""
        if manifest_id in self._sizes:
            return
        self._sizes[manifest_id] = tuple(sizes)
        got = set(have)
        self._missing[manifest_id] = {i for i in range(len(sizes)) if i not in got}
        self._done_bytes += sum(sizes[i] for i in got if 0 <= i < len(sizes))

    def forget(self, manifest_id: bytes) -> list[Cancel]:
        """Stop fetching `manifest_id`; returns the cancels of its requests in flight."""
        out = []
        for key in [k for k in self._flights if k[0] == manifest_id]:
            for f in self._flights.pop(key):
                self._peer(f.peer).in_flight -= 1
                out.append(Cancel(f.peer, key[0], key[1], "not wanted"))
        self._sizes.pop(manifest_id, None)
        self._missing.pop(manifest_id, None)
        return out

    def missing(self, manifest_id: bytes) -> frozenset[int]:
        """Indices of `manifest_id`'s shards not yet held."""
        return frozenset(self._missing.get(manifest_id, ()))

    def complete(self, manifest_id: bytes) -> bool:
        """Whether every shard of `manifest_id` is held."""
        return manifest_id in self._sizes and not self._missing[manifest_id]

    def progress(self) -> dict[str, int]:
        """Bytes wanted and done, shards missing and requests in flight."""
        total = sum(sum(s) for s in self._sizes.values())
        return {
            "bytes_total": total,
            "bytes_done": self._done_bytes,
            "shards_missing": sum(len(m) for m in self._missing.values()),
            "in_flight": sum(len(f) for f in self._flights.values()),
        }

    def rate(self, peer: str) -> float | None:
        """`peer`'s throughput estimate in bytes/s (None if unknown)."""
        p = self._peers.get(peer)
        return None if p is None else p.rate

    # -- peers ----------------------------------------------------------------------------

    def _peer(self, peer: str) -> _Peer:
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer()
        return p

    def on_have(self, peer: str, manifest_id: bytes, indices: Iterable[int], now: float) -> None:
        """`peer` holds these shards of `manifest_id` (replaces its earlier announcement)."""
        self._peer(peer).have[manifest_id] = frozenset(indices)

    def on_peer_gone(self, peer: str, now: float) -> list[Cancel]:
        """`peer` disconnected: forget its have-maps, cancel its requests (no blame)."""
        out = []
        for key in list(self._flights):
            if self._drop_flight(key, peer) is not None:
                out.append(Cancel(peer, key[0], key[1], "peer gone"))
        self._peers.pop(peer, None)
        return out

    def _live(self, peer: str, p: _Peer, now: float) -> bool:
        return p.dropped_until <= now and p.busy_until <= now

    # -- choosing ---------------------------------------------------------------------------

    def _tiebreak(self, key: Key) -> bytes:
        t = self._order.get(key)
        if t is None:
            t = self._order[key] = hashlib.sha256(
                self._salt + key[0] + key[1].to_bytes(4, "big")
            ).digest()[:8]
        return t

    def _holders(self, key: Key, now: float) -> list[str]:
        mid, idx = key
        return [
            name
            for name, p in self._peers.items()
            if self._live(name, p, now) and idx in p.have.get(mid, ())
        ]

    def _pick(self, holders: list[str], exclude: set[str]) -> str | None:
        c = self.config
        best: tuple[float, int, str] | None = None
        for name in holders:
            p = self._peers[name]
            if name in exclude or p.in_flight >= c.per_peer:
                continue
            rate = c.optimistic_bytes_s if p.rate is None else p.rate
            cand = (-rate, p.in_flight, name)
            if best is None or cand < best:
                best = cand
        return None if best is None else best[2]

    def next_requests(self, now: float) -> list[Request]:
        """The requests to send now (rarest first, best source first, endgame copies)."""
        c = self.config
        out: list[Request] = []
        in_flight = sum(len(f) for f in self._flights.values())
        if in_flight >= c.total:
            return out
        pending = [
            (mid, idx)
            for mid, miss in self._missing.items()
            for idx in miss
            if (mid, idx) not in self._flights
        ]
        ranked = []
        for key in pending:
            holders = self._holders(key, now)
            if holders:
                ranked.append((len(holders), self._tiebreak(key), key, holders))
        ranked.sort(key=lambda r: (r[0], r[1]))
        for _, _, key, holders in ranked:
            if in_flight >= c.total:
                return out
            peer = self._pick(holders, set())
            if peer is not None:
                out.append(self._start(key, peer, now))
                in_flight += 1
        if len(pending) > len(out):
            return out  # shards still wait for a free holder: not the endgame yet
        # Endgame: every missing shard is in flight; duplicate onto idle holders.
        for key in sorted(self._flights, key=lambda k: self._tiebreak(k)):
            if in_flight >= c.total:
                break
            flights = self._flights[key]
            if len(flights) >= c.endgame_copies:
                continue
            peer = self._pick(self._holders(key, now), {f.peer for f in flights})
            if peer is not None:
                out.append(self._start(key, peer, now))
                in_flight += 1
        return out

    def _start(self, key: Key, peer: str, now: float) -> Request:
        size = self._sizes[key[0]][key[1]]
        deadline = now + self.config.stall_s + size / self.config.min_rate_bytes_s
        self._flights.setdefault(key, []).append(_Flight(peer, now, deadline))
        self._peers[peer].in_flight += 1
        return Request(peer, key[0], key[1], size)

    # -- outcomes ---------------------------------------------------------------------------

    def _drop_flight(self, key: Key, peer: str) -> _Flight | None:
        flights = self._flights.get(key, [])
        for f in flights:
            if f.peer == peer:
                flights.remove(f)
                p = self._peers.get(peer)
                if p is not None:
                    p.in_flight -= 1
                if not flights:
                    del self._flights[key]
                return f
        return None

    def on_done(self, peer: str, manifest_id: bytes, index: int, now: float) -> list[Cancel]:
        """The shard arrived from `peer` and passed its digest (and is stored)."""
        key = (manifest_id, index)
        f = self._drop_flight(key, peer)
        if f is not None and manifest_id in self._sizes:
            elapsed = max(now - f.started, 1e-6)
            sample = self._sizes[manifest_id][index] / elapsed
            p = self._peer(peer)
            a = self.config.ewma
            p.rate = sample if p.rate is None else a * sample + (1 - a) * p.rate
        out = []
        for other in list(self._flights.get(key, [])):
            self._drop_flight(key, other.peer)
            out.append(Cancel(other.peer, manifest_id, index, "endgame: a copy arrived"))
        miss = self._missing.get(manifest_id)
        if miss is not None and index in miss:
            miss.discard(index)
            self._done_bytes += self._sizes[manifest_id][index]
        return out

    def _drop_peer(self, peer: str, now: float, reason: str, for_s: float) -> list[Action]:
        p = self._peer(peer)
        p.dropped_until = max(p.dropped_until, now + for_s)
        out: list[Action] = [DropPeer(peer, p.dropped_until, reason)]
        for key in list(self._flights):
            if self._drop_flight(key, peer) is not None:
                out.append(Cancel(peer, key[0], key[1], reason))
        return out

    def on_bad(self, peer: str, manifest_id: bytes, index: int, now: float) -> list[Action]:
        """The shard from `peer` failed its digest (or was truncated): drop the peer."""
        self._drop_flight((manifest_id, index), peer)
        return self._drop_peer(peer, now, "bad shard", self.config.bad_drop_s)

    def on_missing(self, peer: str, manifest_id: bytes, index: int, now: float) -> None:
        """`peer` answered that it does not hold the shard (its have-map was stale) or
        will not send this one now (first copies first): ask it for others."""
        self._drop_flight((manifest_id, index), peer)
        p = self._peers.get(peer)
        if p is not None and manifest_id in p.have:
            p.have[manifest_id] = p.have[manifest_id] - {index}

    def on_busy(self, peer: str, manifest_id: bytes, index: int, now: float) -> None:
        """`peer` declined because its uplink is full (`upload_busy`): no blame, it still
        holds the shard; see the module docstring (**Busy**)."""
        self._drop_flight((manifest_id, index), peer)
        p = self._peer(peer)
        p.busy_until = max(p.busy_until, now + HAVE_KEEPALIVE_S)

    def on_failed(self, peer: str, manifest_id: bytes, index: int, now: float) -> list[Action]:
        """The transfer failed (timeout, reset): try elsewhere, and this peer again after
        `fail_backoff_s`. A request we no longer had in flight (cancelled) blames nobody."""
        if self._drop_flight((manifest_id, index), peer) is None:
            return []
        return self._drop_peer(peer, now, "transfer failed", self.config.fail_backoff_s)

    def tick(self, now: float) -> list[Action]:
        """Drop the peers whose requests passed their deadline (cancels and drops)."""
        out: list[Action] = []
        stalled = {
            f.peer for flights in self._flights.values() for f in flights if f.deadline <= now
        }
        for peer in sorted(stalled):
            out.extend(self._drop_peer(peer, now, "stalled", self.config.drop_s))
        return out


def first_copies_first(served: Mapping[int, int], shards: int, index: int) -> bool:
    """Whether a peer holding all `shards` of a manifest sends shard `index` now, given
    how often it sent each (`served`); see the module docstring."""
    if served.get(index, 0) == 0:
        return True
    return all(served.get(i, 0) > 0 for i in range(shards))


def next_upload(
    waiting: Sequence[tuple[float, int]], now: float, max_wait_s: float = UPLOAD_MAX_WAIT_S
) -> int:
    """Which of the chunks waiting for a capped uplink goes next (its position in
    `waiting`, a non-empty list of (waiting since, bytes its shard has left to send) in
    arrival order); see the module docstring."""
    if not waiting:
        raise LocalProtocolError("next_upload: nothing is waiting")
    oldest = min(range(len(waiting)), key=lambda i: (waiting[i][0], i))
    if now - waiting[oldest][0] >= max_wait_s:
        return oldest
    return min(range(len(waiting)), key=lambda i: (waiting[i][1], waiting[i][0], i))


def upload_busy(
    queued_bytes: float, rate_bytes_s: float, max_wait_s: float = UPLOAD_MAX_WAIT_S
) -> bool:
    """Whether a server declines a new request ("busy", answered as "not held"): what its
    uplink already has to send takes longer than `max_wait_s` at `rate_bytes_s`."""
    return queued_bytes > max_wait_s * rate_bytes_s


def pushes_too_fast(frames: int, elapsed_s: float) -> bool:
    """Whether `frames` have-maps in `elapsed_s` is more than a server may push (with a
    little slack for a burst)."""
    return frames > 10 + elapsed_s / HAVE_DEBOUNCE_S
