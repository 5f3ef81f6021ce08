"""The request deadline of every unary call, kept by one sweep instead of a timer each.

`asyncio.timeout` arms a loop timer per call (with uvloop, a libuv timer made, started,
stopped and closed): at the unary maximum that was a visible share of the gateway's
CPU per call. Every call has the same deadline, so calls expire in the order they
arrived: a deque in arrival order and one task that wakes every `tick_s` and cancels
the calls whose deadline has come (the same scheme as the shard link's command
deadlines). A call is expired at the first sweep after its deadline less one tick, so
its TIMEOUT answer leaves within the deadline, at most one tick early. The sweep runs
only while calls are watched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

MIN_TICK_S = 0.005
MAX_TICK_S = 0.1


class WatchedCall:
    """One call under watch: `expired` once the sweep cancelled it for its deadline."""

    __slots__ = ("due", "expired", "finished", "task")

    def __init__(self, task: asyncio.Task[object], due: float) -> None:
        self.task = task
        self.due = due  # loop time
        self.expired = False
        self.finished = False


class CallDeadlines:
    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.tick_s = min(max(deadline_s / 20, MIN_TICK_S), MAX_TICK_S)
        self._watched: deque[WatchedCall] = deque()
        self._sweep: asyncio.Task[None] | None = None
        self.expired = 0

    def watch(self) -> WatchedCall:
        """Watch the current task; the caller sets `finished` when it is done."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("CallDeadlines.watch outside a task")
        loop = asyncio.get_running_loop()
        call = WatchedCall(task, loop.time() + self.deadline_s - self.tick_s)
        self._watched.append(call)
        if self._sweep is None or self._sweep.done():
            self._sweep = loop.create_task(self._run())
        return call

    async def _run(self) -> None:
        watched = self._watched
        loop = asyncio.get_running_loop()
        while watched:
            now = loop.time()
            while watched and (watched[0].finished or watched[0].due <= now):
                call = watched.popleft()
                if not call.finished:
                    call.expired = True
                    self.expired += 1
                    call.task.cancel("request deadline")
            await asyncio.sleep(self.tick_s)

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweep
