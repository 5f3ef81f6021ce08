"""The commands waiting for one matcher group: re-drives first, then fresh egress.

The bridge's durable work queue is the shard's set of in-flight sagas; this is
only its in-memory front. Two parts, drained in this order:

- `redrive`: the group's sagas from a `GetInFlight` snapshot, in the shard's
  order (submits, then cancels). They go first so that a cancel that arrived
  fresh can never overtake the re-driven submit of its own order.
- fresh items from the egress stream, bounded by `capacity`: a full queue makes
  the egress reader wait (backpressure, never a drop) while the group is up.

While the group is down the queue is closed: fresh items are shed and counted,
because the group's next connection starts from a new `GetInFlight` snapshot,
which holds every one of them that still needs the matcher.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Sequence

from bridge.saga_commands import Work


class WorkQueue:
    def __init__(self, group: str, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"queue capacity must be positive, got {capacity}")
        self.group = group
        self.capacity = capacity
        self.is_open = False
        self._redrive: deque[Work] = deque()
        self._fresh: deque[Work] = deque()
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._redrive) + len(self._fresh)

    async def open(self) -> None:
        async with self._changed:
            self.is_open = True

    async def close(self) -> None:
        """Drop everything waiting and shed fresh items until the next `open`."""
        async with self._changed:
            self.is_open = False
            self._redrive.clear()
            self._fresh.clear()
            self._changed.notify_all()

    async def redrive(self, work: Iterable[Work]) -> None:
        async with self._changed:
            self._redrive.extend(work)
            self._changed.notify_all()

    async def offer(self, work: Sequence[Work]) -> int:
        """Queue fresh work in order, waiting for room; how many items were shed (group down)."""
        queued = 0
        async with self._changed:
            while queued < len(work):
                await self._changed.wait_for(
                    lambda: not self.is_open or len(self._fresh) < self.capacity
                )
                if not self.is_open:
                    return len(work) - queued
                room = self.capacity - len(self._fresh)
                self._fresh.extend(work[queued : queued + room])
                queued = min(len(work), queued + room)
                self._changed.notify_all()
        return 0

    async def take(self, limit: int) -> list[Work]:
        """Wait for work; then up to `limit` items, re-drives first."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._redrive or self._fresh))
            taken: list[Work] = []
            for source in (self._redrive, self._fresh):
                while source and len(taken) < limit:
                    taken.append(source.popleft())
            self._changed.notify_all()
            return taken
