"""The open-loop load of the unary benchmarks: one call per slot, latency from the slot.

Each call has its slot (`started + k / rate`): a call is started at its slot, or as soon
as fewer than `outstanding` are in flight, and its latency is measured from the slot,
so a stall of the server is not hidden by the generator slowing down. Rate 0: as fast
as `outstanding` calls in flight allow, each measured from its own start.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable


async def open_loop(
    one: Callable[[int], Awaitable[None]], *, rate: int, seconds: float, outstanding: int
) -> float:
    """Run `one(slot_ns)` for every slot of `seconds`; the seconds it took, the last
    calls' answers included."""
    limit = asyncio.Semaphore(outstanding)
    tasks: set[asyncio.Task[None]] = set()

    async def call(slot_ns: int) -> None:
        try:
            await one(slot_ns)
        finally:
            limit.release()

    started = time.perf_counter_ns()
    end = started + int(seconds * 1e9)
    for index in itertools.count():
        slot = started + (int(index * 1e9 / rate) if rate else 0)
        if slot >= end or time.perf_counter_ns() >= end:
            break
        now = time.perf_counter_ns()
        if slot > now:
            await asyncio.sleep((slot - now) / 1e9)
        await limit.acquire()
        task = asyncio.create_task(call(slot if rate else time.perf_counter_ns()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return (time.perf_counter_ns() - started) / 1e9
