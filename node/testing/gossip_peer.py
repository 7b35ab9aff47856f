"""A bare gossip peer process driven over stdin/stdout (JSON lines), for tests and `bench gossip`.

It runs one `SwarmHost`, subscribes to one topic and obeys commands, one JSON object
per line on stdin; every answer is one JSON line on stdout:

- `{"cmd": "connect", "addrs": [...]}` -> `{"dials": [{"addr", "ok", "error"}]}`
- `{"cmd": "publish", "n": N, "size": S, "rate": R}` -> publishes N messages of S bytes at
  R per second (each begins with the send time, a sequence number and our peer id), then
  `{"published": N, "elapsed_s": ...}`
- `{"cmd": "stats"}` -> `{"received": {origin: count}, "latencies_ms": [...], "events": [...]}`
- `{"cmd": "quit"}` -> exits after the host closed.

Start-up prints `{"peer_id": ..., "addrs": [...]}` once the host listens. Every wait is
bounded: the process exits on its own after `--max-life` seconds.
"""

from __future__ import annotations

import argparse
import os
import secrets
import struct
import time

import trio

from node.host.host import HostSettings, PeerEvent, open_host
from node.testing.peer_process import json_lines, reply

_STAMP = struct.Struct(">dQ")  # send time (time.time()), sequence number


async def main(args: argparse.Namespace) -> None:
    """Run the peer: listen, subscribe, answer commands until `quit` or `--max-life`."""
    settings = HostSettings(peer_dead_after_s=args.dead_after)
    received: dict[str, int] = {}
    latencies: list[float] = []
    events: list[dict[str, object]] = []
    started = time.time()
    with trio.move_on_after(args.max_life):
        async with open_host(
            bytes.fromhex(args.key) if args.key else secrets.token_bytes(32),
            [args.listen],
            settings,
        ) as host:

            def on_event(ev: PeerEvent) -> None:
                events.append(
                    {
                        "kind": ev.kind,
                        "peer": ev.peer,
                        "reason": ev.reason,
                        "t": time.time() - started,
                    }
                )

            host.on_peer_event(on_event)
            channel = await host.subscribe(args.topic)

            async def reader() -> None:
                async for msg in channel:
                    sent, _seq = _STAMP.unpack_from(msg.data)
                    received[msg.origin] = received.get(msg.origin, 0) + 1
                    latencies.append((msg.received_at - sent) * 1000.0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                reply({"peer_id": host.peer_id, "addrs": host.listen_addrs()})
                stdin = trio.lowlevel.FdStream(os.dup(0))
                async for cmd in json_lines(stdin):
                    kind = cmd.get("cmd")
                    if kind == "connect":
                        dials = await host.connect_many(cmd["addrs"])
                        reply(
                            {
                                "dials": [
                                    {"addr": d.addr, "ok": d.ok, "error": d.error} for d in dials
                                ]
                            }
                        )
                    elif kind == "wait_peers":
                        n = await host.wait_for_topic_peers(
                            args.topic, cmd["n"], cmd.get("timeout", 10)
                        )
                        reply({"topic_peers": n})
                    elif kind == "publish":
                        t0 = time.time()
                        pad = b"\0" * max(0, cmd["size"] - _STAMP.size)
                        for seq in range(cmd["n"]):
                            await host.publish(args.topic, _STAMP.pack(time.time(), seq) + pad)
                            if cmd.get("rate"):
                                await trio.sleep_until(
                                    trio.current_time()
                                    + max(0.0, t0 + (seq + 1) / cmd["rate"] - time.time())
                                )
                        reply({"published": cmd["n"], "elapsed_s": time.time() - t0})
                    elif kind == "stats":
                        reply(
                            {
                                "received": received,
                                "latencies_ms": latencies,
                                "events": events,
                                "peers": host.connected_peers(),
                            }
                        )
                    elif kind == "quit":
                        break
                nursery.cancel_scope.cancel()
    reply({"closed": True})


def cli() -> None:
    """Parse the command line and run `main`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--key", default="", help="hex 32-byte private key (default: random)")
    parser.add_argument("--dead-after", type=float, default=4.0)
    parser.add_argument("--max-life", type=float, default=300.0)
    trio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
