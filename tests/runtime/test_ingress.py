"""Command ingress at the sequencer's edges: before it runs, while it stops, after.

A sender waits for room while the queue is full and the sequencer runs or has yet
to start; once it stops (or has ended) no room will come, so a sender is refused at
once, and senders already waiting are woken and refused. (Before this was mended a
sender that met a stopping sequencer went round `wait_capacity`, which returned at
once, without ever yielding: the event loop stopped for good.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.log_batch import LogBatch
from services.runtime.core.replica import Replica
from services.runtime.errors import IngressFullError
from services.runtime.ingress import CommandIngress
from services.runtime.log_store import LogTail
from services.runtime.sequencer import Sequencer, SequencerSettings

pytestmark = [pytest.mark.timeout(30)]
MAX_WAITS = 10  # a sender waiting for room more often than this is going round


class HeldLogStore:
    """A log in memory whose appends are durable only once released."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.released.set()
        self.records: list[LogBatch] = []
        self.appending = asyncio.Event()  # set once an append waits for its release

    async def open(self) -> LogTail:
        return LogTail(1, 0, 0, 0)

    async def append(self, batch: LogBatch, record: bytes) -> None:
        if not self.released.is_set():
            self.appending.set()
        await self.released.wait()
        self.records.append(batch)

    async def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        for batch in self.records:
            if batch.last_position >= position:
                yield batch

    async def truncate_before(self, position: int) -> None:
        """Nothing to drop in a test."""

    async def close(self) -> None:
        """Nothing to close."""


def _ingress(
    store: HeldLogStore, max_pending_entries: int
) -> tuple[Sequencer[tuple[int, int | None]], CommandIngress[tuple[int, int | None]]]:
    sequencer: Sequencer[tuple[int, int | None]] = Sequencer(
        Replica(CounterMachine(), checkpoint_interval_entries=100),
        store,
        settings=SequencerSettings(timer_interval_ms=0, max_pending_entries=max_pending_entries),
    )
    waits = 0
    waiting = sequencer.wait_capacity

    async def counted_wait() -> None:
        nonlocal waits
        waits += 1
        if waits > MAX_WAITS:
            raise AssertionError("a sender goes round waiting for room that never comes")
        await waiting()

    sequencer.wait_capacity = counted_wait  # type: ignore[method-assign]
    return sequencer, CommandIngress(sequencer)


async def test_a_full_queue_before_the_sequencer_starts_makes_senders_wait_not_fail() -> None:
    store = HeldLogStore()
    sequencer, ingress = _ingress(store, max_pending_entries=1)
    first = await ingress.enqueue(encode_increment(1, 1))
    second = asyncio.create_task(ingress.enqueue(encode_increment(2, 1)))
    await asyncio.sleep(0)
    assert not second.done()  # waiting for room, not refused
    running = asyncio.create_task(sequencer.run())
    try:
        async with asyncio.timeout(10):
            receipts = [await first, await (await second)]
        assert [receipt.first_position for receipt in receipts] == [1, 2]
    finally:
        sequencer.stop()
        await running


async def test_a_sender_meeting_a_stopping_sequencer_is_refused_at_once() -> None:
    store = HeldLogStore()
    sequencer, ingress = _ingress(store, max_pending_entries=4)
    running = asyncio.create_task(sequencer.run())
    store.released.clear()  # the next append stays in flight: the sequencer keeps running
    held = await ingress.enqueue(encode_increment(1, 1))
    async with asyncio.timeout(10):
        await store.appending.wait()
    sequencer.stop()
    assert sequencer.running and sequencer.closed
    refused = await ingress.enqueue(encode_increment(2, 1))
    with pytest.raises(IngressFullError, match="stopping"):
        await refused
    store.released.set()
    async with asyncio.timeout(10):
        assert (await held).first_position == 1  # what was queued still lands
        await running


async def test_senders_waiting_for_room_are_refused_when_the_sequencer_stops() -> None:
    store = HeldLogStore()
    sequencer, ingress = _ingress(store, max_pending_entries=1)
    running = asyncio.create_task(sequencer.run())
    store.released.clear()
    held = await ingress.enqueue(encode_increment(1, 1))
    async with asyncio.timeout(10):
        await store.appending.wait()  # taken into a record, its append in flight
    queued = await ingress.enqueue(encode_increment(2, 1))
    waiting = [asyncio.create_task(ingress.enqueue(encode_increment(3 + k, 1))) for k in range(3)]
    await asyncio.sleep(0)
    assert not any(task.done() for task in waiting)
    sequencer.stop()
    async with asyncio.timeout(10):
        for task in waiting:
            with pytest.raises(IngressFullError, match="stopping"):
                await (await task)
        store.released.set()
        assert [(await held).first_position, (await queued).first_position] == [1, 2]
        await running
    # After the end, refused at once too.
    with pytest.raises(IngressFullError):
        await (await ingress.enqueue(encode_increment(9, 1)))
