"""The unary calls' request deadline, kept by one sweep (`gateway/call_deadlines.py`):
a call past its deadline is cancelled and marked expired, within the deadline and at
most one tick early; a call that ends in time, or that its client cancels, is not."""

from __future__ import annotations

import asyncio
import time

from gateway.call_deadlines import CallDeadlines, WatchedCall

DEADLINE_S = 0.4


async def _call(deadlines: CallDeadlines, work_s: float, seen: list[WatchedCall]) -> str:
    watched = deadlines.watch()
    seen.append(watched)
    try:
        await asyncio.sleep(work_s)
        return "answered"
    except asyncio.CancelledError:
        if not watched.expired:
            raise
        watched.task.uncancel()
        return "deadline"
    finally:
        watched.finished = True


async def test_a_call_past_its_deadline_is_expired_within_it() -> None:
    deadlines = CallDeadlines(DEADLINE_S)
    seen: list[WatchedCall] = []
    started = time.monotonic()
    slow = asyncio.ensure_future(_call(deadlines, 10 * DEADLINE_S, seen))
    quick = asyncio.ensure_future(_call(deadlines, DEADLINE_S / 4, seen))
    async with asyncio.timeout(5 * DEADLINE_S):
        assert await quick == "answered"
        assert await slow == "deadline"
    took_s = time.monotonic() - started
    assert DEADLINE_S - 2 * deadlines.tick_s <= took_s <= DEADLINE_S + 0.1, took_s
    assert [call.expired for call in seen] == [True, False]
    assert deadlines.expired == 1
    assert not slow.cancelled()
    await deadlines.close()


async def test_a_call_its_client_cancels_is_not_counted_expired() -> None:
    deadlines = CallDeadlines(DEADLINE_S)
    seen: list[WatchedCall] = []
    call = asyncio.ensure_future(_call(deadlines, 10 * DEADLINE_S, seen))
    await asyncio.sleep(0)
    call.cancel()
    async with asyncio.timeout(DEADLINE_S):
        await asyncio.wait([call])
    assert call.cancelled()
    assert not seen[0].expired and deadlines.expired == 0
    await deadlines.close()


async def test_many_calls_share_one_sweep_and_it_ends_with_them() -> None:
    deadlines = CallDeadlines(DEADLINE_S)
    seen: list[WatchedCall] = []
    calls = [asyncio.ensure_future(_call(deadlines, 0.01, seen)) for _ in range(500)]
    async with asyncio.timeout(5 * DEADLINE_S):
        assert set(await asyncio.gather(*calls)) == {"answered"}
        sweep = deadlines._sweep
        assert sweep is not None
        await sweep  # nothing watched any more: the sweep has ended by itself
    assert deadlines.expired == 0
