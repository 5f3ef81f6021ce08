"""Command ingress: received batches become log entries, with backpressure.

A gRPC stream hands over one serialized command batch at a time; each becomes
one log entry (the batch is the unit a sender already chose, so it is never
re-encoded). When the sequencer's bounded queue is full the sender waits for
capacity instead of the queue growing: orders, cancels, fills and hydrations
are never dropped, their sender is slowed down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.runtime.errors import IngressFullError
from services.runtime.sequencer import Receipt, Sequencer

EgressT = TypeVar("EgressT")


@dataclass(frozen=True, slots=True)
class IngressStatistics:
    batches: int
    waits_for_capacity: int
    max_wait_ms: float


class CommandIngress(Generic[EgressT]):
    def __init__(self, sequencer: Sequencer[EgressT]) -> None:
        self._sequencer = sequencer
        self._batches = 0
        self._waits = 0
        self._max_wait_ns = 0
        self.holds = 0  # readers waiting for applied == durable (see RuntimeHost.settled)
        self._open = asyncio.Event()
        self._open.set()

    def hold(self) -> None:
        """New submissions wait until every `hold` is released."""
        self.holds += 1
        self._open.clear()

    def release(self) -> None:
        self.holds -= 1
        if not self.holds:
            self._open.set()

    async def submit(self, payload: bytes) -> tuple[int, Sequence[EgressT]]:
        """Append `payload` as one entry; return its position and its egress once durable."""
        receipt = await self.submit_receipt(payload)
        return receipt.first_position, receipt.outputs[0]

    async def submit_receipt(self, payload: bytes) -> Receipt[EgressT]:
        """As `submit`, with the consensus time of the entry too."""
        return await (await self.enqueue(payload))

    async def enqueue(self, payload: bytes) -> asyncio.Future[Receipt[EgressT]]:
        """Queue `payload` as one entry once admitted; the future resolves when durable.

        Waits while ingress is held or the sequencer is full, then queues at once:
        entries land in the order of the calls that awaited this one after another.
        A stream's reader awaits it for each batch in turn and awaits the futures
        elsewhere, so its batches are never reordered (matcher events carry
        sequences the shard checks; a later batch overtaking an earlier one while
        both waited would turn the earlier one into "already applied"). A payload
        the sequencer refuses comes back as a failed future, in its place.
        """
        sequencer = self._sequencer
        started = 0
        while True:
            while not self._open.is_set():
                await self._open.wait()
            try:
                future = sequencer.submit_many((payload,))
                break
            except IngressFullError as error:
                if sequencer.closed:
                    # Stopping or ended: waiting for room would wait for ever (and
                    # `wait_capacity` returns at once then: a loop that never yields).
                    return _failed(error)
                if not started:
                    started = time.perf_counter_ns()
                    self._waits += 1
                await sequencer.wait_capacity()
            except ValueError as error:
                return _failed(error)
        if started:
            self._max_wait_ns = max(self._max_wait_ns, time.perf_counter_ns() - started)
        self._batches += 1
        return future

    def fill_fraction(self) -> float:
        """How full the sequencer's queue is: 0 empty, 1 full (senders wait)."""
        sequencer = self._sequencer
        return sequencer.pending_entries / max(1, sequencer.settings.max_pending_entries)

    def statistics(self) -> IngressStatistics:
        return IngressStatistics(self._batches, self._waits, self._max_wait_ns / 1e6)


def _failed(error: BaseException) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
