"""One peer of `bench broadcast`'s real part: an origin (trainer key), a receiver, or a liar.

    python -m swarm_node_bench.parts.weights_peer --run-id R --trainer-key HEX --data-dir D
        [--key HEX] [--bootstrap ADDR] [--upload-limit MIB_S] [--shard-bytes N]
        [--checkpoint PATH] [--liar] [--trace FILE]

Prints one JSON line at start (`peer_id`, `addr`), then reads commands (one JSON object a
line on stdin) and answers each with one JSON line on stdout:

- `{"cmd": "publish"}` (origin): publish `--checkpoint` as the next version ->
  `{"published_at", "version", "digest"}`
- `{"cmd": "wait", "version": V, "timeout": T}` (receiver): until V is installed ->
  `{"done_at", "ok"}` (ok: the installed bytes hash to the signed digest)
- `{"cmd": "stats"}` -> uploaded bytes, counters, connected peers, have-map watches served
- `{"cmd": "cap", "mib_s": X}`: set this peer's upload cap (0: none) -> `{"cap": X}`
- `{"cmd": "stream", "peer": P, "version": V, "in_flight": K}`: fetch every shard of V's
  full manifest from P, K requests at a time (default 1) -> `{"mib_per_s"}`
- `{"cmd": "quit"}`

`--trace FILE`: every 0.5 s one JSON line (time, bytes uploaded, the download's
progress) for looking at a broadcast's timeline.

A liar (`--liar`) installs `--checkpoint` itself once it sees the manifest (so it holds
every shard) and serves each shard with one byte flipped: injected bad shards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import trio

from node.exchange import shards as shard_exchange
from node.host.host import HostSettings
from node.peer.peer import Peer, PeerConfig, open_peer
from node.testing.peer_process import json_lines
from node.testing.records import net_manifest
from node.weights.sync import WeightSettings, WeightSync
from protocol.admission import Admitted, Kind
from protocol.identity import Identity, peer_id_from_b58
from trainer.checkpoint import weights_digest


def _out(obj: dict) -> None:  # type: ignore[type-arg]
    print(json.dumps(obj), flush=True)


async def main(a: argparse.Namespace) -> None:
    """Open the peer in its part (origin, receiver or liar) and answer commands until `quit`."""
    identity = Identity.from_private_bytes(bytes.fromhex(a.key)) if a.key else Identity.generate()

    manifest = dataclasses.replace(
        net_manifest(a.run_id), trainer_keys=(peer_id_from_b58(a.trainer_key),)
    )
    settings = WeightSettings(
        upload_limit_mib_s=a.upload_limit,
        shard_bytes=a.shard_bytes,
    )
    cfg = PeerConfig(
        manifest=manifest,
        identity=identity,
        data_dir=Path(a.data_dir),
        roles=("relay",),
        listen=("/ip4/127.0.0.1/tcp/0",),
        bootstrap=tuple(a.bootstrap),
        weights=settings,
        host=HostSettings(io_timeout_s=20.0),
        max_peers=32,
    )
    checkpoint = Path(a.checkpoint).read_bytes() if a.checkpoint else b""
    served_bad = {"n": 0}
    async with open_peer(cfg) as peer:
        w = peer.weights
        assert w is not None
        if a.liar:
            real = w.store.read_shard

            def corrupt(mid: bytes, index: int) -> bytes | None:
                data = real(mid, index)
                if data is None:
                    return None
                served_bad["n"] += 1
                return bytes([data[0] ^ 0xFF]) + data[1:]

            w.store.read_shard = corrupt  # type: ignore[method-assign]

            def on_deliver(item: Admitted) -> None:
                if (
                    item.kind in (Kind.WEIGHT_ANNOUNCE, Kind.WEIGHT_MANIFEST)
                    and item.obj.kind == "full"
                ):
                    if item.obj.file_digest == weights_digest(checkpoint):
                        w.store.install_bytes(item.obj.version, checkpoint, item.obj.file_digest)
                        w.note_installed(item.obj.version, item.obj.file_digest)

            peer.on_deliver(on_deliver)
        _out({"peer_id": peer.host.peer_id, "addr": peer.host.listen_addrs()[0]})
        async with trio.open_nursery() as nursery:
            if a.trace:
                nursery.start_soon(_trace, peer, w, a.trace)
            await _commands(peer, w, checkpoint, served_bad)
            nursery.cancel_scope.cancel()


async def _trace(peer: Peer, w: WeightSync, path: str) -> None:
    installs: list[list[float]] = []
    store = w.store  # type: ignore[attr-defined]
    install_full = store.install_full

    def timed_install(mid: bytes) -> int:
        t0 = time.time()
        try:
            return install_full(mid)
        finally:
            installs.append([round(t0, 3), round(time.time() - t0, 3)])

    store.install_full = timed_install  # pyright: ignore[reportAttributeAccessIssue]
    announced: list[float] = []

    def first_announcement(item: Admitted) -> None:
        if item.kind in (Kind.WEIGHT_ANNOUNCE, Kind.WEIGHT_MANIFEST) and not announced:
            announced.append(round(time.time(), 3))

    peer.on_deliver(first_announcement)  # type: ignore[attr-defined]
    with open(path, "w") as f:
        while True:
            st = w.status()  # type: ignore[attr-defined]
            d = st["download"] or {}
            f.write(
                json.dumps(
                    {
                        "t": time.time(),
                        "up": st["uploaded_bytes"],
                        "done": d.get("bytes_done"),
                        "flight": d.get("in_flight"),
                        "announced": announced,
                        "installed": st["installed"],
                        "installs": installs,
                    }
                )
                + "\n"
            )
            f.flush()
            await trio.sleep(0.5)


async def _commands(peer: Peer, w: WeightSync, checkpoint: bytes, served_bad: dict) -> None:  # type: ignore[type-arg]
    async for cmd in json_lines(trio.lowlevel.FdStream(sys.stdin.fileno())):
        c = cmd["cmd"]
        if c == "quit":
            break
        if c == "publish":
            version = await w.publish(checkpoint)
            _out(
                {
                    "published_at": w.published_at[version],
                    "version": version,
                    "digest": weights_digest(checkpoint).hex(),
                }
            )
        elif c == "wait":
            with trio.move_on_after(cmd.get("timeout", 120)):
                await w.wait_installed(cmd["version"])
            v = cmd["version"]
            ok = v in w.installed() and weights_digest(w.store.read_version(v)) == w.installed()[v]
            _out({"done_at": w.installed_at.get(v), "ok": ok})
        elif c == "stats":
            _out(
                {
                    "uploaded": w.limiter.sent,
                    "counters": w.counters,
                    "served_bad": served_bad["n"],
                    "rejects": dict(peer.rejects),
                    "target": w.target,
                    "error": w.error,
                    "installed": sorted(w.installed()),
                    "peers": len(peer.host.connected_peers()),
                    "watched_by": sum(w.server.watchers.values()),
                }
            )
        elif c == "cap":
            w.limiter.set_rate(float(cmd["mib_s"]))
            _out({"cap": cmd["mib_s"]})
        elif c == "stream":
            _out(await _stream(peer, cmd["peer"], cmd["version"], int(cmd.get("in_flight", 1))))
        else:
            _out({"error": f"unknown command {c!r}"})


async def _stream(peer: Peer, source: str, version: int, in_flight: int = 1) -> dict:  # type: ignore[type-arg]
    """Fetch every shard of `version`'s full manifest from `source`, `in_flight` requests
    at a time (each a shard fetch on its own stream, as the node's scheduler makes them)."""
    w = peer.weights
    assert w is not None  # the peer runs with weight settings
    full = [
        (mid, m)
        for mid, m in w.server.manifests.items()
        if m.version == version and m.kind == "full"
    ]
    if not full:
        return {"error": "no full manifest"}
    mid, m = full[0]
    got = [0]

    async def lane(shards: list) -> None:  # type: ignore[type-arg]
        for s in shards:
            data = await shard_exchange.fetch_shard(
                peer.host,
                source,
                peer.run_id,
                mid,
                s.index,
                s.size,  # type: ignore[attr-defined]
            )
            got[0] += len(data or b"")

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(in_flight):
            nursery.start_soon(lane, list(m.shards[k::in_flight]))
    dt = time.perf_counter() - t0
    return {
        "mib_per_s": round(got[0] / dt / 2**20, 1),
        "bytes": got[0],
        "seconds": round(dt, 3),
        "in_flight": in_flight,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", required=True)
    p.add_argument("--trainer-key", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--key", default="")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--upload-limit", type=float, default=0.0)
    p.add_argument("--shard-bytes", type=int, default=4 * 2**20)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--liar", action="store_true")
    p.add_argument("--trace", default="")
    trio.run(main, p.parse_args())
