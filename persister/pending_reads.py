"""Keys waiting for a database read, single-flight and bounded.

A request for a key that is already waiting, or already being read, joins it
instead of causing a second read. Workers `take` up to a query's worth of keys
at once (one `= ANY($1)` query for all of them) and `finish` them with every
waiter that joined meanwhile. Beyond `max_pending` keys a request is shed: the
shard asks again after 5 s of consensus time, so shedding loses nothing but
time, while an unbounded queue could take the whole process down.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable
from enum import Enum
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
W = TypeVar("W")


class Admission(Enum):
    QUEUED = "queued"
    JOINED = "joined"
    SHED = "shed"


class PendingReads(Generic[K, W]):
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._waiting: dict[K, list[W]] = {}
        self._reading: dict[K, list[W]] = {}
        self._positions: dict[K, int] = {}
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._waiting) + len(self._reading)

    def add(self, key: K, waiter: W, position: int) -> Admission:
        """`position`: the log position of the request; the read must see writes before it."""
        joined = self._reading.get(key)
        if joined is None:
            joined = self._waiting.get(key)
        if joined is not None:
            joined.append(waiter)
            return Admission.JOINED
        if len(self) >= self.max_pending:
            return Admission.SHED
        self._waiting[key] = [waiter]
        self._positions[key] = position
        self._ready.set()
        return Admission.QUEUED

    async def take(self, limit: int) -> tuple[list[K], int]:
        """Up to `limit` waiting keys, now being read, and the newest position among them."""
        while not self._waiting:
            self._ready.clear()
            await self._ready.wait()
        keys = list(itertools.islice(self._waiting, limit))
        newest = 0
        for key in keys:
            self._reading[key] = self._waiting.pop(key)
            newest = max(newest, self._positions.pop(key))
        return keys, newest

    def finish(self, keys: list[K]) -> dict[K, list[W]]:
        """The keys' waiters, including those that joined during the read."""
        return {key: self._reading.pop(key) for key in keys}
