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
from collections.abc import Awaitable, Callable, Hashable
from enum import Enum
from typing import Generic, TypeVar

import structlog

from persister.answers import AnswerSink
from persister.counters import Counters
from persister.errors import StoreError
from persister.store import Store
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)
Barrier = Callable[[int], Awaitable[None]]
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


class BatchedReads(Generic[K, W]):
    """Requests queued in `PendingReads`, read in batches by a few workers, answered to
    the shard. A subclass names its counters and reads one batch (`_read`)."""

    REQUESTED = ""
    JOINED = ""
    SHED = ""
    FAILED = ""

    def __init__(
        self,
        store: Store,
        shard: AnswerSink,
        counters: Counters,
        *,
        committed: Barrier,
        workers: int,
        max_per_query: int,
        max_pending: int,
    ) -> None:
        self.store = store
        self.shard = shard
        self.counters = counters
        self.committed = committed
        self.workers = workers
        self.max_per_query = max_per_query
        self.pending: PendingReads[K, W] = PendingReads(max_pending)

    def _request(self, key: K, waiter: W, position: int) -> None:
        self.counters.add(self.REQUESTED)
        admission = self.pending.add(key, waiter, position)
        if admission is Admission.JOINED:
            self.counters.add(self.JOINED)
        elif admission is Admission.SHED:
            self.counters.add(self.SHED)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workers):
                group.create_task(self._work())

    async def _work(self) -> None:
        while True:
            keys, newest = await self.pending.take(self.max_per_query)
            try:
                # Each read sees every write logged before the newest request it answers.
                await self.committed(newest - 1)
                commands = await self._read(keys)
            except StoreError as error:
                self.counters.add(self.FAILED)
                log.warning(f"persister.{self.FAILED}", keys=len(keys), error=str(error))
                self.pending.finish(keys)
                continue  # nothing answered: the shard asks again after 5 s
            if commands:
                await self.shard.send(commands)

    async def _read(self, keys: list[K]) -> list[shard_pb2.ShardCommand]:
        raise NotImplementedError
