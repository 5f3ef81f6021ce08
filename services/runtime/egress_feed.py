"""Durable egress, kept for a bounded window so consumers can resume.

The sequencer hands over each record's egress once the record is durable. The
feed keeps the most recent records keyed by log position, at most
`retained_records` of them holding at most `retained_items` egress items: the
items are what costs memory (a record at a high rate holds hundreds; a window
bounded by records alone once held 13 GB in a shard after a million orders at
the bench's maximum). A consumer (the persister, the bridge) subscribes from the
position after the last one it processed and receives everything from there,
then new records as they become durable. A consumer that asks for a position that
has left the window gets `EgressWindowExceededError` and must rebuild from state
instead (the bridge does that from the shard's in-flight sagas; the persister
stops, saying so, rather than skip rows).

Subscribers waiting for the next record are futures woken by `publish` itself: no
task and no lock per record.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.runtime.core.log_batch import LogBatch

EgressT = TypeVar("EgressT")


class EgressWindowExceededError(LookupError):
    """The requested position is older than the retained window."""


@dataclass(frozen=True, slots=True)
class EgressRecord(Generic[EgressT]):
    first_position: int
    last_position: int
    consensus_time_ms: int
    items: Sequence[tuple[int, EgressT]]  # (log position, item)


class DurableEgressFeed(Generic[EgressT]):
    def __init__(
        self,
        retained_records: int = 100_000,
        select: Callable[[EgressT], bool] | None = None,
        *,
        retained_items: int = 4_000_000,
    ) -> None:
        if retained_records < 1 or retained_items < 1:
            raise ValueError("retained_records and retained_items must be positive")
        self.retained_records = retained_records
        self.retained_items = retained_items
        self._records: deque[EgressRecord[EgressT]] = deque()
        self._items = 0  # items in `_records`
        self._select = select
        self._waiters: list[asyncio.Future[None]] = []
        self._durable_position = 0
        self._closed = False

    @property
    def retained(self) -> tuple[int, int]:
        """(records, items) in the window now."""
        return len(self._records), self._items

    @property
    def oldest_position(self) -> int:
        """The first position a subscriber can still start from (0: none retained)."""
        return self._records[0].first_position if self._records else 0

    @property
    def durable_position(self) -> int:
        return self._durable_position

    def start_at(self, position: int) -> None:
        """After recovery: nothing before `position + 1` will ever be published here."""
        self._durable_position = position

    def publish(self, batch: LogBatch, outputs: list[Sequence[EgressT]]) -> None:
        """The sequencer's `on_durable` hook: called once per durable record."""
        select = self._select
        position = batch.first_position
        items: list[tuple[int, EgressT]] = []
        for output in outputs:
            for item in output:
                if select is None or select(item):
                    items.append((position, item))
            position += 1
        records = self._records
        records.append(
            EgressRecord(batch.first_position, batch.last_position, batch.consensus_time_ms, items)
        )
        self._items += len(items)
        # The newest record always stays, however many items it holds.
        while len(records) > 1 and (
            len(records) > self.retained_records or self._items > self.retained_items
        ):
            self._items -= len(records.popleft().items)
        self._durable_position = batch.last_position
        self._wake()

    def clear(self) -> None:
        """Forget every record (recovery replays again from an older snapshot, before
        anyone subscribed)."""
        self._records.clear()
        self._items = 0
        self._durable_position = 0

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _next_change(self) -> None:
        """Until the next `publish` or `close`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    async def subscribe(self, from_position: int) -> AsyncIterator[EgressRecord[EgressT]]:
        """Records holding positions >= `from_position`, then new ones as they come."""
        async for records in self.subscribe_batches(from_position):
            for record in records:
                yield record

    async def subscribe_batches(
        self, from_position: int
    ) -> AsyncIterator[list[EgressRecord[EgressT]]]:
        """As `subscribe`, every record ready at once in one list (a subscriber that
        fell behind catches up in few messages instead of one per record)."""
        next_position = from_position
        while True:
            ready = self._records_from(next_position)
            if ready:
                next_position = ready[-1].last_position + 1
                yield ready
                continue
            if self._closed:
                return
            await self._next_change()

    async def wait_published(self) -> None:
        """Until the next record is published."""
        await self._next_change()

    def _records_from(self, position: int) -> list[EgressRecord[EgressT]]:
        records = self._records
        if not records or position > records[-1].last_position:
            if position <= self._durable_position and (
                not records or position < records[0].first_position
            ):
                raise EgressWindowExceededError(
                    f"position {position} is older than the retained egress window"
                )
            return []
        if position < records[0].first_position:
            raise EgressWindowExceededError(
                f"position {position} is older than the retained egress window "
                f"(oldest {records[0].first_position})"
            )
        # Records are contiguous and ordered: find the first that ends at or after position.
        low, high = 0, len(records) - 1
        while low < high:
            middle = (low + high) // 2
            if records[middle].last_position < position:
                low = middle + 1
            else:
                high = middle
        return [records[index] for index in range(low, len(records))]
