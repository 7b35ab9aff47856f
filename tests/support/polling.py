"""Waiting in trio tests for a condition other tasks bring about."""

from __future__ import annotations

from collections.abc import Callable

import trio

POLL_S = 0.05


async def until(what: str, check: Callable[[], object], timeout: float = 20.0) -> None:
    """Return once `check()` is true; fail the test naming `what` after `timeout` seconds."""
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(POLL_S)
        return
    raise AssertionError(f"timed out waiting for {what}")
