"""Why a dial to a peer failed, in plain words: the one classifier `swarm-node doctor`,
`swarm-node runs` and `start --join` share (through `node.join.ask`).

Causes: `refused` (nothing listens on that port, or it closed the connection at once),
`no route` (this machine has no route to the address), `timed out` (no answer: a firewall
dropping packets, a host that is down, a listener that says nothing), `not libp2p` (the
port answers another protocol, e.g. HTTP), `wrong peer id` (a libp2p peer with another key
than the address's /p2p/ id), `protocol mismatch` (a libp2p peer that does not speak what
we ask), `dial failed` (anything else, with the library's words).

`probe(addr, timeout_s)` answers the first four before any libp2p dial, as soon as the OS
or the listener does: one TCP connect (refused and no route come back at once), then the
multistream-select greeting every libp2p TCP listener answers (`/multistream/1.0.0`); an
HTTP status line or other bytes are `not libp2p`. It returns None for a port that speaks
libp2p: then the real dial (`dial_cause` of its error) and the question on the stream
(`stream_cause`) say what is wrong, if anything.
"""

from __future__ import annotations

import errno
import re

import trio

REFUSED = "refused"
NO_ROUTE = "no route"
TIMED_OUT = "timed out"
NOT_LIBP2P = "not libp2p"
WRONG_PEER = "wrong peer id"
PROTOCOL_MISMATCH = "protocol mismatch"
DIAL_FAILED = "dial failed"
UNCONNECTED = (WRONG_PEER, REFUSED, TIMED_OUT, NO_ROUTE, NOT_LIBP2P)  # no connection left

GREETING = b"\x13/multistream/1.0.0\n"  # varint length 19, then the protocol id
READ_BYTES = 64


def _refused(detail: str = "") -> tuple[str, str]:
    return REFUSED, detail or (
        "connection refused: nothing listens on that port (closed port or a rejecting firewall)"
    )


def _timed_out(timeout_s: float) -> tuple[str, str]:
    return TIMED_OUT, (
        f"no answer within {timeout_s:g} s (a firewall dropping packets, or the host is down)"
    )


def _tcp_parts(addr: str) -> tuple[int, str, int] | None:
    """(address family, host, port) of an /ip4|ip6/…/tcp/… multiaddr; None for others."""
    parts = addr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp":
        return None
    try:
        port = int(parts[3])
    except ValueError:
        return None
    family = trio.socket.AF_INET if parts[0] == "ip4" else trio.socket.AF_INET6
    return family, parts[1], port


def _os_cause(exc: OSError, host: str, timeout_s: float) -> tuple[str, str] | None:
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return NO_ROUTE, f"this machine has no route to {host} ({exc.strerror})"
    if exc.errno == errno.ECONNREFUSED:
        return _refused()
    if exc.errno == errno.ETIMEDOUT:
        return _timed_out(timeout_s)
    return None


def greeting_cause(first: bytes, timeout_s: float) -> tuple[str, str] | None:
    """(cause, detail) of what a listener sent back to our multistream greeting; None when
    it is the greeting of a libp2p peer."""
    if first.startswith(GREETING[: len(first)]) and first:
        return None
    if first.startswith(b"HTTP/"):
        status = first.split(b"\r\n", 1)[0].decode("ascii", "replace")
        return NOT_LIBP2P, f"the port answers HTTP ({status!r}), not libp2p: a web server?"
    if first.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return NOT_LIBP2P, "the port answers HTTP (an HTML page), not libp2p: a web server?"
    if not first:
        return _refused(
            "it accepted the connection and closed it without a word "
            "(not a libp2p listener, or one at its connection limit)"
        )
    shown = first[:24].decode("ascii", "backslashreplace")
    return NOT_LIBP2P, f"the port answers another protocol, not libp2p (it began {shown!r})"


async def probe(addr: str, timeout_s: float) -> tuple[str, str] | None:
    """(cause, detail) when `addr` cannot be a libp2p peer: refused, no route, timed out or
    not libp2p, found by one TCP connect and the multistream greeting within `timeout_s`;
    None when the port speaks libp2p (or `addr` is not plain TCP)."""
    where = _tcp_parts(addr)
    if where is None:
        return None
    family, host, port = where
    first = b""
    with trio.move_on_after(timeout_s) as scope:
        try:
            with trio.socket.socket(family) as sock:
                await sock.connect((host, port))
                await sock.send(GREETING)
                while len(first) < len(GREETING):
                    got = await sock.recv(READ_BYTES)
                    if not got:
                        break
                    first += got
                    if greeting_cause(first, timeout_s) is not None:
                        break
        except OSError as exc:
            if first:
                return greeting_cause(first, timeout_s)
            return _os_cause(exc, host, timeout_s) or (DIAL_FAILED, exc.strerror or str(exc))
    if scope.cancelled_caught:
        if first:
            return greeting_cause(first, timeout_s)
        return _timed_out(timeout_s)
    return greeting_cause(first, timeout_s)


def dial_cause(error: str, timeout_s: float) -> tuple[str, str]:
    """(cause, plain detail) of a failed libp2p dial, from the host's one-line error."""
    text = error.lower()
    if "does not correspond" in text or ("peer id" in text and "pubkey" in text):
        found = re.search(r"remote_peer_id_from_pubkey=(\w+)", error)
        who = f" (the host there is {found.group(1)})" if found else ""
        return WRONG_PEER, f"the address answers with another key than its /p2p/ id{who}"
    if "refused" in text:
        return _refused()
    if "unreachable" in text or "no route" in text:
        return NO_ROUTE, f"this machine has no route to that address (a router said so: {error})"
    if "no answer within" in text or "timed out" in text or "timeout" in text:
        return _timed_out(timeout_s)
    if "multiselect" in text or "multistream" in text or "negotiat" in text:
        return PROTOCOL_MISMATCH, (
            f"it speaks libp2p but not the security and muxer we offer (noise, yamux): {error}"
        )
    return DIAL_FAILED, error


def stream_cause(exc: BaseException, protocol_id: str) -> tuple[str, str]:
    """(cause, detail) of a failed question over `protocol_id` on a live connection."""
    chain, e = [], exc.__cause__
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(type(c).__name__ == "MultiselectClientError" for c in chain):
        return PROTOCOL_MISMATCH, (
            f"it does not speak {protocol_id} (not a swarm-node peer, or one too old to serve it)"
        )
    if "took over" in str(exc) or "deadline" in str(exc).lower():
        return TIMED_OUT, str(exc)
    return DIAL_FAILED, str(exc)
