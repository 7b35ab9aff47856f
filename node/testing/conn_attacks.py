"""The connection and GossipSub-control attacks of `bench adversary`, run by
the bench's driver process against one real peer process (the trainer) from plain
py-libp2p hosts (the driver can look at the target between an attack's phases).

Each attack writes what a hostile standard peer can write: connections from fresh
identities, raw GossipSub RPCs (varint-prefixed `rpc_pb2.RPC` on `/meshsub/1.1.0`, as
tests/test_node_gossip_guard.py does), and gossip messages signed with a key we hold.
`conn_attack(cmd, manifest)` answers `{"sent", "rejected", "ids", ...}`: how many
connections or messages went out, how many had no effect that the attacker itself can
see (a refused or closed connection, a write that failed), the peer ids to look up in
the target's score table, and per-case details. `honest_probe(addr)` is the honest peer
that comes afterwards: a fresh identity that connects, pings (`/ipfs/ping/1.0.0`) and
opens a GossipSub stream and reads the target's subscriptions.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import PUBSUB_SIGNING_PREFIX  # pyright: ignore[reportPrivateImportUsage]
from libp2p.utils.varint import encode_uvarint

from node.host.gossip_guard import ControlLimits
from node.host.host import PeerError, key_pair_from_private_bytes, open_host
from node.peer.gossip import topic_name
from node.testing.adversary_records import honest_record
from protocol.codec import decode
from protocol.identity import Identity
from protocol.wire import RolloutRecord

MESHSUB = "/meshsub/1.1.0"
PING = "/ipfs/ping/1.0.0"


@contextlib.asynccontextmanager
async def _plain(key_pair: Any = None) -> AsyncIterator[Any]:
    """A plain py-libp2p host (no listener) with a fresh identity or `key_pair`."""
    host = new_host(key_pair=key_pair or create_new_key_pair())
    async with host.run([]):
        try:
            yield host
        finally:
            with trio.move_on_after(2) as cs:
                cs.shield = True
                with contextlib.suppress(Exception):
                    await host.close()


def _frame(rpc: rpc_pb2.RPC) -> bytes:
    data = rpc.SerializeToString()
    return encode_uvarint(len(data)) + data


def _connected(host: Any, peer: Any) -> bool:
    return bool(host.get_network().get_connections(peer))


async def honest_probe(addr: str, topic: str, timeout: float = 10.0) -> dict[str, Any]:
    """A fresh honest peer (the node's own host, `node.host.host.open_host`, new key):
    connect, ping (`/ipfs/ping/1.0.0`, 32 bytes echoed) and see the target in the
    GossipSub peers of `topic` (subscriptions exchanged both ways). `ok` when all of it
    worked within `timeout`."""
    out: dict[str, Any] = {"ok": False, "connected": False, "ping": False, "gossip": False}
    start = time.monotonic()
    try:
        with trio.fail_after(timeout):
            async with open_host(secrets.token_bytes(32), ["/ip4/127.0.0.1/tcp/0"]) as host:
                await host.subscribe(topic)
                dial = await host.connect(addr)
                out["connected"] = dial.ok
                if not dial.ok:
                    out["error"] = dial.error
                    return out
                assert dial.peer is not None
                stream = await host.open_stream(dial.peer, PING)
                payload = os.urandom(32)
                await stream.write_raw(payload)
                try:
                    echo = await stream.read_exactly(32)
                except PeerError:  # closed before the whole echo came back
                    echo = b""
                out["ping"] = echo == payload
                await stream.close()
                out["gossip"] = await host.wait_for_topic_peers(topic, 1, timeout) >= 1
                out["ok"] = out["ping"] and out["gossip"]
    except Exception as exc:  # noqa: BLE001 - the probe's failure is the finding
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    out["elapsed_s"] = round(time.monotonic() - start, 2)
    return out


async def _one_connection(
    info: Any, hold: trio.Event | None, result: dict[str, int], deadline_s: float = 10.0
) -> None:
    """Connect from a fresh identity; hold until `hold` is set (then note whether the
    target still keeps it), or close at once."""
    try:
        with trio.fail_after(deadline_s):
            async with _plain() as host:
                await host.connect(info)
                result["accepted"] += 1
                if hold is not None:
                    await hold.wait()
                    await trio.sleep(0)
                    if _connected(host, info.peer_id):
                        result["kept"] += 1
                    else:
                        result["closed_by_target"] += 1
    except Exception:  # noqa: BLE001 - refused, reset or timed out: the target said no
        result["refused"] += 1


async def _connection_churn(cmd: dict[str, Any], _m: Any) -> dict[str, Any]:
    info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["target"]))
    n = int(cmd["count"])
    lanes = max(1, min(n, int(cmd.get("lanes", 8))))
    result = {"accepted": 0, "refused": 0, "kept": 0, "closed_by_target": 0}
    start = time.monotonic()

    async def lane(k: int) -> None:
        # py-libp2p's dialer spends ~0.45 s per connection in fixed sleeps (dial and
        # close), so the sequence runs in a few lanes: at most `lanes` open at once.
        for _ in range(k):
            await _one_connection(info, None, result)

    async with trio.open_nursery() as nursery:
        for i in range(lanes):
            nursery.start_soon(lane, n // lanes + (i < n % lanes))
    return {
        "sent": n,
        "rejected": result["refused"],
        "ids": [],
        **result,
        "lanes": lanes,
        "elapsed_s": round(time.monotonic() - start, 1),
    }


async def _connection_flood(cmd: dict[str, Any], _m: Any) -> dict[str, Any]:
    info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["target"]))
    n = int(cmd["count"])
    result = {"accepted": 0, "refused": 0, "kept": 0, "closed_by_target": 0}
    hold = trio.Event()
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(_one_connection, info, hold, result, 60.0)
        # Every connection either done or refused, then hold a moment so the target
        # has time to close its excess.
        with trio.move_on_after(45):
            while result["accepted"] + result["refused"] < n:
                await trio.sleep(0.1)
        await trio.sleep(float(cmd.get("hold_s", 3.0)))
        hold.set()
    return {
        "sent": n,
        "rejected": result["refused"] + result["closed_by_target"],
        "ids": [],
        **result,
        "elapsed_s": round(time.monotonic() - start, 1),
    }


def _signed_message(key_pair: Any, topic: str, data: bytes, seqno: int) -> rpc_pb2.Message:
    """A GossipSub message published by `key_pair`'s peer (strict signing)."""
    msg = rpc_pb2.Message(
        data=data,
        topicIDs=[topic],
        from_id=ID.from_pubkey(key_pair.public_key).to_bytes(),
        seqno=seqno.to_bytes(8, "big"),
    )
    msg.signature = key_pair.private_key.sign(
        PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
    )
    msg.key = key_pair.public_key.serialize()
    return msg


async def _gossip_stream(host: Any, info: Any, topic: str) -> Any:
    await host.connect(info)
    stream = await host.new_stream(info.peer_id, [MESHSUB])
    rpc = rpc_pb2.RPC()
    sub = rpc.subscriptions.add()
    sub.subscribe, sub.topicid = True, topic
    await stream.write(_frame(rpc))
    return stream


async def _relay_copy_quota(cmd: dict[str, Any], m: Any) -> dict[str, Any]:
    """A relay R forwards an honest worker W's headers as W published them (origin W,
    signed by W): first more than W's signer burst (the target admits them until W is
    over its quota), then copies of W's next headers while W is over it (refused,
    `rate_limited`). Once the quota has refilled W's own copies of those headers arrive
    on W's own connection. The honest worker must pay nothing for them."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["target"]))
    topic = topic_name(m.run_id, "rollouts")
    worker = Identity.generate()
    w_keys = key_pair_from_private_bytes(worker.private_bytes())
    rng = random.Random(os.urandom(16))
    n_drain, n_copies = int(cmd.get("drain", 140)), int(cmd.get("copies", 10))
    headers = [
        decode(RolloutRecord, honest_record(worker, m, i, i, rng=rng)).header
        for i in range(1, n_drain + n_copies + 1)
    ]
    msgs = [_signed_message(w_keys, topic, h, i) for i, h in enumerate(headers, 1)]
    drain, copies = msgs[:n_drain], msgs[n_drain:]
    s = worker.peer_id_b58
    out: dict[str, Any] = {"signer": s, "sent": n_copies, "rejected": 0}
    probe = cmd["_probe"]  # the driver's look at the target (scores, admitted counts)
    async with _plain(w_keys) as w_host, _plain() as r_host:
        out["ids"] = [r_host.get_id().to_base58()]
        w_stream = await _gossip_stream(w_host, info, topic)
        r_stream = await _gossip_stream(r_host, info, topic)
        await trio.sleep(0.5)
        before = await probe([s])
        rpc = rpc_pb2.RPC()
        rpc.publish.extend(drain)
        await r_stream.write(_frame(rpc))  # W's headers by the relay: W over its quota
        rpc = rpc_pb2.RPC()
        rpc.publish.extend(copies)
        await r_stream.write(_frame(rpc))  # copies of W's next ones: refused, over quota
        await trio.sleep(1.0)
        after_relay = await probe([s, *out["ids"]])
        relay_admitted = after_relay["admitted"][s]
        out["rejected"] = n_drain + n_copies - relay_admitted
        await trio.sleep(3.0)  # the quota refills (signer_rate per second)
        own = []
        for msg in copies:  # W's own copies: the same headers, W's own gossip messages
            own.append(_signed_message(w_keys, topic, msg.data, 10_000 + len(own)))
        rpc = rpc_pb2.RPC()
        rpc.publish.extend(own)
        await w_stream.write(_frame(rpc))
        await trio.sleep(1.0)
        after_own = await probe([s])
    out["refusals_relay_phase"] = _delta(before["refused"], after_relay["refused"])
    out["refusals_own_phase"] = _delta(after_relay["refused"], after_own["refused"])
    out.update(
        relay_forwarded=n_drain + n_copies,
        relay_admitted=relay_admitted,
        own_copies_admitted=after_own["admitted"][s] - relay_admitted,
        signer_score_before_own=round(after_relay["scores"][s], 3),
        signer_score_after_own=round(after_own["scores"][s], 3),
    )
    out["sent"] = n_drain + n_copies
    return out


async def _gossip_control_abuse(cmd: dict[str, Any], m: Any) -> dict[str, Any]:
    """Junk topic subscriptions, GRAFT/PRUNE and IHAVE floods on one GossipSub stream
    from one fresh identity, as fast as the stream takes them."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["target"]))
    topic = topic_name(m.run_id, "rollouts")
    n_topics, n_graft = int(cmd["topics"]), int(cmd["graft_prune"])
    n_ihave, ihave_ids = int(cmd["ihave"]), int(cmd.get("ihave_ids", 5000))
    sent = {"topics": 0, "graft_prune": 0, "ihave_ids": 0}
    failed_writes = 0
    start = time.monotonic()
    rpcs: list[tuple[str, int, rpc_pb2.RPC]] = []
    for lo in range(0, n_topics, 5000):
        rpc = rpc_pb2.RPC()
        for i in range(lo, min(n_topics, lo + 5000)):
            sub = rpc.subscriptions.add()
            sub.subscribe, sub.topicid = True, f"junk-{i}"
        rpcs.append(("topics", len(rpc.subscriptions), rpc))
    for lo in range(0, n_graft, 500):
        rpc = rpc_pb2.RPC()
        for i in range(lo, min(n_graft, lo + 500)):
            if i % 2:
                rpc.control.prune.add().topicID = topic
            else:
                rpc.control.graft.add().topicID = topic
        rpcs.append(("graft_prune", min(n_graft, lo + 500) - lo, rpc))
    for _ in range(n_ihave):
        rpc = rpc_pb2.RPC()
        entry = rpc.control.ihave.add()
        entry.topicID = topic
        entry.messageIDs.extend(os.urandom(20) for _ in range(ihave_ids))
        rpcs.append(("ihave_ids", ihave_ids, rpc))
    random.Random(0).shuffle(rpcs)  # interleaved, as a real abuser would
    async with _plain() as host:
        ident = host.get_id().to_base58()
        try:
            stream = await _gossip_stream(host, info, topic)
        except Exception:  # noqa: BLE001
            stream = None
        for kind, n, rpc in rpcs:
            if stream is None:
                failed_writes += n
                continue
            try:
                with trio.fail_after(10):
                    await stream.write(_frame(rpc))
                sent[kind] += n
            except Exception:  # noqa: BLE001 - the target closed or reset the stream
                failed_writes += n
                stream = None
        await trio.sleep(1.0)
        still = _connected(host, info.peer_id)
    elapsed = time.monotonic() - start
    # What the guard lets through at most (per-peer budgets per window, node.host.gossip_guard
    # defaults): the rest is dropped before the library sees it.
    lim = ControlLimits()
    windows = max(1, math.ceil(elapsed / lim.window_s))
    allowed = (
        min(sent["topics"], lim.max_topics)
        + min(sent["graft_prune"], lim.max_graft_prune * windows)
        + min(sent["ihave_ids"], lim.max_ihave_ids * windows)
    )
    total = sum(sent.values()) + failed_writes
    return {
        "sent": total,
        "rejected": total - allowed,
        "ids": [ident],
        "delivered": sent,
        "failed_writes": failed_writes,
        "still_connected": still,
        "elapsed_s": round(elapsed, 1),
    }


async def _oversize_library_drop(cmd: dict[str, Any], m: Any) -> dict[str, Any]:
    """A 1.5 MB gossip RPC (over the library's 1 MiB limit), `count` times, each on a
    new GossipSub stream (the library drops the stream with the RPC)."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["target"]))
    topic = topic_name(m.run_id, "rollouts")
    n = int(cmd.get("oversize", 3))
    keys = create_new_key_pair()
    rejected = 0
    async with _plain(keys) as host:
        ident = host.get_id().to_base58()
        for i in range(n):
            rpc = rpc_pb2.RPC()
            rpc.publish.append(_signed_message(keys, topic, os.urandom(1_500_000), i + 1))
            try:
                with trio.fail_after(10):
                    stream = await _gossip_stream(host, info, topic)
                    await stream.write(_frame(rpc))
                    got = await stream.read(65536)
                    while got:  # until the target drops the stream
                        got = await stream.read(65536)
            except Exception:  # noqa: BLE001
                pass
            rejected += 1  # a 1.5 MB message never passes the library's 1 MiB limit
            await trio.sleep(0.2)
    return {"sent": n, "rejected": rejected, "ids": [ident]}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {r: n - before.get(r, 0) for r, n in sorted(after.items()) if n > before.get(r, 0)}


CONN_ATTACKS = {
    "connection_churn": _connection_churn,
    "connection_flood": _connection_flood,
    "relay_copy_quota": _relay_copy_quota,
    "gossip_control_abuse": _gossip_control_abuse,
    "oversize_library_drop": _oversize_library_drop,
}


async def conn_attack(cmd: dict[str, Any], manifest: Any, probe: Any) -> dict[str, Any]:
    """Run `CONN_ATTACKS[cmd["name"]]`; `probe(ids)` asks the driver about the target."""
    return await CONN_ATTACKS[cmd["name"]]({**cmd, "_probe": probe}, manifest)
