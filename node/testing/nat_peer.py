"""A host with circuit relay v2, AutoNAT and DCUtR (`node.host.relay`,
`node.host.reachability`), driven by JSON lines: the peer of the NAT tests and `bench reach`.

Start-up prints `{"peer_id", "addrs"}`. With `--serve-relay` it runs the relay service
with the limits given. Commands on stdin, one JSON object per line, each answered by one
JSON line:

- `{"cmd": "connect", "addr": A}`   dial A: a plain address, or `.../p2p-circuit/p2p/<id>`
                                    through a relay -> `{"ok", "peer", "error"}`
- `{"cmd": "reach", "servers": [id...]}`  AutoNAT dial-back from those connected peers
                                    -> `{"reachability"}`
- `{"cmd": "reserve", "addr": A}`   take a slot on the relay at A -> `{"ok", "addr", "error"}`
- `{"cmd": "send", "peer": P, "n": N, "size": S}`  N rollout-sized payloads to P, one
                                    stream each, each acknowledged -> `{"sent", "errors", "ms"}`
- `{"cmd": "punch", "peer": P}`     DCUtR now -> `{"direct"}`
- `{"cmd": "stats"}`                received count and bytes, connection kinds, relay and
                                    reachability fields
- `{"cmd": "quit"}`
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import subprocess
import sys
import time

import trio

from node.host.host import FramedStream, HostSettings, PeerError, open_host
from node.host.reachability import open_reachability
from node.host.relay import RelayLimitsConfig, RelayRefused, connection_kinds, open_relay
from node.testing.peer_process import PeerProcess, json_lines, reply

PAYLOAD_PROTOCOL = "/swarm-test/payload/1"
PAYLOAD_DEADLINE_S = 5.0  # one payload: stream open, send, acknowledgement, retries
PAYLOAD_ATTEMPTS = 3


async def _send_one(host, peer: str, payload: bytes) -> None:  # type: ignore[no-untyped-def]
    stream = await host.open_stream(peer, PAYLOAD_PROTOCOL)
    try:
        await stream.send(payload)
        if await stream.receive(16) != b"ok":
            raise PeerError(peer, "no acknowledgement")
    finally:
        await stream.close()


async def _send(host, peer: str, n: int, size: int) -> dict:  # type: ignore[no-untyped-def]
    """N payloads, each retried (as the node's pulls are) until acknowledged or its deadline
    passed; a connection being swapped (relayed for direct) can fail one attempt."""
    sent, retries, errors, ms = 0, 0, [], []
    for seq in range(n):
        t0 = time.monotonic()
        error = f"payload {seq} not acknowledged within {PAYLOAD_DEADLINE_S:g} s"
        with trio.move_on_after(PAYLOAD_DEADLINE_S):
            for attempt in range(PAYLOAD_ATTEMPTS):
                try:
                    await _send_one(host, peer, seq.to_bytes(4, "big") + b"\1" * max(0, size - 4))
                except PeerError as exc:
                    error = str(exc)
                    await trio.sleep(0.2 * (attempt + 1))
                    continue
                error = ""
                sent, retries = sent + 1, retries + attempt
                ms.append((time.monotonic() - t0) * 1000.0)
                break
        if error:
            errors.append(error)
    return {"sent": sent, "retries": retries, "errors": errors[:5], "ms": ms}


async def main(args: argparse.Namespace) -> None:
    """Run the host (a relay server with `--serve-relay`) and answer commands until `quit` or `--max-life`."""
    received = {"count": 0, "bytes": 0}
    serve = (
        RelayLimitsConfig(
            max_reservations=args.max_reservations,
            max_reservations_per_ip=args.max_per_ip,
            max_circuits_per_peer=args.max_circuits,
            max_circuit_bytes=args.max_circuit_bytes,
            max_circuit_s=args.max_circuit_s,
        )
        if args.serve_relay
        else None
    )
    settings = HostSettings(peer_dead_after_s=args.dead_after)
    with trio.move_on_after(args.max_life):
        async with (
            open_host(secrets.token_bytes(32), [args.listen], settings) as host,
            open_relay(host, serve) as relay,
            open_reachability(host) as reach,
        ):

            async def on_payload(stream: FramedStream) -> None:
                data = await stream.receive()
                received["count"] += 1
                received["bytes"] += len(data)
                await stream.send(b"ok")

            host.set_stream_handler(PAYLOAD_PROTOCOL, on_payload)
            reply({"peer_id": host.peer_id, "addrs": host.listen_addrs()})
            async for cmd in json_lines(trio.lowlevel.FdStream(os.dup(0))):
                kind = cmd.get("cmd")
                if kind == "connect":  # a /p2p-circuit address goes through the relay
                    r = await host.connect(cmd["addr"])
                    reply({"ok": r.ok, "peer": r.peer, "error": r.error})
                elif kind == "reach":
                    reply({"reachability": await reach.check(cmd["servers"])})
                elif kind == "reserve":
                    try:
                        reply({"ok": True, "addr": await relay.reserve(cmd["addr"]), "error": None})
                    except (RelayRefused, PeerError) as exc:
                        reply({"ok": False, "addr": None, "error": str(exc)})
                elif kind == "send":
                    reply(await _send(host, cmd["peer"], cmd["n"], cmd["size"]))
                elif kind == "punch":
                    with trio.move_on_after(cmd.get("timeout", 30)):
                        await reach.hole_punch(cmd["peer"])
                    reply({"direct": connection_kinds(host).get(cmd["peer"]) == "direct"})
                elif kind == "stats":
                    reply(
                        {
                            "received": received,
                            "kinds": connection_kinds(host),
                            **relay.stats(),
                            **reach.stats(),
                        }
                    )
                elif kind == "quit":
                    break
    reply({"closed": True})


def cli() -> None:
    """Parse the command line and run `main`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--serve-relay", action="store_true")
    parser.add_argument("--max-reservations", type=int, default=128)
    parser.add_argument("--max-per-ip", type=int, default=8)
    parser.add_argument("--max-circuits", type=int, default=8)
    parser.add_argument("--max-circuit-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--max-circuit-s", type=int, default=1800)
    parser.add_argument("--dead-after", type=float, default=8.0)
    parser.add_argument("--max-life", type=float, default=300.0)
    parser.add_argument(
        "--debug", default="", help="comma-separated logger names to log at DEBUG on stderr"
    )
    args = parser.parse_args()
    if args.debug:
        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        for name in args.debug.split(","):
            logging.getLogger(name).setLevel(logging.DEBUG)
    trio.run(main, args)


async def start_in(ns: str | None, listen: str, *extra: str, stderr_path: str | None = None):  # type: ignore[no-untyped-def]
    """Start a peer process inside network namespace `ns` (None: this one); returns its
    `node.testing.peer_process.PeerProcess` driver (always `stop()` it)."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = await trio.lowlevel.open_process(
            [*prefix, sys.executable, "-m", "node.testing.nat_peer", "--listen", listen, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    finally:
        if not isinstance(err, int):
            err.close()
    peer = PeerProcess(proc)
    try:
        hello = await peer.read(60.0)
    except BaseException:
        await peer.stop(grace=1.0)
        raise
    peer.peer_id, peer.addrs, peer.hello = hello["peer_id"], hello["addrs"], hello
    return peer


if __name__ == "__main__":
    cli()
