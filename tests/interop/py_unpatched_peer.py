"""An unpatched py-libp2p peer for tests/test_node_interop.py.

Imports `libp2p` only (never `node.*`, so none of `node.host.libp2p_patches` is applied) and
runs the library's defaults: `new_host()` and GossipSub as constructed in its docs.
Usage: python py_unpatched_peer.py <our multiaddr with /p2p/> <topic> <seconds>
Dials the node, reads its identify answer, pings it every 2 s, follows <topic> and
publishes one message there every 2 s, for <seconds>; reports JSON lines on stdout.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.host.ping import PingService
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def read_identify(host: Any, peer_id: Any) -> bytes:
    stream = await host.new_stream(peer_id, [IDENTIFY])
    data = b""
    with trio.move_on_after(5):
        for _ in range(64):
            try:
                chunk = await stream.read(65536)
            except Exception:  # the library ends the answer by raising
                break
            if not chunk:
                break
            data += chunk
    return data


async def main(target: str, topic: str, seconds: float) -> None:
    assert not any(name.startswith("node") for name in sys.modules), "must run unpatched"
    host = new_host(key_pair=create_new_key_pair())
    gossipsub = GossipSub(protocols=["/meshsub/1.0.0"], degree=6, degree_low=4, degree_high=12)
    pubsub = Pubsub(host, gossipsub)
    info = info_from_p2p_addr(multiaddr.Multiaddr(target))
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            await pubsub.wait_until_ready()
            say("started", peer=host.get_id().to_base58())
            subscription = await pubsub.subscribe(topic)
            with trio.fail_after(15):
                await host.connect(info)
            say("connected", peer=info.peer_id.to_base58())
            raw = await read_identify(host, info.peer_id)
            agent = re.search(rb"swarm-node/[0-9A-Za-z.+-]*", raw)
            protocols = [p.decode() for p in re.findall(rb"/[a-z0-9/._-]+", raw)]
            say(
                "identify",
                peer=info.peer_id.to_base58(),
                agent=agent.group().decode() if agent else raw[:80].hex(),
                protocols=protocols,
            )

            async def follow() -> None:
                while True:
                    msg = await subscription.get()
                    say(
                        "message",
                        data=bytes(msg.data).decode(errors="replace"),
                        **{"from": bytes(msg.from_id) and _b58(bytes(msg.from_id))},
                    )

            ping = PingService(host)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                end = trio.current_time() + seconds
                n = 0
                while trio.current_time() < end:
                    try:
                        with trio.fail_after(5):
                            rtts = await ping.ping(info.peer_id, 1)
                        say("ping", rtt=rtts[0] if rtts else None)
                    except Exception as exc:
                        say("ping_failed", error=repr(exc))
                    try:
                        await pubsub.publish(topic, f"peer {n}".encode())
                        say("published", n=n)
                        n += 1
                    except Exception as exc:
                        say("publish_failed", error=repr(exc))
                    await trio.sleep(2.0)
                say("done", published=n)
                nursery.cancel_scope.cancel()
            await host.close()


def _b58(raw: bytes) -> str:
    from libp2p.peer.id import ID

    return ID(raw).to_base58()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
