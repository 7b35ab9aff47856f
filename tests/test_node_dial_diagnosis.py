"""One dial classifier for `doctor`, `runs` and `start --join` (`node.dial_diagnosis`),
each cause found against a real listener of that kind: a closed port (refused), a network
without a route (no route, in a network namespace of its own), a listener that never
answers (timed out), an HTTP server and a port that answers other bytes (not libp2p), a
libp2p peer with another key (wrong peer id) and one that serves no run directory
(protocol mismatch); a libp2p peer passes the probe. The causes that need no libp2p dial
come back at once, not after the dial deadline."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from node import dial_diagnosis as dd
from node import join
from node.host.host import open_host
from protocol.identity import Identity
from tests.support.cli import ROOT, run_cli

DIAL_S = 10.0  # the probe's deadline; the causes found at once come back well before it


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(listener: trio.SocketListener, reply: bytes | None) -> None:
    """Accept connections; answer each with `reply` after the first bytes (None: silence)."""
    while True:
        stream = await listener.accept()
        async with stream:
            await stream.receive_some(1024)
            if reply is None:
                await trio.sleep_forever()
            await stream.send_all(reply)


async def _probe_listener(reply: bytes | None, timeout_s: float = DIAL_S):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, listeners[0], reply)
        with trio.fail_after(timeout_s + 5):
            found = await dd.probe(f"/ip4/127.0.0.1/tcp/{port}", timeout_s)
        nursery.cancel_scope.cancel()
    return found


async def test_a_closed_port_is_refused_at_once() -> None:
    with trio.fail_after(DIAL_S / 2):  # the OS answers: no wait for the deadline
        found = await dd.probe(f"/ip4/127.0.0.1/tcp/{_closed_port()}", DIAL_S)
    assert found is not None and found[0] == dd.REFUSED, found


async def test_an_http_server_is_not_libp2p() -> None:
    found = await _probe_listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    assert found is not None and found[0] == dd.NOT_LIBP2P, found
    assert "HTTP" in found[1], found
    found = await _probe_listener(b"<!DOCTYPE HTML>\n<html><body>Bad request</body></html>")
    assert found is not None and "HTTP (an HTML page)" in found[1], found


async def test_other_bytes_are_not_libp2p_and_a_silent_close_is_refused() -> None:
    found = await _probe_listener(b"SSH-2.0-OpenSSH_9.2\r\n")
    assert found is not None and found[0] == dd.NOT_LIBP2P and "SSH-2.0" in found[1], found
    found = await _probe_listener(b"")
    assert found is not None and found[0] == dd.REFUSED and "closed it" in found[1], found


async def test_a_silent_listener_times_out() -> None:
    found = await _probe_listener(None, timeout_s=1.0)
    assert found is not None and found[0] == dd.TIMED_OUT, found


async def test_a_libp2p_peer_passes_the_probe_and_the_dial_names_the_rest() -> None:
    async with open_host(Identity.generate().private_bytes(), ["/ip4/127.0.0.1/tcp/0"]) as host:
        addr = host.listen_addrs()[0]
        assert await dd.probe(addr, DIAL_S) is None
        async with open_host(Identity.generate().private_bytes(), ["/ip4/127.0.0.1/tcp/0"]) as me:
            answer = await join.ask(me, addr)  # a libp2p peer that serves no run directory
            assert answer.cause == dd.PROTOCOL_MISMATCH, answer
            other = addr.rsplit("/p2p/", 1)[0] + "/p2p/" + Identity.generate().peer_id_b58
            answer = await join.ask(me, other)
            assert answer.cause == dd.WRONG_PEER, answer


PROBE_NO_ROUTE = """
import trio
from node import dial_diagnosis as dd
print(trio.run(dd.probe, "/ip4/10.255.1.2/tcp/4001", 10.0))
"""


def test_no_route_in_a_network_without_one() -> None:
    """In a network namespace of its own (only loopback, down), nothing has a route."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("SWARM_CI"):
            pytest.fail("CI runs as root with unshare")
        pytest.skip("a network namespace needs root and unshare")
    r = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", PROBE_NO_ROUTE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert f"('{dd.NO_ROUTE}'," in r.stdout, r.stdout


@pytest.mark.slow
def test_runs_and_doctor_say_the_same_for_an_http_port(tmp_path: Path) -> None:
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{Identity.generate().peer_id_b58}"
        runs = run_cli("runs", addr)
        doctor = run_cli("doctor", "--join", addr, "--data-dir", str(tmp_path))
    finally:
        server.shutdown()
        server.server_close()
    said = f"{dd.NOT_LIBP2P}: the port answers HTTP"
    assert runs.returncode == 1 and f"{addr}: no run: {said}" in runs.stdout, (
        runs.stdout + runs.stderr
    )
    assert doctor.returncode == 1 and f"bootstrap {addr}: {said}" in doctor.stdout, (
        doctor.stdout + doctor.stderr
    )
