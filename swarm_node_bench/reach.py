"""`swarm-node bench reach`: peers behind NAT on an emulated network (`node.testing.netlab`:
namespaces, veth, iptables MASQUERADE; needs root and iptables).

Public segment: a bootstrap + relay host (relay service with limits), a trainer and a
validator. Behind NAT: two workers behind cone NATs, one behind the symmetric variant.
The peers are `node.testing.nat_peer` processes (a `SwarmHost` with circuit relay v2, AutoNAT
and DCUtR), not the full role stack: a "rollout" is a payload of rollout size sent on a
stream and acknowledged by the receiver. Then, without `--quick` (or with `--full-join`),
on a fresh emulated network, one worker of the full role stack (`node.testing.reach_join`:
real `swarm-node start` relay, trainer and validator of a small untrained policy):

    join_s                 per light worker ("cone-0", ...): process start -> AutoNAT
                           verdict, relay slot, the trainer dialing the relayed address,
                           first payload acknowledged by the trainer; "cone-full": a full
                           `swarm-node start --role inference --join` behind a cone NAT,
                           from its start to the validator's first passed audit of its
                           rollouts (`join_s_measures` in the output says which were run)
    natted_delivery_ratio  payloads the workers sent that the trainer acknowledged / sent
    direct_upgrade_ratio   per NAT kind: pairs (worker-trainer, worker-validator,
                           worker-worker; "symmetric" when either end is behind it) on a
                           direct connection after DCUtR had `--settle` seconds / all
    relay_bytes_ratio      payload bytes sent over relayed connections / all payload bytes
                           (each worker sends to the trainer, the validator and the others)
    relayed_gossip_p50_ms  median payload round trip (send -> acknowledgement) over a
                           relayed connection; a stream exchange, not a GossipSub message
    relay_limits_held      a flood (one peer re-reserving and opening circuits in a loop,
                           then new identities asking for slots) left the relay at or
                           under its reservation and circuit limits, newcomers refused,
                           and the honest workers still delivering everything through it

`--quick`: fewer payloads and a shorter settle time, no full-stack join (`--full-join`
adds it, 30-60 s more). `--hostile` adds a `hostile` section: the join path under attack
(`swarm_node_bench.parts.reach_hostile`: DCUtR amplification, AutoNAT liars, the relay's per-IP
cap under concurrency, conflicting authorities, a bad bootstrap at restart, slow peers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from node.testing.nat_peer import start_in
from node.testing.netlab import PUBLIC_IP, NetLab, unavailable
from node.testing.reach_join import FullStack

PAYLOAD_BYTES = 20_000
KINDS = ("cone", "cone", "symmetric")
MAX_CIRCUITS = 4
LIGHT_JOIN = (
    "cone-0, cone-1, symmetric-2: light peers (node.testing.nat_peer), start -> first payload "
    "acknowledged by the trainer"
)
FULL_JOIN = (
    "cone-full: swarm-node start --role inference --join behind a cone NAT, start -> the "
    "validator's first passed audit of its rollouts"
)


def _name(peer: Any) -> str:
    return f"{peer.kind}{peer.index}" if hasattr(peer, "index") else peer.kind


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _join(
    lab: NetLab,
    ns: str,
    relay: Any,
    trainer: Any,
    trainer_lock: trio.Lock,
    t0: float,
    out: dict[str, Any],
) -> Any:
    w = await start_in(ns, f"/ip4/{lab.host_ip(ns)}/tcp/4100")
    out["peers"].append(w)
    await w.ask({"cmd": "connect", "addr": relay.addrs[0]})
    await w.ask({"cmd": "reach", "servers": [relay.peer_id]}, timeout=40)
    slot = await w.ask({"cmd": "reserve", "addr": relay.addrs[0]})
    if not slot["ok"]:
        raise RuntimeError(f"worker could not reserve a relay slot: {slot['error']}")
    w.relayed = slot["addr"]
    async with trainer_lock:  # one command at a time per peer process
        await trainer.ask({"cmd": "connect", "addr": w.relayed})
    first = await w.ask({"cmd": "send", "peer": trainer.peer_id, "n": 1, "size": PAYLOAD_BYTES})
    if first["sent"] != 1:
        raise RuntimeError(f"first payload not delivered: {first['errors']}")
    w.join_s = time.monotonic() - t0
    return w


async def _flood(
    lab: NetLab,
    relay: Any,
    victim: Any,
    max_reservations: int,
    max_circuits: int,
    out: dict[str, Any],
) -> bool:
    flooder = await start_in(lab.wan, f"/ip4/{PUBLIC_IP}/tcp/4200")
    out["peers"].append(flooder)
    for _ in range(10):
        await flooder.ask({"cmd": "reserve", "addr": relay.addrs[0]})
        await flooder.ask({"cmd": "connect", "addr": victim.relayed})
    newcomers: list[bool] = []

    async def newcomer(port: int) -> None:
        p = await start_in(lab.wan, f"/ip4/{PUBLIC_IP}/tcp/{port}")
        out["peers"].append(p)
        newcomers.append((await p.ask({"cmd": "reserve", "addr": relay.addrs[0]}))["ok"])

    async with trio.open_nursery() as nursery:
        for port in range(4201, 4201 + max_reservations):
            nursery.start_soon(newcomer, port)
    stats = await relay.ask({"cmd": "stats"})
    return (
        stats["relay_reservations"] <= max_reservations
        and not all(newcomers)
        and stats["relay_circuits"] <= max_circuits * max_reservations
    )


async def _main(opts: argparse.Namespace) -> dict[str, Any]:
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"bench reach needs an emulated network: {reason}")
    out: dict[str, Any] = {"peers": []}
    max_res = len(KINDS) + 2
    with NetLab() as lab:
        try:
            relay = await start_in(
                lab.wan,
                f"/ip4/{PUBLIC_IP}/tcp/4001",
                "--serve-relay",
                "--max-reservations",
                str(max_res),
                "--max-circuits",
                str(MAX_CIRCUITS),
            )
            out["peers"].append(relay)
            trainer = await start_in(lab.wan, f"/ip4/{PUBLIC_IP}/tcp/4002")
            validator = await start_in(lab.wan, f"/ip4/{PUBLIC_IP}/tcp/4003")
            out["peers"] += [trainer, validator]
            for p in (trainer, validator):
                await p.ask({"cmd": "connect", "addr": relay.addrs[0]})
            _say(f"joining workers behind NATs: {', '.join(KINDS)}")
            namespaces = [lab.add_nat(kind) for kind in KINDS]
            workers: list[Any] = [None] * len(KINDS)
            trainer_lock = trio.Lock()

            async def join(i: int) -> None:
                workers[i] = await _join(
                    lab, namespaces[i], relay, trainer, trainer_lock, time.monotonic(), out
                )
                workers[i].kind, workers[i].index = KINDS[i], i

            async with trio.open_nursery() as nursery:
                for i in range(len(KINDS)):
                    nursery.start_soon(join, i)
            for w in workers:
                await validator.ask({"cmd": "connect", "addr": w.relayed})
            for a, b in (
                (workers[0], workers[1]),
                (workers[0], workers[2]),
                (workers[1], workers[2]),
            ):
                await a.ask({"cmd": "connect", "addr": b.relayed})
            _say("letting DCUtR try the upgrades")
            await trio.sleep(opts.settle)
            t = await _send_all(workers, trainer, validator, opts.payloads)
            sent, acked, relayed_bytes, all_bytes = (
                t["sent"],
                t["acked"],
                t["relayed_bytes"],
                t["all_bytes"],
            )
            relayed_ms, errors, retries = t["relayed_ms"], t["errors"], t["retries"]
            trainer.kind, validator.kind = "trainer", "validator"
            upgrade, pairs = await _connection_kinds(workers, [trainer, validator])
            _say("flooding the relay")
            held = await _flood(lab, relay, workers[0], max_res, MAX_CIRCUITS, out)
            after = [
                await w.ask({"cmd": "send", "peer": trainer.peer_id, "n": 3, "size": PAYLOAD_BYTES})
                for w in workers
            ]
            held = held and all(r["sent"] == 3 for r in after)
        finally:
            # pyright reads trio's `cancelled_caught` (an attrs field, init=False) as required
            with trio.CancelScope(shield=True):  # pyright: ignore[reportCallIssue]
                async with trio.open_nursery() as nursery:
                    for p in out["peers"]:
                        nursery.start_soon(p.stop)
    join_s = {f"{w.kind}-{i}": round(w.join_s, 3) for i, w in enumerate(workers)}
    measures = LIGHT_JOIN
    if opts.full_join:
        _say("a full-stack worker joining from behind a cone NAT")
        join_s["cone-full"] = round(await trio.to_thread.run_sync(_full_join), 3)
        measures += "; " + FULL_JOIN
    return {
        "join_s": join_s,
        "join_s_measures": measures,
        "natted_delivery_ratio": acked / sent if sent else 0.0,
        "direct_upgrade_ratio": {k: sum(v) / len(v) for k, v in upgrade.items()},
        "relay_bytes_ratio": relayed_bytes / all_bytes if all_bytes else 0.0,
        "relayed_gossip_p50_ms": round(statistics.median(relayed_ms), 2) if relayed_ms else None,
        "relay_limits_held": held,
        "pairs": pairs,
        "send_errors": errors[:5],
        "send_retries": retries,
        "payloads_per_worker": opts.payloads,
        "payload_bytes": PAYLOAD_BYTES,
        "peers": "light (node.testing.nat_peer), not the full role stack, except join_s's cone-full",
    }


def _full_join() -> float:
    """`node.testing.reach_join`: one full-stack worker's join, on a fresh emulated network."""

    with tempfile.TemporaryDirectory(prefix="bench-reach-") as tmp, NetLab() as lab:
        stack = FullStack(lab, Path(tmp))
        try:
            home = lab.add_nat("cone")
            stack.start_public()
            return stack.join(home)
        finally:
            stack.close()


async def _send_all(
    workers: list[Any], trainer: Any, validator: Any, payloads: int
) -> dict[str, Any]:
    """Each worker sends `payloads` payloads to every other peer; what arrived, by path."""
    t: dict[str, Any] = {
        "sent": 0,
        "acked": 0,
        "relayed_bytes": 0,
        "all_bytes": 0,
        "relayed_ms": [],
        "errors": [],
        "retries": 0,
    }
    for w in workers:
        kinds = (await w.ask({"cmd": "stats"}))["kinds"]
        for target in (trainer, validator, *[o for o in workers if o is not w]):
            r = await w.ask(
                {"cmd": "send", "peer": target.peer_id, "n": payloads, "size": PAYLOAD_BYTES},
                timeout=30 + 5 * payloads,
            )
            t["errors"] += r["errors"]
            t["retries"] += r["retries"]
            if target is trainer:
                t["sent"] += payloads
                t["acked"] += r["sent"]
            t["all_bytes"] += r["sent"] * PAYLOAD_BYTES
            if kinds.get(target.peer_id) == "relayed":
                t["relayed_bytes"] += r["sent"] * PAYLOAD_BYTES
                t["relayed_ms"] += r["ms"]
    return t


async def _connection_kinds(
    workers: list[Any], public: list[Any]
) -> tuple[dict[str, list[bool]], list[str]]:
    """Per NAT kind, whether each pair a worker is in ended direct; and each pair's path.
    A pair's kind is "symmetric" when either end is behind the symmetric NAT."""
    upgrade: dict[str, list[bool]] = {}
    seen: set[frozenset[str]] = set()
    pairs: list[str] = []
    for w in workers:
        kinds = (await w.ask({"cmd": "stats"}))["kinds"]
        for p in (*public, *workers):
            pair = frozenset((w.peer_id, p.peer_id))
            if p is w or pair in seen or p.peer_id not in kinds:
                continue
            seen.add(pair)
            kind = "symmetric" if "symmetric" in (w.kind, getattr(p, "kind", "")) else "cone"
            upgrade.setdefault(kind, []).append(kinds[p.peer_id] == "direct")
            pairs.append(f"{_name(w)}-{_name(p)}:{kinds[p.peer_id]}")
    return upgrade, pairs


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments as in the module docstring); returns its figures."""
    parser = argparse.ArgumentParser(prog="swarm-node bench reach")
    parser.add_argument("--payloads", type=int, default=None, help="per worker and target")
    parser.add_argument("--settle", type=float, default=None, help="seconds for DCUtR")
    parser.add_argument(
        "--full-join",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time a full-stack worker's join (default: on, off with --quick)",
    )
    parser.add_argument(
        "--hostile", action="store_true", help="add the hostile section (the join path attacked)"
    )
    opts = parser.parse_args(args)
    opts.full_join = not quick if opts.full_join is None else opts.full_join
    opts.payloads = opts.payloads or (10 if quick else 200)
    opts.settle = opts.settle or (10.0 if quick else 20.0)
    result = trio.run(_main, opts)
    if opts.hostile:
        from swarm_node_bench.parts.reach_hostile import run_hostile  # deferred: heavy import

        _say("hostile cases: DCUtR flood, AutoNAT liars, relay per-IP cap, joins, slow peers")
        result["hostile"] = run_hostile()
    return result
