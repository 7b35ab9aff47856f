"""Memory of seen work: what was admitted (DEDUP), which (signer, kind, seq) were used
(REPLAY), which rollout holds each unit of work (UNIQUE), and what each sender handed us.

Pure, bounded, time passed in. `DedupCache` and `WorkIndex` are the stores; `SeenWork` the
three stages and their state.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from protocol.admission.config import AdmissionConfig
from protocol.admission.inflight import InFlight, Refused, work_key
from protocol.admission.messages import Admitted
from protocol.admission.vocabulary import Kind, Reason, Stage
from protocol.envelope import ReplayGuard
from protocol.errors import ReplayError
from protocol.peer_score import PeerId

__all__ = ["MAX_RETRIES", "DedupCache", "SeenWork", "WorkIndex"]

MAX_RETRIES = 4096  # items whose store failed that a later copy may replace


class DedupCache:
    """Ids seen within the last `ttl_s` seconds, at most `max_entries` of them."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._seen: OrderedDict[Any, float] = OrderedDict()  # id -> time added, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: Any) -> bool:
        return key in self._seen

    def seen(self, key: Any, now: float) -> bool:
        """Whether `key` was added at most `ttl_s` before `now`."""
        t = self._seen.get(key)
        return t is not None and now - t <= self.ttl_s

    def add(self, key: Any, now: float) -> None:
        """Remember `key` as seen at `now` (the oldest and expired go)."""
        self._seen.pop(key, None)
        self._seen[key] = now
        self.expire(now)

    def forget(self, key: Any) -> None:
        """Forget `key`."""
        self._seen.pop(key, None)

    def expire(self, now: float) -> None:
        """Drop entries older than `ttl_s`, and the oldest past `max_entries`."""
        seen, limit, ttl = self._seen, self.max_entries, self.ttl_s
        while seen:
            key = next(iter(seen))
            if len(seen) > limit or now - seen[key] > ttl:
                del seen[key]
            else:
                break


class WorkIndex:
    """Which rollout holds each unit of work: (signer, counter), each signer's body digests,
    and the bodies held.

    Across signers only bodies count: a header names a body digest but proves nothing of
    who made the body (anyone can sign a header naming a digest it saw), so the first
    *record* whose body is bound to its signer (admission's CONTEXT checks the binding)
    holds the body, never the first header. Within one signer a digest named twice is
    double work, header or record. Bounded: at most `max_entries` of each, oldest
    forgotten first.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._units: OrderedDict[tuple[bytes, int], bytes] = OrderedDict()
        self._own: OrderedDict[tuple[bytes, bytes], bytes] = OrderedDict()  # signer, digest
        self._bodies: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()  # -> signer, id

    def __len__(self) -> int:
        return len(self._units)

    def clash(
        self, signer: bytes, key: tuple[int, bytes], rid: bytes, body: bool = False
    ) -> str | None:
        """None if `rid` (a record when `body`, else a header) may hold this work; else
        what it clashes on ("counter", "body", or "other_signer" when another signer's
        record already holds the body)."""
        counter, digest = key
        held = self._units.get((signer, counter))
        if held is not None and held != rid:
            return "counter"
        own = self._own.get((signer, digest))
        if own is not None and own != rid:
            return "body"
        other = self._bodies.get(digest) if body else None
        if other is not None and other[0] != signer:
            return "other_signer"
        return None

    def add(self, signer: bytes, key: tuple[int, bytes], rid: bytes, body: bool = False) -> None:
        """Record that rollout `rid` of `signer` holds this unit of work (and, when `body`,
        that its record's body is here)."""
        counter, digest = key
        _put(self._units, (signer, counter), rid, self.max_entries)
        _put(self._own, (signer, digest), rid, self.max_entries)
        if body and digest not in self._bodies:  # the first body held keeps it
            _put(self._bodies, digest, (signer, rid), self.max_entries)


def _put(index: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Set `key` as the newest entry of `index`, the oldest past `limit` forgotten."""
    index[key] = value
    index.move_to_end(key)
    while len(index) > limit:
        index.popitem(last=False)


class SeenWork:
    """The DEDUP, REPLAY and UNIQUE stages and what they remember.

    A message is recorded only once it is admitted, or refused for a fault of its signer
    that its content proves (`remember`); a refusal that does not judge the content records
    nothing, so the producer's own copy arriving later by another path is admitted.
    """

    def __init__(self, run_id: str, cfg: AdmissionConfig) -> None:
        # (sender, id or body digest) of what each sender handed us: an honest relay hands
        # over each message (and each body) once, so only a repeat draws on its allowance.
        self.handed = DedupCache(2 * cfg.dedup_entries, cfg.dedup_ttl_s)
        self.dedup = DedupCache(cfg.dedup_entries, cfg.dedup_ttl_s)
        self.work = WorkIndex(cfg.work_entries)
        self._replay = ReplayGuard(
            run_id,
            max_skew_ms=int(cfg.max_skew_s * 1000),
            window=cfg.replay_window,
            max_signers=cfg.max_signers,
        )
        # (signer, kind, seq) -> content id of items whose store failed (`store_failed`)
        self._retry: OrderedDict[tuple[bytes, str, int], bytes] = OrderedDict()

    def check_dedup(self, m: InFlight) -> None:
        """DEDUP: refuse a content id admitted before (as this kind or a `dedup_with` one)."""
        assert m.opened is not None
        cid = m.opened.content_id
        for k in (m.kind, *m.rule.dedup_with):
            if self.dedup.seen((k, cid), m.now):
                raise Refused(Stage.DEDUP, Reason.DUPLICATE, f"already admitted as {k}")

    def check_replay(self, m: InFlight) -> None:
        """REPLAY: refuse a (signer, kind, seq) used before, unless it is a copy of an item
        whose store failed."""
        assert m.opened is not None
        env = m.opened.envelope
        if self._retry.get((env.signer, env.kind, env.seq)) == m.opened.content_id:
            return  # a copy of an item we failed to store
        try:
            # Only checked here: remembered once admitted (`remember`).
            self._replay.check(env, int(m.now * 1000), remember=False)
        except ReplayError as exc:
            raise Refused(Stage.REPLAY, Reason.REPLAY, str(exc), signer=env.signer) from None

    def check_unique(self, m: InFlight) -> None:
        """UNIQUE: one rollout per (producer, counter) and per body digest of a producer;
        across producers, one record per body held (`WorkIndex`)."""
        assert m.opened is not None
        op = m.opened
        signer = op.envelope.signer
        clash = self.work.clash(signer, work_key(op), op.content_id, body=op.body is not None)
        if clash is None:
            return
        if clash == "other_signer":
            # Another signer's record holds this body (a run without bound seeds cannot
            # tell who made it): not provably this signer's fault.
            raise Refused(Stage.UNIQUE, Reason.DUPLICATE, "body already admitted", 0.0)
        raise Refused(
            Stage.UNIQUE,
            Reason.DOUBLE_WORK,
            f"{clash} already used by another rollout",
            signer=signer,
            blame_signer=True,
        )

    def remember(self, m: InFlight) -> None:
        """Record the message's (signer, kind, seq) in the replay guard."""
        if m.opened is None:
            return
        env = m.opened.envelope
        self._retry.pop((env.signer, env.kind, env.seq), None)
        self._replay.remember(env)

    def handed_before(self, peer: PeerId, m: InFlight, now: float) -> bool:
        """Whether `peer` handed us this message (or its body) before; remembers it."""
        assert m.opened is not None
        handed = self.handed
        key = (peer, m.opened.content_id)
        before = handed.seen(key, now)
        if m.rule.work:
            body = (peer, work_key(m.opened)[1])
            before = before or handed.seen(body, now)
            handed.add(key, now)
            handed.add(body, now)
        else:
            handed.add(key, now)
        return before

    def store_failed(self, item: Admitted) -> None:
        """Forget an item the node could not store, so a copy of it can be admitted."""
        self.dedup.forget((item.kind, item.content_id))
        # The replay guard already holds (signer, kind, seq); let a copy of these very bytes
        # through once more (bounded memory, oldest forgotten first).
        env = item.envelope
        self._retry[(env.signer, env.kind, env.seq)] = item.content_id
        while len(self._retry) > MAX_RETRIES:
            self._retry.popitem(last=False)

    def known(self, kind: Kind, ids: tuple[bytes, ...], now: float) -> None:
        """Items already stored: their copies are duplicates."""
        for cid in ids:
            self.dedup.add((kind, bytes(cid)), now)
