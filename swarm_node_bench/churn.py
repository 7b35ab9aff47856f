"""`swarm-node bench churn`: delivery under crashes and restarts.

Real processes on loopback (`node.testing.net_peer`: the full peer, py-libp2p, SQLite):
a trainer and a validator (both pull bodies) and two workers producing signed synthetic
records (well-formed, not model output: this measures delivery, not generation) at
`--rate` per second each. Each trial waits a random moment, SIGKILLs a random role (or a
worker and the trainer together), checks the victim's store on disk, and restarts it on
the same port, data directory and key, at once or after a random delay. After the last
trial the workers stop producing and the trainer gets `--drain` seconds to catch up; then
every store is read directly.

Figures (the JSON keys of the result):
    trials, produced (workers' own ledgers), delivered (bodies the trainer holds, after the
    drain), too_stale (accounted by the workers, with reason), silently_lost = produced -
    delivered - too_stale, delivery_ratio = delivered / (produced - too_stale),
    records_lost (ids a store listed before a kill and lacks after the restart),
    corrupt_loads (stores failing `PRAGMA quick_check` or refusing to open after a kill),
    duplicate_counters ((producer, counter) pairs held twice by the trainer),
    refetched_known (bodies the trainer admitted again while it held them: ledger lines),
    restart_s_p50 (spawn to listening), catch_up_s_p50 (restarted victims listening to
    the trainer holding every rollout the workers held then; trials that killed the
    trainer or a worker; `catch_up_incomplete` counts those not done within the bound),
    worker_status (each worker's own produced / delivered / pending / too_stale).

`--quick`: 2 trials (about a minute here; each restart costs a process start, several
seconds on a loaded 2-core machine). Full: 100 trials. Options after the name:
`--trials N`, `--rate R` (4), `--drain S` (quick 20, full 90), `--seed N`, `--keep` (keep
the stores and logs; `SWARM_LOG=INFO` adds peer events and pull failures to the logs).
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from node.console import sayer
from node.store.store import DB_FILENAME, Store
from node.testing.peer_process import PeerProcess
from protocol.rollout import open_header

ROLES = ("trainer", "validator", "w1", "w2")
WORKERS = ("w1", "w2")
CATCH_UP_BOUND_S = 30.0
# A SIGKILLed peer's connections are reset by the kernel at once; the heartbeat bound only
# decides how soon a *slow* peer is dropped, and on a loaded 2-core machine (event loops
# late by a second or more) 4 s drops live peers again and again.
DEAD_AFTER_S = 10.0


_say = sayer("bench churn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Node:
    def __init__(self, name: str, root: Path, run: str) -> None:
        self.name, self.run = name, run
        self.dir = root / name
        self.key = random.randbytes(32).hex()
        self.port = _free_port()
        self.proc: PeerProcess | None = None
        self.addr = ""

    @property
    def running(self) -> PeerProcess:
        """The peer process, which `start` has started."""
        assert self.proc is not None
        return self.proc

    def args(self, bootstrap: list[str]) -> list[str]:
        role = "inference" if self.name in WORKERS else self.name
        out = [
            "--data-dir",
            str(self.dir),
            "--run",
            self.run,
            "--key",
            self.key,
            "--listen",
            f"/ip4/127.0.0.1/tcp/{self.port}",
            "--role",
            role,
            "--dead-after",
            str(DEAD_AFTER_S),
            "--max-life",
            "3600",
        ]
        if self.name in WORKERS:
            out.append("--no-pull")
        if bootstrap:
            out += ["--bootstrap", *bootstrap]
        return out

    async def start(self, bootstrap: list[str], log: Path) -> float:
        t0 = time.monotonic()
        self.proc = await PeerProcess.start(
            *self.args(bootstrap), module="node.testing.net_peer", stderr_path=str(log), timeout=90
        )
        self.addr = self.proc.addrs[0]
        return time.monotonic() - t0

    async def ids(self) -> set[str]:
        assert self.proc is not None
        return set((await self.proc.ask({"cmd": "ids"}, timeout=60))["ids"])


def _store_ok(data_dir: Path) -> bool:
    try:
        conn = sqlite3.connect(data_dir / DB_FILENAME)
        try:
            return conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _final_figures(nodes: dict[str, _Node]) -> dict[str, Any]:
    produced: set[bytes] = set()
    too_stale = 0
    for w in WORKERS:
        with Store.open(nodes[w].dir) as s:
            rows = s.ledger(direction="out", outcome="produced", kind="rollout", limit=10_000_000)
            produced |= {r.item_id for r in rows if r.item_id}
            too_stale += s.delivery_status()["too_stale"]
    with Store.open(nodes["trainer"].dir) as s:
        held = s.bodies_held(produced)
        counters: dict[tuple[bytes, int], int] = {}
        for row in s.rollouts(with_body=True, limit=10_000_000):
            _env, header, _rid = open_header(row.header)
            key = (bytes(row.producer), header.counter)  # pyright: ignore[reportArgumentType]
            counters[key] = counters.get(key, 0) + 1
        lines: dict[bytes | None, int] = {}
        for e in s.ledger(
            direction="in", outcome="accepted", kind="rollout_record", limit=10_000_000
        ):
            lines[e.item_id] = lines.get(e.item_id, 0) + 1
    delivered = len(held)
    usable = len(produced) - too_stale
    return {
        "produced": len(produced),
        "delivered": delivered,
        "too_stale": too_stale,
        "silently_lost": len(produced) - delivered - too_stale,
        "delivery_ratio": round(delivered / usable, 5) if usable else None,
        "duplicate_counters": sum(n - 1 for n in counters.values() if n > 1),
        "refetched_known": sum(n - 1 for n in lines.values() if n > 1),
    }


async def _catch_up(
    nodes: dict[str, _Node], started: float, bound_s: float = CATCH_UP_BOUND_S
) -> float | None:
    """Seconds from `started` until the trainer holds every body the workers hold now."""
    target: set[str] = set()
    for w in WORKERS:
        target |= await nodes[w].ids()
    deadline = time.monotonic() + bound_s
    # No cancel scope around a question: one cut mid-answer would put the line protocol
    # out of step.
    while missing := target - await nodes["trainer"].ids():
        if time.monotonic() > deadline:
            break
        await trio.sleep(0.25)
    else:
        return time.monotonic() - started
    _say(f"catch-up: the trainer still lacks {len(missing)} of {len(target)} after {bound_s:g} s")
    stats = await nodes["trainer"].running.ask({"cmd": "stats"}, timeout=60)
    connected = set(stats.get("connected", ()))
    links = {n: nodes[n].running.peer_id in connected for n in ROLES[1:] if nodes[n].proc}
    _say(f"trainer counters: {stats.get('counters')}; connected to {links}")
    return None


async def _main(opts: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(opts.seed)
    root = Path(tempfile.mkdtemp(prefix="swarm-churn-"))
    run = f"churn-{rng.randrange(1 << 30)}"
    nodes = {n: _Node(n, root, run) for n in ROLES}
    logs = root / "logs"
    logs.mkdir()
    restarts: list[float] = []
    catch_ups: list[float] = []
    records_lost = corrupt = 0
    trials = incomplete = 0
    try:
        await nodes["trainer"].start([], logs / "trainer.log")
        async with trio.open_nursery() as nursery:
            for n in ROLES[1:]:
                nursery.start_soon(nodes[n].start, [nodes["trainer"].addr], logs / f"{n}.log")
        for w in WORKERS:
            await nodes[w].running.ask(
                {"cmd": "produce", "n": 10**7, "rate": opts.rate, "size": 256}
            )
        _say(f"4 nodes up under {root}; {opts.trials} trials")
        for trial in range(opts.trials):
            await trio.sleep(rng.uniform(0.5, 2.5))
            victims = (
                [rng.choice(ROLES)] if rng.random() < 0.8 else ["trainer", rng.choice(WORKERS)]
            )
            before = {v: await nodes[v].ids() for v in victims}
            for v in victims:
                nodes[v].running.proc.kill()
                with trio.move_on_after(10):
                    await nodes[v].running.proc.wait()
            corrupt += sum(not _store_ok(nodes[v].dir) for v in victims)
            if rng.random() < 0.5:
                await trio.sleep(rng.uniform(0.5, 3.0))
            others = [nodes[n].addr for n in ROLES if n not in victims]

            async def restart(v: str, others: list[str] = others) -> None:
                restarts.append(await nodes[v].start(others, logs / f"{v}.log"))

            async with trio.open_nursery() as nursery:
                for v in victims:
                    nursery.start_soon(restart, v)
            started = time.monotonic()
            for v in victims:
                if v in WORKERS:
                    await nodes[v].running.ask(
                        {"cmd": "produce", "n": 10**7, "rate": opts.rate, "size": 256}
                    )
            for v in victims:
                records_lost += len(before[v] - await nodes[v].ids())
            if set(victims) & {"trainer", *WORKERS}:
                took = await _catch_up(nodes, started, opts.catch_up_bound)
                if took is not None:
                    catch_ups.append(took)
                else:
                    incomplete += 1
            trials += 1
            _say(f"trial {trial + 1}: killed {'+'.join(victims)}")
        for w in WORKERS:
            await nodes[w].running.ask({"cmd": "stop"})
        drained = await _catch_up(nodes, time.monotonic(), opts.drain)
        _say(f"final drain: {'not complete' if drained is None else f'done in {drained:.1f} s'}")
        await trio.sleep(6.0)  # one receipt round for the workers' own accounting
        delivery = {w: await nodes[w].running.ask({"cmd": "delivery"}) for w in WORKERS}
    finally:
        for n in nodes.values():
            if n.proc is not None:
                await n.proc.stop()
    result = {"trials": trials, **_final_figures(nodes)}
    if opts.keep:
        _say(f"stores and logs kept under {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    result.update(
        records_lost=records_lost,
        corrupt_loads=corrupt,
        restart_s_p50=round(statistics.median(restarts), 3) if restarts else None,
        catch_up_s_p50=round(statistics.median(catch_ups), 3) if catch_ups else None,
        catch_up_incomplete=incomplete,
        worker_status={w: delivery[w] for w in WORKERS},
    )
    return result


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments as in the module docstring); returns its figures."""
    parser = argparse.ArgumentParser(prog="swarm-node bench churn")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--drain", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the stores and logs")
    opts = parser.parse_args(args)
    opts.trials = opts.trials or (2 if quick else 100)
    opts.catch_up_bound = 15.0 if quick else CATCH_UP_BOUND_S
    opts.drain = opts.drain or (20.0 if quick else 90.0)
    return trio.run(_main, opts)
