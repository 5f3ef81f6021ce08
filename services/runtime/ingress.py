"""Command ingress: received batches become log entries, with backpressure.

A gRPC stream hands over one serialized command batch at a time; each becomes
one log entry (the batch is the unit a sender already chose, so it is never
re-encoded). When the sequencer's bounded queue is full the sender waits for
capacity instead of the queue growing: orders, cancels, fills and hydrations
are never dropped, their sender is slowed down.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

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

    async def submit(self, payload: bytes) -> tuple[int, Sequence[EgressT]]:
        """Append `payload` as one entry; return its position and its egress once durable."""
        receipt = await self.submit_receipt(payload)
        return receipt.first_position, receipt.outputs[0]

    async def submit_receipt(self, payload: bytes) -> Receipt[EgressT]:
        """As `submit`, with the consensus time of the entry too."""
        sequencer = self._sequencer
        started = 0
        while True:
            try:
                future = sequencer.submit_many((payload,))
                break
            except IngressFullError:
                if sequencer.running is False:
                    raise
                if not started:
                    started = time.perf_counter_ns()
                    self._waits += 1
                await sequencer.wait_capacity()
        if started:
            self._max_wait_ns = max(self._max_wait_ns, time.perf_counter_ns() - started)
        receipt = await future
        self._batches += 1
        return receipt

    def statistics(self) -> IngressStatistics:
        return IngressStatistics(self._batches, self._waits, self._max_wait_ns / 1e6)
