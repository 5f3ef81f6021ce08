"""A sampled order's rows on their way to PostgreSQL, in the order's trace.

The shard marks the fill and order-update items of a sampled order with the trace of
their settlement (`ShardEgress.trace_parent`, `services/shard/settlement_traces.py`).
The egress follower notes each such item as it buffers it; once the transaction that
holds it commits, a "persister.write_rows" span covers that write, from its start to
its commit, under the settlement: one span per trace and write, however many of the
order's rows it held. Unsampled items cost one field check; at most `MAX_PENDING`
marks wait (the oldest dropped past it, counted).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from services.observability.tracing import context_of, tracer

_tracer = tracer(__name__)
MAX_PENDING = 1_024


@dataclass(frozen=True, slots=True)
class _Mark:
    position: int
    trace_parent: str
    order_id: str
    kind: str


class WriteTraces:
    def __init__(self, capacity: int = MAX_PENDING) -> None:
        self.capacity = capacity
        self._pending: deque[_Mark] = deque()
        self.dropped = 0
        self.spans = 0

    def __bool__(self) -> bool:
        return bool(self._pending)

    def received(self, position: int, trace_parent: str, order_id: str, kind: str) -> None:
        if len(self._pending) >= self.capacity:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(_Mark(position, trace_parent, order_id, kind))

    def committed(self, through: int, started_ns: int) -> None:
        """The write that began at `started_ns` committed every position up to
        `through`: a span for each trace it held."""
        pending = self._pending
        written: dict[str, list[_Mark]] = {}
        while pending and pending[0].position <= through:
            mark = pending.popleft()
            written.setdefault(mark.trace_parent, []).append(mark)
        ended_ns = time.time_ns()
        for trace_parent, marks in written.items():
            span = _tracer.start_span(
                "persister.write_rows",
                context=context_of(trace_parent),
                start_time=started_ns,
                attributes={
                    "oms.order_id": marks[0].order_id,
                    "oms.rows": ",".join(f"{mark.kind}@{mark.position}" for mark in marks),
                    "oms.through_position": through,
                },
            )
            span.end(end_time=ended_ns)
            self.spans += 1
