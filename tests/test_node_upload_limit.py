"""The node's upload cap (`node.weights.upload_limit`): the rate it keeps, and the order in which
transfers that share it finish (virtual time: trio's MockClock)."""

from __future__ import annotations

import trio
import trio.testing

from node.weights.upload_limit import MiB, UploadLimiter


async def _send(
    limiter: UploadLimiter, size: int, chunk: int, done: dict[str, float], name: str
) -> None:
    for start in range(0, size, chunk):
        await limiter.acquire(min(chunk, size - start), size - start)
    done[name] = trio.current_time()


def _run(fn) -> None:  # type: ignore[no-untyped-def]
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_transfers_sharing_the_cap_finish_one_after_another() -> None:
    """Three 2 MiB shards asked at once from a 10 MiB/s uplink in 1 MiB chunks: taking
    chunks in turn finished all three at ~0.6 s; shortest remaining first finishes them
    at ~0.2, 0.4, 0.6 s (each can be relayed as soon as it is done), at the same rate."""
    done: dict[str, float] = {}

    async def main() -> None:
        limiter = UploadLimiter(10.0, burst_s=0.0)
        t0 = trio.current_time()
        async with trio.open_nursery() as n:
            for name in "abc":
                n.start_soon(_send, limiter, 2 * MiB, MiB, done, name)
        for k in done:
            done[k] -= t0
        assert limiter.sent == 6 * MiB

    _run(main)
    times = sorted(done.values())
    assert times[0] < 0.35 and times[1] < 0.55, done
    assert 0.55 < times[2] < 0.7, done  # the cap holds: 6 MiB at 10 MiB/s


def test_a_long_transfer_is_not_starved_past_the_wait_limit() -> None:
    """Short transfers keep arriving (83% of the uplink's rate, so one is nearly always
    waiting): shortest-first alone would hold the long one back until they stop; with
    the wait limit it still gets a chunk every few seconds."""
    got: list[float] = []

    async def main() -> None:
        limiter = UploadLimiter(1.0, burst_s=0.0, max_wait_s=2.0)

        async def long() -> None:
            for left in range(8 * MiB, 0, -MiB):
                await limiter.acquire(MiB, left)
                got.append(trio.current_time())

        async with trio.open_nursery() as n:
            n.start_soon(long)
            await trio.sleep(0.01)
            for i in range(40):  # half a MiB every 0.6 s for 24 s
                n.start_soon(_send, limiter, MiB // 2, MiB // 2, {}, f"short{i}")
                await trio.sleep(0.6)
            n.cancel_scope.cancel()

    _run(main)
    gaps = [b - a for a, b in zip(got, got[1:], strict=False)]
    # waits 2 s, then goes after the (older) shorts already waiting: ~1 s of them
    assert len(got) >= 7 and max(gaps) <= 2.0 + 1.0 + 1.0 + 0.01, (got, gaps)  # alone: 6 s


def test_a_waiter_cancelled_leaves_the_queue_and_the_turn_passes_on() -> None:
    done: dict[str, float] = {}

    async def main() -> None:
        limiter = UploadLimiter(10.0, burst_s=0.0)
        async with trio.open_nursery() as n:
            n.start_soon(_send, limiter, 2 * MiB, MiB, done, "a")
            await trio.sleep(0)
            with trio.move_on_after(0.05):  # waits behind "a", then gives up
                await limiter.acquire(MiB, MiB)
            n.start_soon(_send, limiter, MiB, MiB, done, "b")
        assert not limiter._waiting and not limiter._busy

    _run(main)
    assert set(done) == {"a", "b"} and done["b"] < 0.5, done


def test_a_capped_server_is_busy_while_its_queue_takes_over_the_wait_limit() -> None:
    """`busy()` is `upload_busy` on the bytes still to send: a 1 MiB/s cap with 5 MiB of
    transfers queued (5 s > 4 s) declines new requests; as the pieces go out it takes
    requests again; an uncapped server is never busy; a transfer that ends early leaves
    nothing counted."""

    async def main() -> None:
        limiter = UploadLimiter(1.0, burst_s=0.0)
        assert not limiter.busy()
        with limiter.sending(3 * MiB) as a:
            assert not limiter.busy()  # 3 s of queue
            with limiter.sending(2 * MiB):
                assert limiter.busy() and limiter.queued == 5 * MiB
                await limiter.acquire(MiB, 3 * MiB)
                a.sent(MiB)
                assert not limiter.busy() and limiter.queued == 4 * MiB
            assert limiter.queued == 2 * MiB  # the second ended early: its rest is gone
        assert limiter.queued == 0
        free = UploadLimiter(0.0)
        with free.sending(1000 * MiB):
            assert not free.busy()

    _run(main)
