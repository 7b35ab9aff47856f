"""Process-wide patches of py-libp2p 0.8.1 internals (placeholder; filled below)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import libp2p.network.swarm as _libp2p_swarm
import trio


class InboundGate(Protocol):
    """Per-host admission of inbound connections by remote IP, set on a swarm as
    `swarm._swarm_inbound_gate`: `admit(ip)` before the handshake (False: the socket is
    closed at once), `release(ip)` when that connection's handler ends."""

    def admit(self, ip: str | None) -> bool: ...

    def release(self, ip: str | None) -> None: ...


class _InboundConn:
    """What the patched upgrade saw of one inbound connection."""

    def __init__(self) -> None:
        self.muxed: Any = None
        self.upgraded = trio.Event()


_INBOUND: contextvars.ContextVar[_InboundConn | None] = contextvars.ContextVar(
    "swarm_inbound_conn", default=None
)


def _noting_upgrade(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`Swarm.upgrade_inbound_raw_conn`, telling the inbound handler running it which
    muxed connection it produced."""

    async def upgrade_inbound_raw_conn(self: Any, raw_conn: Any, maddr: Any) -> Any:
        muxed = await original(self, raw_conn, maddr)
        seen = _INBOUND.get()
        if seen is not None:
            seen.muxed = muxed
            seen.upgraded.set()
        return muxed

    upgrade_inbound_raw_conn._swarm_noting = True  # type: ignore[attr-defined]
    return upgrade_inbound_raw_conn


async def _closed(muxed: Any) -> None:
    """Return once `muxed` is closed (its close event; a poll where it has none)."""
    event = getattr(muxed, "event_closed", None)
    if isinstance(event, trio.Event):
        await event.wait()
        return
    while not getattr(muxed, "is_closed", True):
        await trio.sleep(1.0)


def _remote_ip(read_write_closer: Any) -> str | None:
    with contextlib.suppress(Exception):
        remote = read_write_closer.get_remote_address()
        if remote:
            return str(remote[0])
    return None


def _slot_held_while_open(original: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """`Swarm._do_handle_inbound_connection` that returns when its connection closes.

    The library's handler holds an inbound slot (`Swarm._inbound_limiter`, capacity
    max_connections - min_connections) and, after a successful upgrade, waits for the
    whole swarm to stop: every connection that ever came in kept its slot, and once
    `max_connections` had come and gone every new peer was refused. Here the library's
    handler runs as it is in a child task; once its upgrade produced a muxed connection
    and that connection closed (the library's own close and cleanup having run: the
    close event is set at the end of them), the child is cancelled where it waits for
    the swarm, the handler returns and the slot is released. A handler that ends by
    itself (failed upgrade, gate refusal) ends this one too.
    """

    async def _do_handle_inbound_connection(
        self: Any, read_write_closer: Any, maddr: Any, failure_event: Any
    ) -> None:
        gate: InboundGate | None = getattr(self, "_swarm_inbound_gate", None)
        ip = _remote_ip(read_write_closer)
        if gate is not None and not gate.admit(ip):
            with contextlib.suppress(Exception):
                await read_write_closer.close()
            return
        seen = _InboundConn()
        token = _INBOUND.set(seen)
        try:
            async with trio.open_nursery() as nursery:

                async def library_handler() -> None:
                    await original(self, read_write_closer, maddr, failure_event)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(library_handler)
                await seen.upgraded.wait()
                await _closed(seen.muxed)
                nursery.cancel_scope.cancel()
        finally:
            _INBOUND.reset(token)
            if gate is not None:
                gate.release(ip)

    _do_handle_inbound_connection._swarm_slot = True  # type: ignore[attr-defined]
    return _do_handle_inbound_connection


def apply_inbound_slot_patch() -> None:
    swarm_cls = _libp2p_swarm.Swarm
    if not getattr(swarm_cls._do_handle_inbound_connection, "_swarm_slot", False):
        swarm_cls._do_handle_inbound_connection = _slot_held_while_open(
            swarm_cls._do_handle_inbound_connection
        )
    if not getattr(swarm_cls.upgrade_inbound_raw_conn, "_swarm_noting", False):
        swarm_cls.upgrade_inbound_raw_conn = _noting_upgrade(swarm_cls.upgrade_inbound_raw_conn)
