"""Stand-in messages: real envelopes and real admission, without real signatures.

What lives here: the virtual peers' ids (real 38-byte Ed25519 peer ids derived from the
seed, so `protocol.admission` can tell a sender from a signer), and `MessageBook`, which
builds one real `protocol.wire.Envelope` per simulated message and hands
`protocol.admission.Admission` an opener for it (the `rules=` hook admission documents
for the simulator). On the wire a message is an 8-byte token; its simulated size is
carried by the network model. The opener looks the token up and returns the `Opened`
the real opener would, or raises the error the real one would for a forged message, so
every other stage of admission (context, rate, dedup, replay, scoring) is the real code.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.admission import KIND_RULES, Kind, KindRule, Opened
from protocol.errors import DecodeError, SignatureError
from protocol.identity import peer_id_from_public_key
from protocol.wire import Envelope

__all__ = ["MessageBook", "SimMessage", "peer_ids"]


def peer_ids(n: int, seed: int) -> list[bytes]:
    """`n` distinct, reproducible libp2p peer ids (the keys behind them are never used)."""
    return [
        peer_id_from_public_key(hashlib.sha256(f"swarm-sim:{seed}:peer:{i}".encode()).digest())
        for i in range(n)
    ]


@dataclass(slots=True, eq=False)
class SimMessage:
    """One simulated message and what the simulator measures about it."""

    mid: int
    kind: Kind
    origin: int  # the signer's peer index
    t0: float  # virtual time it was signed
    size: int  # bytes on the wire (header, or record for a pull)
    token: bytes  # what travels in MessageReceived.data
    body_size: int = 0  # rollout bodies: bytes a pull moves
    version: int = 0  # policy version it is tagged with (weights: the version announced)
    valid: bool = True  # False: a forgery, its opener raises SignatureError
    got: bytearray | None = None  # receivers that admitted it (index -> 1)
    eta: dict[int, float] | None = None  # receiver -> arrival of its earliest copy
    closed: bool = False
    counter: int = -1  # rollouts: the assignment counter (the unit of work)
    # The gossip message's publisher (its `from`, signed with the publisher's libp2p key):
    # the signer for a message it published itself, the replayer for a replay; -1: none.
    publisher: int = -1


@dataclass(frozen=True, slots=True)
class _StandIn:
    """What admission reads of a decoded stand-in: a rollout's unit of work (`counter`,
    `body_digest`), a weight announcement's `version`."""

    version: int
    counter: int
    body_digest: bytes


class MessageBook:
    """Builds messages and opens their tokens for admission."""

    def __init__(self, run_id: str, ids: list[bytes]) -> None:
        self.run_id, self.ids = run_id, ids
        self._opened: dict[bytes, Opened] = {}
        self._forged: set[bytes] = set()
        self.next_mid = 0

    def rules(self) -> Mapping[Kind, KindRule]:
        """`KIND_RULES` with this book's opener in place of decode-and-verify."""
        return {k: dataclasses.replace(r, opener=self.open) for k, r in KIND_RULES.items()}

    def make(
        self,
        kind: Kind,
        origin: int,
        seq: int,
        now: float,
        size: int,
        version: int = 0,
        *,
        body_size: int = 0,
        valid: bool = True,
        n_peers: int = 0,
        body_digest: bytes | None = None,
        counter: int | None = None,
    ) -> SimMessage:
        """A new message signed by `origin` at `now`. `body_digest` (default: the content
        id) and `counter` (default: the sequence number) name its unit of work, so a
        duplicate of earlier work can be made."""
        mid = self.next_mid
        self.next_mid += 1
        token = mid.to_bytes(8, "big")
        env = Envelope(
            kind=str(kind),
            signer=self.ids[origin],
            run_id=self.run_id,
            policy_version=version,
            seq=seq,
            timestamp_ms=int(now * 1000),
            payload=token,
            signature=bytes(64),
        )
        cid = hashlib.sha256(token).digest()
        if valid:
            digest = cid if body_digest is None else body_digest
            obj = _StandIn(version, seq if counter is None else counter, digest)
            self._opened[token] = Opened(env, obj, cid, header=token)
        else:
            self._forged.add(token)
        return SimMessage(
            mid,
            kind,
            origin,
            now,
            size,
            token,
            body_size,
            version,
            valid,
            bytearray(n_peers),
            {},
            counter=seq if counter is None else counter,
            publisher=origin,
        )

    def open(self, data: bytes) -> Opened:
        """Open a token as admission's opener does: the stand-in, or the error of a forgery."""
        op = self._opened.get(data)
        if op is not None:
            return op
        if data in self._forged:
            raise SignatureError("signature does not verify (simulated forgery)")
        raise DecodeError("SimMessage", None, "unknown token")
