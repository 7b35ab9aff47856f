"""What a peer's drivers and roles use of it, as small `typing.Protocol`s, and `Handled`.

`node.peer.peer.Peer` satisfies every protocol here; the drivers (`body_puller`,
`services`, `upkeep`, `run_service`) and the roles (`node.roles`) are typed against these,
never against `Peer` itself, so none of them imports `node.peer.peer`.

- `Handled`: what became of one event handed to admission.
- `Admit`: the one way into admission (`submit`, `admit`).
- `Spawn`: start a task in the peer's nursery.
- `BadRequests`: charge a peer for a malformed stream request.
- `BodyWants`: the body pulls a peer wants.
- `VersionView`: the peer's current policy version.
- `Deliveries`: callbacks for admitted (and too-late) items.
- `Publisher`: produce rollouts, publish verdicts and producer claims.
- `Reporter`: a role's fault-finding about a peer.
- `RunPeer`: what the run release service uses.
- `WeightsView`: the peer's weight sync and run manifest (hot swap, held versions).
- `RelayPeer`, `InferencePeer`, `ValidatorPeer`, `TrainerPeer`: what each role uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from node.host.host import SwarmHost
from node.peer.config import PeerConfig
from node.peer.discovery import Discovery
from node.peer.gossip import Outbox
from node.store.store import Store
from node.weights.sync import WeightSync
from protocol import admission as adm
from protocol.admission import Admission, Admitted, Kind
from protocol.forwarding import GossipVerdict, verdict_of
from protocol.identity import Identity
from protocol.wire import ProducerClaim, RunManifest, Verdict


@dataclass
class Handled:
    """What became of one event handed to admission (`Admit.submit`). `done` is set once
    every action ran (after the store write, if there was one)."""

    actions: list[adm.Action]
    done: trio.Event = field(default_factory=trio.Event)
    forward: bool = False
    admitted: bool = False  # delivered to the roles
    duplicate: bool = False
    store_failed: bool = False

    @property
    def accepted(self) -> bool:
        """Forwarded or delivered: admission took it."""
        return self.forward or self.admitted

    @property
    def verdict(self) -> GossipVerdict:
        """Accept / ignore / reject at the GossipSub boundary; a message whose write has
        not finished (or failed) is ignored here, never rejected."""
        v = verdict_of(self.actions)
        if v is GossipVerdict.ACCEPT and (self.store_failed or not self.done.is_set()):
            return GossipVerdict.IGNORE
        return v


class Admit(Protocol):
    """The one way into admission: an event now, or a message and its outcome."""

    def submit(self, event: adm.Event) -> Handled:
        """Hand one event to admission and carry out its actions."""
        ...

    async def admit(
        self,
        sender: str,
        kind: Kind,
        data: bytes,
        origin: str | None = None,
        wait_s: float | None = None,
    ) -> Handled:
        """Admit a message from `sender` and wait until its actions ran."""
        ...


class Spawn(Protocol):
    """Start `fn(*args)` in the peer's nursery (nothing new starts while stopping)."""

    def __call__(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...


class BadRequests(Protocol):
    """Charge `peer` for a malformed request on one of our stream protocols."""

    def __call__(self, peer: str, reason: str) -> None: ...


class BodyWants(Protocol):
    """The bodies a peer pulls (a no-op for peers that pull none)."""

    def want_body(
        self, rollout_id: bytes, sources: Sequence[str], origin: tuple[bytes, str] | None = None
    ) -> None:
        """Pull the body of `rollout_id` from `sources`."""
        ...

    def body_wanted(self, rollout_id: bytes) -> bool:
        """Whether a pull of `rollout_id` is pending."""
        ...


class VersionView(Protocol):
    """The peer's current policy version (the newest installed)."""

    @property
    def policy_version(self) -> int:
        """The newest installed policy version; staleness is judged from it."""
        ...


class Deliveries(Protocol):
    """Callbacks for what admission hands the roles."""

    def on_deliver(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every admitted item."""
        ...

    def on_late(self, callback: Callable[[Admitted], None]) -> None:
        """`callback(item)` for every authentic rollout refused only as too stale."""
        ...


class Publisher(Protocol):
    """What a role puts on the network: its rollouts, verdicts and producer claims."""

    async def produce_many(self, records: Sequence[bytes]) -> list[bytes]:
        """Store our own rollout records durably, then gossip their headers."""
        ...

    async def publish_verdict(self, verdict: Verdict) -> bytes:
        """Sign, store and gossip a verdict."""
        ...

    async def publish_producer_claim(self, claim: ProducerClaim) -> bytes:
        """Sign and gossip a producer claim."""
        ...


class Reporter(Protocol):
    """A role's fault-finding about a peer, scored through admission."""

    def report(
        self, peer: bytes | str, penalty: float, reason: str, offence: str | None = None
    ) -> None:
        """Score `peer` down by `penalty` (<= 0) for `reason`."""
        ...


class RunPeer(VersionView, Protocol):
    """What `node.peer.run_service.RunService` uses of its peer."""

    host: SwarmHost
    manifest: RunManifest
    run_id: str
    cfg: PeerConfig
    discovery: Discovery
    admission: Admission

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start `fn(*args)` in the peer's nursery."""
        ...

    def bad_request(self, peer: str, reason: str) -> None:
        """Charge `peer` for a malformed request."""
        ...

    def report(
        self, peer: bytes | str, penalty: float, reason: str, offence: str | None = None
    ) -> None:
        """Score `peer` down by `penalty` (<= 0) for `reason`."""
        ...


class WeightsView(Protocol):
    """The peer's policy weights (None when it keeps none) and its run's manifest."""

    manifest: RunManifest
    weights: WeightSync | None


class RelayPeer(Protocol):
    """What the relay role reads: the peer's counters."""

    counters: Counter[str]


class InferencePeer(Deliveries, Publisher, Protocol):
    """What the inference role uses of its peer."""

    manifest: RunManifest
    identity: Identity
    host: SwarmHost
    store: Store
    admission: Admission
    outbox: Outbox
    topics: dict[str, str]
    weights: WeightSync | None
    cfg: PeerConfig


class ValidatorPeer(Deliveries, Publisher, Reporter, Protocol):
    """What the validator role uses of its peer."""

    manifest: RunManifest
    identity: Identity
    run_id: str
    store: Store
    admission: Admission
    weights: WeightSync | None


class TrainerPeer(Deliveries, Reporter, Protocol):
    """What the trainer role uses of its peer."""

    manifest: RunManifest
    admission: Admission
    weights: WeightSync | None
