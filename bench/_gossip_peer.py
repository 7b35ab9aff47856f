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
import json
import os
import secrets
import struct
import sys
import time

import trio

from node.host.host import HostSettings, PeerEvent, open_host

_STAMP = struct.Struct(">dQ")  # send time (time.time()), sequence number


def reply(obj: object) -> None:
    """One JSON line to the parent process (a peer process's stdout is its reply channel)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def json_lines(stream: trio.abc.ReceiveStream):  # type: ignore[no-untyped-def]
    """The JSON objects of a line-delimited stream (the parent's commands on stdin)."""
    buf = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


async def main(args: argparse.Namespace) -> None:
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--key", default="", help="hex 32-byte private key (default: random)")
    parser.add_argument("--dead-after", type=float, default=4.0)
    parser.add_argument("--max-life", type=float, default=300.0)
    trio.run(main, parser.parse_args())


class PeerProcess:
    """Async driver of one peer process (used by tests and `bench gossip`).

    Resource handling: `stop()` asks the process to quit, then kills it after a grace
    period; always call it (the `spawn()` context does).
    """

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self._buf = b""
        self._owed = 0  # answers to commands sent whose reader was cancelled
        self.peer_id = ""
        self.addrs: list[str] = []
        self.hello: dict = {}  # type: ignore[type-arg]

    @classmethod
    async def start(
        cls,
        *extra: str,
        timeout: float = 60.0,
        module: str = "bench._gossip_peer",
        stderr_path: str | None = None,
    ) -> PeerProcess:
        import subprocess

        err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", module, *extra],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        finally:
            if stderr_path:
                err.close()
        peer = cls(proc)
        hello = await peer.read(timeout)
        peer.peer_id, peer.addrs, peer.hello = hello["peer_id"], hello["addrs"], hello
        return peer

    async def read(self, timeout: float = 30.0) -> dict:  # type: ignore[type-arg]
        assert self.proc.stdout is not None
        with trio.fail_after(timeout):
            while b"\n" not in self._buf:
                chunk = await self.proc.stdout.receive_some(1 << 20)
                if not chunk:
                    raise RuntimeError(f"peer process exited (rc={self.proc.poll()})")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    async def ask(self, cmd: dict, timeout: float = 30.0) -> dict:  # type: ignore[type-arg]
        """Send one command and read its answer. An earlier `ask` cancelled before its
        answer came (a caller's `move_on_after`) leaves that answer owed: it is read and
        dropped first, so this call never returns another command's answer."""
        assert self.proc.stdin is not None
        while self._owed:
            await self.read(timeout)
            self._owed -= 1
        with trio.fail_after(timeout):
            await self.proc.stdin.send_all((json.dumps(cmd) + "\n").encode())
        self._owed += 1
        answer = await self.read(timeout)
        self._owed -= 1
        return answer

    async def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            with trio.move_on_after(grace):
                try:
                    await self.ask({"cmd": "quit"}, timeout=grace)
                    await self.proc.wait()
                except (
                    RuntimeError,
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    trio.TooSlowError,
                    OSError,
                ):
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
            with trio.move_on_after(grace):
                await self.proc.wait()


if __name__ == "__main__":
    cli()
