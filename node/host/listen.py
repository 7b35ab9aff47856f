"""Listen-address checks and failure explanations of the `node.host.host` adapter."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import multiaddr

from node.host.framed_stream import ListenFailed


def explain(exc: BaseException) -> str:
    """One line saying why a library call failed: the library wraps the real cause (a
    refused connection, a failed handshake) several levels deep; dig it out."""
    seen: set[int] = set()
    causes: list[BaseException] = []
    stack: list[BaseException] = [exc]
    while stack and len(seen) < 32:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        causes.append(e)
        for nested in (*getattr(e, "errors", ()), *getattr(e, "exceptions", ())):
            if isinstance(nested, BaseException):
                stack.append(nested)
        for nested in (e.__cause__, e.__context__):
            if nested is not None:
                stack.append(nested)
    for e in causes:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
    for e in reversed(causes):
        text = str(e).strip()
        if text and "no addresses established" not in text and not text.startswith("Error 1"):
            return text.splitlines()[0][:300]
    return (str(exc) or type(exc).__name__)[:300]


def tcp_target(addr: multiaddr.Multiaddr) -> tuple[str, int] | None:
    """(ip, port) of an /ip4|ip6/.../tcp/... multiaddr, else None."""
    protos = {p.name for p in addr.protocols()}
    if "tcp" not in protos:
        return None
    ip = addr.value_for_protocol("ip4") if "ip4" in protos else None
    if ip is None and "ip6" in protos:
        ip = addr.value_for_protocol("ip6")
    port = addr.value_for_protocol("tcp")
    return (str(ip), int(port)) if ip and port is not None else None


def listen_failures(requested: Sequence[multiaddr.Multiaddr], got: Sequence[Any]) -> list[str]:
    """Each requested address without a listener, with the reason: an address that is not
    TCP (the library skips those silently), or a TCP one the library failed to bind (found
    by binding a plain socket to it: the library only logs its own error)."""
    bound = [t for t in (tcp_target(a) for a in got) if t]
    failures = []
    for addr in requested:
        want = tcp_target(addr)
        if want is None:
            failures.append(
                f"cannot listen on {addr}: the node listens on TCP only "
                "(an address like /ip4/127.0.0.1/tcp/4001; /tcp/0 picks a free port)"
            )
            continue
        ip, port = want
        if any(
            (ip in ("0.0.0.0", "::") or b_ip == ip) and (port == 0 or b_port == port)
            for b_ip, b_port in bound
        ):
            continue
        reason = "no listener was started"
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((ip, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                reason = f"port {port} is in use by another process"
            elif exc.errno == errno.EADDRNOTAVAIL:
                reason = f"{ip} is not an address of this machine (cannot assign requested address)"
            else:
                reason = exc.strerror or str(exc)
        failures.append(f"cannot listen on {addr}: {reason}")
    return failures


@contextlib.asynccontextmanager
async def plain_listen_failed() -> AsyncIterator[None]:
    """Raise `ListenFailed` bare, not wrapped in the library's exception group."""
    try:
        yield
    except BaseExceptionGroup as group:
        match, rest = group.split(ListenFailed)
        if match is not None and rest is None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            raise leaf from None
        raise
