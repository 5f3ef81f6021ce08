"""Delivers each command's final result to the stream that sent the command.

Most commands are answered by the log entry that carried them. A command that
had to wait (its user was being hydrated, or its client order id needed the
database's exact answer) is answered `parked` first and finally by a later
entry. The router remembers which stream waits for which correlation id and
hands it the final result once that later entry is durable. Results nobody
waits for (the stream is gone: the gateway retries with the same client order
id and the dedup index answers) are kept briefly, bounded, so a waiter that
registers a moment late still gets its answer.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from services.shard.core.egress import ShardResult

# A final result with the log stamp of the entry that decided it: (result, position, time).
Stamped = tuple[ShardResult, int, int]


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    waiting: int
    delivered: int
    unclaimed: int


class ResultRouter:
    def __init__(self, max_waiting: int = 100_000, max_unclaimed: int = 10_000) -> None:
        self.max_waiting = max_waiting
        self.max_unclaimed = max_unclaimed
        self._waiting: OrderedDict[int, asyncio.Queue[Stamped]] = OrderedDict()
        self._unclaimed: OrderedDict[int, Stamped] = OrderedDict()
        self._parked: OrderedDict[int, None] = OrderedDict()
        self._delivered = 0

    def expect(self, correlation_id: int, queue: asyncio.Queue[Stamped]) -> None:
        """`queue` wants the final result of `correlation_id`."""
        early = self._unclaimed.pop(correlation_id, None)
        if early is not None:
            queue.put_nowait(early)
            self._delivered += 1
            return
        self._waiting[correlation_id] = queue
        while len(self._waiting) > self.max_waiting:
            self._waiting.popitem(last=False)  # that stream's client will retry

    def forget(self, queue: asyncio.Queue[Stamped]) -> None:
        """The stream closed: stop routing to it."""
        for correlation_id in [key for key, value in self._waiting.items() if value is queue]:
            del self._waiting[correlation_id]

    def route(self, result: ShardResult, position: int = 0, consensus_time_ms: int = 0) -> None:
        """Every durable result passes here; only finals of parked commands are routed.

        `position` and `consensus_time_ms` stamp the entry that decided the result.

        Immediate results go back on the stream that sent the command, straight
        from its log entry, so they are ignored here.
        """
        correlation_id = result.correlation_id
        if result.parked:
            self._parked[correlation_id] = None
            while len(self._parked) > self.max_waiting:
                self._parked.popitem(last=False)
            return
        if correlation_id not in self._parked:
            return  # an immediate result: its stream already has it
        del self._parked[correlation_id]
        stamped = (result, position, consensus_time_ms)
        queue = self._waiting.pop(correlation_id, None)
        if queue is not None:
            queue.put_nowait(stamped)
            self._delivered += 1
            return
        self._unclaimed[correlation_id] = stamped
        while len(self._unclaimed) > self.max_unclaimed:
            self._unclaimed.popitem(last=False)

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(len(self._waiting), self._delivered, len(self._unclaimed))
