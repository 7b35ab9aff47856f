"""A full peer (`node.peer.open_peer`) producing synthetic records, driven by JSON lines.

For integration tests and `bench gossip`; the records come from `bench._records`
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
import os
import random
import sys
import time
from pathlib import Path

import trio

from bench._gossip_peer import json_lines, reply
from bench._records import net_manifest, synthetic_record
from node.host import HostSettings, MessageTooLarge, PeerError
from node.peer import PeerConfig, open_peer
from node.rollout_exchange import protocol_id
from protocol.admission import Admitted, Kind
from protocol.identity import Identity


async def main(args: argparse.Namespace) -> None:
    identity = (
        Identity.from_private_bytes(bytes.fromhex(args.key)) if args.key else Identity.generate()
    )
    manifest = net_manifest(args.run)
    cfg = PeerConfig(
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
    )
    header_lat: list[float] = []
    body_lat: list[float] = []

    def on_deliver(item: Admitted) -> None:
        lat = (item.received_at - item.envelope.timestamp_ms / 1000.0) * 1000.0
        if item.kind is Kind.ROLLOUT_HEADER:
            header_lat.append(lat)
        elif item.kind is Kind.ROLLOUT_RECORD:
            body_lat.append(lat)

    with trio.move_on_after(args.max_life):
        async with open_peer(cfg) as peer:
            peer.on_deliver(on_deliver)
            reply(
                {
                    "peer_id": peer.host.peer_id,
                    "addrs": peer.host.listen_addrs(),
                    "bootstrap": peer.bootstrap_results,
                }
            )

            pool = None
            if args.proof_pool:
                import msgpack

                pool = [tuple(x) for x in msgpack.unpackb(Path(args.proof_pool).read_bytes())]

            production = [0]  # "stop" ends the production running now; a later one may start

            next_counter: list[int | None] = [None]

            async def produce(n: int, rate: float, size: int, burst: int = 1) -> None:
                start, mine = time.monotonic(), production[0]
                if next_counter[0] is None:
                    status = await trio.to_thread.run_sync(peer.store.produced_status)
                    next_counter[0] = status["produced"]  # dense, never reused across restarts
                # Seeded by the first counter too: a second produce call must not repeat the
                # first one's bodies (the same body twice is double work, and gets us banned).
                rng = random.Random(os.getpid() * 1_000_003 + next_counter[0])
                batch: list[bytes] = []
                for i in range(n):
                    if production[0] != mine:
                        return
                    counter = next_counter[0]  # one per record even when produce calls overlap
                    next_counter[0] = counter + 1
                    record = synthetic_record(
                        identity,
                        manifest,
                        counter,
                        n_completion=size,
                        proof_pool=pool,
                        rng=rng,
                        seq=peer.seq.next(),
                    )
                    batch.append(record)
                    if len(batch) == burst or i == n - 1:  # a generation batch, published at once
                        await peer.produce_many(batch)
                        batch = []
                        await trio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))

            async def evil() -> dict[str, object]:
                topic = peer.topics["rollouts"]
                sent = 0
                for i in range(30):
                    await peer.host.publish(topic, b"\xc1garbage" + i.to_bytes(2, "big"))
                    sent += 1
                try:
                    await peer.host.publish(
                        topic, b"\x00" * (peer.host.settings.max_gossip_bytes + 1)
                    )
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

            async with trio.open_nursery() as nursery:
                stdin = trio.lowlevel.FdStream(os.dup(0))
                async for cmd in json_lines(stdin):
                    kind = cmd.get("cmd")
                    if kind == "produce":
                        nursery.start_soon(
                            produce, cmd["n"], cmd.get("rate", 2.0), cmd.get("size", 1024),
                            max(1, int(cmd.get("burst", 1))),
                        )
                        reply({"ok": True})
                    elif kind == "stats":
                        stored = await trio.to_thread.run_sync(peer.store.count_rollouts)
                        reply(
                            {
                                **peer.stats(),
                                "stored": stored,
                                "header_latency_ms": header_lat,
                                "body_latency_ms": body_lat,
                                "connected": peer.host.connected_peers(),
                            }
                        )
                    elif kind == "stop":
                        production[0] += 1
                        reply({"ok": True})
                    elif kind == "delivery":
                        reply(await trio.to_thread.run_sync(peer.store.delivery_status))
                    elif kind == "ids":
                        own = identity.peer_id if cmd.get("own") else None
                        ids = await trio.to_thread.run_sync(peer.store.rollout_ids_with_body, own)
                        reply({"ids": [i.hex() for i in ids]})
                    elif kind == "evil":
                        reply(await evil())
                    elif kind == "batch":
                        peer.outbox.set_max_batch(int(cmd["n"]))
                        reply({"ok": True})
                    elif kind == "quit":
                        break
                nursery.cancel_scope.cancel()
    reply({"closed": True})


def cli() -> None:
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
    parser.add_argument("--max-life", type=float, default=300.0)
    parser.add_argument("--proof-pool", default="", help="msgpack file of real proof lists")
    args = parser.parse_args()
    if os.environ.get("SWARM_LOG"):  # e.g. SWARM_LOG=INFO: peer events and their reasons
        import logging

        ours = logging.getLogger("swarm")
        ours.addHandler(logging.StreamHandler(sys.stderr))
        ours.setLevel(os.environ["SWARM_LOG"])
    sys.setrecursionlimit(10_000)
    trio.run(main, args)


if __name__ == "__main__":
    cli()
