"""Peer processes driven over stdin/stdout, one JSON object a line: the driver
(`PeerProcess`, used by tests and the network benchmarks) and the two helpers each peer
process uses for its side of the channel (`reply`, `json_lines`)."""

from __future__ import annotations

import json
import subprocess
import sys

import trio


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

    # Labels a driver may set on its peers (the reach benchmark: kind, index, relay address,
    # join time); declared only, so a peer without one has no such attribute.
    kind: str
    index: int
    relayed: str
    join_s: float

    @classmethod
    async def start(
        cls,
        *extra: str,
        timeout: float = 60.0,
        module: str = "node.testing.gossip_peer",
        stderr_path: str | None = None,
    ) -> PeerProcess:
        """Start `python -m module` with `extra` arguments and wait for its start-up line."""
        err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", module, *extra],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        finally:
            if not isinstance(err, int):
                err.close()
        peer = cls(proc)
        hello = await peer.read(timeout)
        peer.peer_id, peer.addrs, peer.hello = hello["peer_id"], hello["addrs"], hello
        return peer

    async def read(self, timeout: float = 30.0) -> dict:  # type: ignore[type-arg]
        """The next JSON line from the process (fails after `timeout` seconds)."""
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
        """Ask the process to quit; kill it when it has not exited after `grace` seconds."""
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
