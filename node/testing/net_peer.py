"""A full peer (`node.peer.peer.open_peer`) producing synthetic records, driven by JSON lines.

For integration tests and `bench gossip`; the records come from `node.testing.records`
(well-formed and signed, not model output). Start-up prints
`{"peer_id", "addrs", "bootstrap": [[addr, ok, error], ...]}`. Commands on stdin, one JSON
object per line, each answered by one JSON line:

- `{"cmd": "produce", "n": N, "rate": R, "burst": B}`  start producing N records at R/s
                       (background), B at a time as a worker publishes a generation
                       batch (default 1); counters resume after what the store says was
                       produced
- `{"cmd": "stop"}`    stop producing (keep serving); a later "produce" starts again
- `{"cmd": "delivery"}` this peer's own rollouts: produced / delivered / pending / too stale
- `{"cmd": "stats"}`   peer stats, stored rollout / body counts, delivery latencies
- `{"cmd": "ids"}`     hex ids of stored rollouts that have a body (`"own": true`: only
                       the ones this peer produced)
- `{"cmd": "batch", "n": N}`  headers per gossip message from now on (1: no batching)
- `{"cmd": "evil"}`    publish malformed and oversized messages on the rollouts topic and
                       send a garbage body request to every peer (misbehaviour for tests)
- `{"cmd": "quit"}`
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import trio

from node.exchange.rollouts import protocol_id
from node.host.host import HostSettings, MessageTooLarge, PeerError
from node.peer.peer import PeerConfig, open_peer
from node.testing.peer_process import json_lines, reply
from node.testing.records import net_manifest, synthetic_record
from protocol.admission import AdmissionConfig, Admitted, Kind
from protocol.identity import Identity
from protocol.wire import RunManifest


def _config(args: argparse.Namespace, identity: Identity, manifest: RunManifest) -> PeerConfig:
    return PeerConfig(
        manifest=manifest,
        identity=identity,
        data_dir=Path(args.data_dir),
        roles=(args.role,),
        listen=(args.listen,),
        bootstrap=tuple(args.bootstrap),
        pull_bodies=not args.no_pull,
        publish_rate_per_s=args.publish_rate,
        header_batch=args.header_batch,
        host=HostSettings(peer_dead_after_s=args.dead_after),
        admission=AdmissionConfig(signer_rate=args.signer_rate, signer_burst=args.signer_burst),
    )


def _proof_pool(path: str) -> list[tuple[bytes, ...]] | None:
    """The proof lists of `--proof-pool` (None: none given, proofs are built per record)."""
    if not path:
        return None

    return [tuple(x) for x in msgpack.unpackb(Path(path).read_bytes())]


class Driver:
    """The command handlers of one running peer, and the delivery latencies it records."""

    def __init__(
        self, peer: Any, identity: Identity, manifest: RunManifest, pool: Any, nursery: trio.Nursery
    ) -> None:
        self.peer, self.identity, self.manifest, self.pool = peer, identity, manifest, pool
        self.nursery = nursery
        self.header_lat: list[float] = []  # ms, record signed -> header admitted
        self.body_lat: list[float] = []  # ms, record signed -> body admitted and stored
        self.production = 0  # "stop" ends the production running now; a later one may start
        self.next_counter: int | None = None

    def on_deliver(self, item: Admitted) -> None:
        """Record the latency of a delivered header or record."""
        lat = (item.received_at - item.envelope.timestamp_ms / 1000.0) * 1000.0
        if item.kind is Kind.ROLLOUT_HEADER:
            self.header_lat.append(lat)
        elif item.kind is Kind.ROLLOUT_RECORD:
            self.body_lat.append(lat)

    async def produce(self, n: int, rate: float, size: int, burst: int = 1) -> None:
        """n synthetic records at `rate`/s, published `burst` at a time."""
        start, mine = time.monotonic(), self.production
        if self.next_counter is None:
            status = await trio.to_thread.run_sync(self.peer.store.produced_status)
            self.next_counter = status["produced"]  # dense, never reused across restarts
        # Seeded by the first counter too: a second produce call must not repeat the
        # first one's bodies (the same body twice is double work, and gets us banned).
        assert self.next_counter is not None  # set above
        rng = random.Random(os.getpid() * 1_000_003 + self.next_counter)
        batch: list[bytes] = []
        for i in range(n):
            if self.production != mine:
                return
            counter = self.next_counter  # one per record even when produce calls overlap
            assert counter is not None  # set above
            self.next_counter = counter + 1
            record = synthetic_record(
                self.identity,
                self.manifest,
                counter,
                n_completion=size,
                proof_pool=self.pool,
                rng=rng,
                seq=self.peer.seq.next(),
            )
            batch.append(record)
            if len(batch) == burst or i == n - 1:  # a generation batch, published at once
                await self.peer.produce_many(batch)
                batch = []
                await trio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))

    async def cmd_produce(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Start producing `n` synthetic records in the background; answers at once."""
        self.nursery.start_soon(
            self.produce,
            cmd["n"],
            cmd.get("rate", 2.0),
            cmd.get("size", 1024),
            max(1, int(cmd.get("burst", 1))),
        )
        return {"ok": True}

    async def cmd_stats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The peer's stats, the stored rollout count and the latencies seen."""
        stored = await trio.to_thread.run_sync(self.peer.store.count_rollouts)
        return {
            **self.peer.stats(),
            "stored": stored,
            "header_latency_ms": self.header_lat,
            "body_latency_ms": self.body_lat,
            "connected": self.peer.host.connected_peers(),
        }

    async def cmd_stop(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Stop any production in progress."""
        self.production += 1
        return {"ok": True}

    async def cmd_delivery(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The store's delivery status of our own rollouts."""
        return await trio.to_thread.run_sync(self.peer.store.delivery_status)

    async def cmd_ids(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Hex ids of the rollouts stored with their body (`own`: ours only)."""
        own = self.identity.peer_id if cmd.get("own") else None
        ids = await trio.to_thread.run_sync(self.peer.store.rollout_ids_with_body, own)
        return {"ids": [i.hex() for i in ids]}

    async def cmd_evil(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Publish the misbehaving messages of `_evil` and say what was sent."""
        return await _evil(self.peer, self.manifest)

    async def cmd_batch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Set the outbox's header batch size."""
        self.peer.outbox.set_max_batch(int(cmd["n"]))
        return {"ok": True}

    async def serve(self, lines: Any) -> None:
        """Answers each command line until "quit" or the end of input; unknown commands
        are ignored."""
        handlers = {
            "produce": self.cmd_produce,
            "stats": self.cmd_stats,
            "stop": self.cmd_stop,
            "delivery": self.cmd_delivery,
            "ids": self.cmd_ids,
            "evil": self.cmd_evil,
            "batch": self.cmd_batch,
        }
        async for cmd in lines:
            kind = cmd.get("cmd")
            if kind == "quit":
                break
            if kind in handlers:
                reply(await handlers[kind](cmd))


async def _evil(peer: Any, manifest: RunManifest) -> dict[str, object]:
    """Malformed and oversized messages on the rollouts topic, and a garbage body request
    to every connected peer."""
    topic = peer.topics["rollouts"]
    sent = 0
    for i in range(30):
        await peer.host.publish(topic, b"\xc1garbage" + i.to_bytes(2, "big"))
        sent += 1
    try:
        await peer.host.publish(topic, b"\x00" * (peer.host.settings.max_gossip_bytes + 1))
    except MessageTooLarge:
        pass
    # A header-sized message that is far over admission's header limit.
    await peer.host.publish(topic, b"\x92" + os.urandom(200_000))
    sent += 1
    bad_requests = 0
    for other in peer.host.connected_peers():
        try:
            stream = await peer.host.open_stream(other, protocol_id(manifest.run_id))
            await stream.send(b"\xff" * 64)
            await stream.close()
            bad_requests += 1
        except PeerError:
            pass
    return {"evil_sent": sent, "bad_requests": bad_requests}


async def main(args: argparse.Namespace) -> None:
    """Open the peer and answer commands until `quit` or `--max-life`."""
    identity = (
        Identity.from_private_bytes(bytes.fromhex(args.key)) if args.key else Identity.generate()
    )
    manifest = net_manifest(args.run)
    with trio.move_on_after(args.max_life):
        async with open_peer(_config(args, identity, manifest)) as peer:
            async with trio.open_nursery() as nursery:
                driver = Driver(peer, identity, manifest, None, nursery)
                peer.on_deliver(driver.on_deliver)
                reply(
                    {
                        "peer_id": peer.host.peer_id,
                        "addrs": peer.host.listen_addrs(),
                        "bootstrap": peer.bootstrap_results,
                    }
                )
                driver.pool = _proof_pool(args.proof_pool)  # after the hello the parent waits on
                await driver.serve(json_lines(trio.lowlevel.FdStream(os.dup(0))))
                nursery.cancel_scope.cancel()
    reply({"closed": True})


def cli() -> None:
    """Parse the command line and run `main`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--run", default="net-test")
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--bootstrap", nargs="*", default=[])
    parser.add_argument("--key", default="")
    parser.add_argument("--no-pull", action="store_true")
    parser.add_argument("--role", default="inference", help="the role announced in hello")
    parser.add_argument("--publish-rate", type=float, default=8.0)
    parser.add_argument("--header-batch", type=int, default=PeerConfig.header_batch)
    parser.add_argument("--dead-after", type=float, default=4.0)
    parser.add_argument(
        "--signer-rate",
        type=float,
        default=AdmissionConfig().signer_rate,
        help="admission: what one producer may publish a second (it paces to it too)",
    )
    parser.add_argument("--signer-burst", type=float, default=AdmissionConfig().signer_burst)
    parser.add_argument("--max-life", type=float, default=300.0)
    parser.add_argument("--proof-pool", default="", help="msgpack file of real proof lists")
    args = parser.parse_args()
    if os.environ.get("SWARM_LOG"):  # e.g. SWARM_LOG=INFO: peer events and their reasons
        ours = logging.getLogger("swarm")
        ours.addHandler(logging.StreamHandler(sys.stderr))
        ours.setLevel(os.environ["SWARM_LOG"])
    sys.setrecursionlimit(10_000)
    trio.run(main, args)


if __name__ == "__main__":
    cli()
