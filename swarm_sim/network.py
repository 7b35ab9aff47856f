"""The network model: regions, latency, bandwidth queues, loss, connections, CPU cost.

What lives here: where each virtual peer sits (a region), its uplink and downlink, whether
it is online, its connections, and how long one message takes from sender to receiver.
What it never does: decide what to send (that is the protocol's and the router's job).

One transmission of `n` bytes from `a` to `b` sent at `t`:

    up_start  = max(t, up_free[a])                    a busy uplink queues (FIFO)
    up_done   = up_start + n / up[a];  up_free[a] = up_done
    lat       = base[region a][region b] * (1 + U(0, jitter))   never below the base
    -- one event at up_done + lat (the last byte is off the wire) --
    down_done = max(up_done + lat, max(up_start + lat, down_free[b]) + n / down[b])
    done      = max(down_done, cpu_free[b]) + cpu_s(n);  cpu_free[b] = done
    -- the receiver's handler runs at `done` --

A lost message (probability `loss`) still occupies the sender's uplink. Every byte sent is
counted once as received or as dropped (lost, receiver offline or disconnected on
arrival, sender gone): `bytes_sent == bytes_received + bytes_dropped` once no message is
in flight (`in_flight_bytes`). A peer that is offline receives nothing; a message is
dropped if the receiver went offline or the connection closed while it travelled.

With `shared_cpus = k` every peer's handlers share k cores (peers run as processes on one
machine, as `bench gossip`'s do): `done` then waits for the earliest free core.

Connections are undirected and limited to `max_conns` per peer; `connect` refuses past it.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_sim.core import EventLoop

__all__ = ["DEFAULT_LATENCY_MS", "DEFAULT_REGIONS", "NetConfig", "Network", "closure"]

DEFAULT_REGIONS = ("us-east", "us-west", "europe", "asia", "south-america")
# One-way base latency in ms between regions (symmetric; within a region on the diagonal).
DEFAULT_LATENCY_MS = (
    (10, 35, 45, 110, 65),
    (35, 10, 75, 70, 90),
    (45, 75, 10, 125, 100),
    (110, 70, 125, 15, 160),
    (65, 90, 100, 160, 20),
)


def closure(matrix: Sequence[Sequence[float]]) -> list[list[float]]:
    """Shortest-path closure of a latency matrix (Floyd-Warshall): never above the input."""
    n = len(matrix)
    d = [list(map(float, row)) for row in matrix]
    for k in range(n):
        for i in range(n):
            for j in range(n):
                if d[i][k] + d[k][j] < d[i][j]:
                    d[i][j] = d[i][k] + d[k][j]
    return d


@dataclass(frozen=True, slots=True)
class NetConfig:
    """Settings of the network model (bandwidths in megabits per second)."""

    regions: tuple[str, ...] = DEFAULT_REGIONS
    latency_ms: tuple[tuple[float, ...], ...] = DEFAULT_LATENCY_MS
    region_weights: tuple[float, ...] = ()  # empty: equal shares
    jitter: float = 0.1  # latency x (1 + U(0, jitter))
    up_mbps: tuple[float, float] = (10.0, 1000.0)  # log-uniform between these
    down_mbps: tuple[float, float] = (50.0, 1000.0)
    loss: float = 0.0
    max_conns: int = 64
    cpu_per_msg_s: float = 0.0002  # admission of one message (decode, verify, checks)
    cpu_per_byte_s: float = 0.0
    shared_cpus: int = 0  # 0: every peer has its own CPU; k: all peers share k cores

    def __post_init__(self) -> None:
        n = len(self.regions)
        if n < 1 or len(self.latency_ms) != n or any(len(r) != n for r in self.latency_ms):
            raise ValueError("latency_ms must be a square matrix, one row per region")
        if any(v < 0 or not math.isfinite(v) for r in self.latency_ms for v in r):
            raise ValueError("latencies must be finite and >= 0")
        if self.region_weights and len(self.region_weights) != n:
            raise ValueError("region_weights needs one weight per region")
        for name in ("up_mbps", "down_mbps"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be 0 < low <= high")
        if not 0 <= self.loss < 1 or self.jitter < 0:
            raise ValueError("loss must be in [0, 1) and jitter >= 0")
        if self.max_conns < 1 or self.cpu_per_msg_s < 0 or self.cpu_per_byte_s < 0:
            raise ValueError("max_conns >= 1 and CPU costs >= 0")
        if self.shared_cpus < 0:
            raise ValueError("shared_cpus >= 0")


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


@dataclass(slots=True)
class Counters:
    """Network-wide message and byte counts."""

    messages: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_dropped: int = 0
    lost: int = 0
    dropped_offline: int = 0
    refused_connections: int = 0
    in_flight_bytes: int = 0
    copies_suppressed: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # bytes sent per message kind


class Network:
    """Peers 0..n-1 on the model above; `send` schedules the receiver's handler."""

    def __init__(self, loop: EventLoop, cfg: NetConfig, n: int, rng: random.Random) -> None:
        self.loop, self.cfg, self.n, self._rng = loop, cfg, n, rng
        weights = cfg.region_weights or (1.0,) * len(cfg.regions)
        self.region = array("b", rng.choices(range(len(cfg.regions)), weights, k=n))
        # Bytes per second.
        self.up = array("d", (_log_uniform(rng, *cfg.up_mbps) * 125_000 for _ in range(n)))
        self.down = array("d", (_log_uniform(rng, *cfg.down_mbps) * 125_000 for _ in range(n)))
        self.base = [[v / 1000.0 for v in row] for row in cfg.latency_ms]
        self.base_closed = [[v / 1000.0 for v in row] for row in closure(cfg.latency_ms)]
        self.up_free = array("d", bytes(8 * n))
        self.down_free = array("d", bytes(8 * n))
        self.cpu_free = array("d", bytes(8 * n))
        self.online = bytearray(n)
        self.epoch = array("l", bytes(8 * n))  # session number; bumps on every leave
        self.conns: list[set[int]] = [set() for _ in range(n)]
        self._sorted: list[list[int] | None] = [None] * n  # sorted(conns[p]), cached
        self.sent = array("q", bytes(8 * n))  # bytes per peer
        self.received = array("q", bytes(8 * n))
        self.c = Counters()
        self._loss, self._jitter, self._base = cfg.loss, cfg.jitter, self.base
        self._pool = [0.0] * cfg.shared_cpus

    # -- membership and connections ---------------------------------------------

    def set_online(self, p: int, online: bool) -> None:
        """Bring peer `p` online or take it offline (going offline starts a new epoch)."""
        if not online and self.online[p]:
            self.epoch[p] += 1
        self.online[p] = 1 if online else 0

    def connect(self, a: int, b: int) -> bool:
        """Open a connection (both online, under both limits); True if it is open now."""
        if a == b or not (self.online[a] and self.online[b]):
            return False
        if b in self.conns[a]:
            return True
        cap = self.cfg.max_conns
        if len(self.conns[a]) >= cap or len(self.conns[b]) >= cap:
            self.c.refused_connections += 1
            return False
        self.conns[a].add(b)
        self.conns[b].add(a)
        self._sorted[a] = self._sorted[b] = None
        return True

    def disconnect(self, a: int, b: int) -> None:
        """Close the link between `a` and `b`."""
        self.conns[a].discard(b)
        self.conns[b].discard(a)
        self._sorted[a] = self._sorted[b] = None

    def sorted_conns(self, p: int) -> list[int]:
        """`sorted(conns[p])`, kept until `p`'s connections change (do not modify it)."""
        s = self._sorted[p]
        if s is None:
            s = self._sorted[p] = sorted(self.conns[p])
        return s

    # -- timing -------------------------------------------------------------------

    def cpu_s(self, nbytes: int) -> float:
        """CPU seconds a peer spends handling a message of `nbytes`."""
        return self.cfg.cpu_per_msg_s + nbytes * self.cfg.cpu_per_byte_s

    def min_delay(self, a: int, b: int, nbytes: int) -> float:
        """The least time `send` can take from `a` to `b` (no queues, no jitter)."""
        return (
            self.base_closed[self.region[a]][self.region[b]]
            + nbytes / min(self.up[a], self.down[b])
            + self.cpu_s(nbytes)
        )

    def send(
        self,
        a: int,
        b: int,
        nbytes: int,
        kind: str,
        handler: Callable[..., Any],
        args: tuple[Any, ...] = (),
        seen: Callable[..., bool] | None = None,
        need_conn: bool = True,
        eta: dict[int, float] | None = None,
        control: bool = False,
    ) -> bool:
        """Send `nbytes` from `a` to `b`; at arrival `handler(*args)` runs on `b`'s CPU.

        Returns False (nothing sent) when `a` is offline or, with `need_conn`, when the two
        are not connected. `seen(*args)`, when given, is asked as the last byte arrives: a
        True answer is a copy the receiver's router drops from its seen-cache (it uses the
        downlink, costs no CPU and runs no handler), like gossipsub's duplicate check.
        """
        return (
            self._transmit(a, (b,), nbytes, kind, handler, (args,), seen, need_conn, eta, control)
            > 0
        )

    def send_many(
        self,
        a: int,
        targets: Sequence[int],
        nbytes: int,
        kind: str,
        handler: Callable[[int, Any, Any], Any],
        src: Any,
        payload: Any,
        seen: Callable[[int, Any, Any], bool] | None = None,
        eta: dict[int, float] | None = None,
        control: bool = False,
    ) -> None:
        """`send(a, b, nbytes, kind, handler, (b, src, payload), seen, eta=eta,
        control=control)` for each `b` of `targets` in order (gossip fan-out)."""
        if targets:
            args = [(b, src, payload) for b in targets]
            self._transmit(a, targets, nbytes, kind, handler, args, seen, True, eta, control)

    def _transmit(
        self,
        a: int,
        targets: Sequence[int],
        nbytes: int,
        kind: str,
        handler: Callable[..., Any],
        args_of: Sequence[tuple[Any, ...]],
        seen: Callable[..., bool] | None,
        need_conn: bool,
        eta: dict[int, float] | None,
        control: bool,
    ) -> int:
        """The one transmission model (module docstring) for `targets[i]` with
        `args_of[i]`, in order; the per-call lookups done once. Returns how many were sent
        (0 when `a` is offline; a target not connected, with `need_conn`, is skipped)."""
        if not self.online[a]:
            return 0
        conns, online, c, rng = self.conns[a], self.online, self.c, self._rng
        loss, jitter, received = self._loss, self._jitter, self.received
        now = self.loop.now
        up_a = self.up[a]
        free = self.up_free[a]
        row = self._base[self.region[a]]
        region, epoch, at, arrive = self.region, self.epoch, self.loop.at, self._arrive
        sent = got = 0
        for b, args in zip(targets, args_of, strict=True):
            if need_conn and b not in conns:
                continue
            start = free if free > now else now
            up_done = free = start + nbytes / up_a
            sent += 1
            if loss and rng.random() < loss:
                c.lost += 1
                c.bytes_dropped += nbytes
                continue
            if seen is not None and online[b] and seen(*args):
                # The receiver already holds it: its router will drop this copy. Counted
                # as received now, without an event (a copy's downlink time is not modelled).
                got += 1
                received[b] += nbytes
                continue
            lat = row[region[b]]
            if jitter:
                lat *= 1.0 + jitter * rng.random()
            if eta is not None:
                first = eta.get(b)
                if first is not None and first <= up_done + lat:
                    c.copies_suppressed += 1
                    got += 1
                    received[b] += nbytes
                    continue
                eta[b] = up_done + lat
            c.in_flight_bytes += nbytes
            at(
                up_done + lat,
                arrive,
                a,
                b,
                nbytes,
                start + lat,
                epoch[b],
                handler,
                args,
                seen,
                control,
            )
        if sent:
            self.up_free[a] = free
            total = sent * nbytes
            c.messages += sent
            c.bytes_sent += total
            self.sent[a] += total
            c.by_kind[kind] = c.by_kind.get(kind, 0) + total
            c.bytes_received += got * nbytes
        return sent

    def _arrive(
        self,
        a: int,
        b: int,
        nbytes: int,
        first_byte: float,
        epoch: int,
        handler: Callable[..., Any],
        args: tuple[Any, ...],
        seen: Callable[..., bool] | None,
        control: bool,
    ) -> None:
        c = self.c
        c.in_flight_bytes -= nbytes
        if not self.online[b] or self.epoch[b] != epoch:
            c.dropped_offline += 1
            c.bytes_dropped += nbytes
            return
        now = self.loop.now
        d_start = self.down_free[b]
        if d_start < first_byte:
            d_start = first_byte
        done = d_start + nbytes / self.down[b]
        if done < now:
            done = now
        self.down_free[b] = done
        c.bytes_received += nbytes
        self.received[b] += nbytes
        if seen is not None and seen(*args):
            return
        if control:
            if done <= now:
                handler(*args)
            else:
                self.loop.at(done, self._handle, b, epoch, handler, args)
            return
        if self._pool:  # peers on one machine: the earliest free of its cores
            core = min(range(len(self._pool)), key=self._pool.__getitem__)
            cpu = max(self._pool[core], done) + self.cpu_s(nbytes)
            self._pool[core] = cpu
        else:
            cpu = self.cpu_free[b]
            if cpu < done:
                cpu = done
            cpu += self.cpu_s(nbytes)
            self.cpu_free[b] = cpu
        self.loop.at(cpu, self._handle, b, epoch, handler, args)

    def _handle(self, b: int, epoch: int, handler: Callable[..., Any], args: tuple) -> None:
        if self.online[b] and self.epoch[b] == epoch:
            handler(*args)
