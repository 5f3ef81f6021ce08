"""Sampled orders through one matcher lane: a call of their own, and their spans.

An order the gateway sampled carries its W3C traceparent in `Order.trace_parent`
(set by the gateway, carried by the shard's log to `SubmitToME`). The matcher
starts its span from a call's `traceparent` metadata, and a batched call carries
many orders, so a sampled submit travels alone, on a short `Execute` call of its
own, under a "bridge.submit" span (child of the gateway's span). Each of the
order's events that comes back from the matcher (accepted or rejected, then every
fill, until the one that ends it) gets a "bridge.deliver_event" span under
"bridge.submit", for its way back to the shard (where the fill's settlement takes the
trace on: `services/shard/settlement_traces.py`). Unsampled orders cost one field
check here and start no span.

Ordering. A call of its own can overtake the lane's stream or be overtaken by
it; for the matcher only one order matters: a cancel must never arrive before
its own order's submit (it would be answered not_found and the order would
rest until the next re-drive). So a batch holding a cancel of an order whose
traced call is unanswered waits for that answer before it is written (rare: a
sampled order cancelled within a round trip). Everything else keeps flowing;
re-drives are still taken before fresh items, and a re-driven submit that is
sampled is traced like a fresh one (the matcher dedups the copy).

Bounds: at most `MAX_TRACED_CALLS` calls in flight per lane (past it a sampled
submit goes in the batch, counted, without the matcher leg) and at most
`MAX_AWAITING_EVENTS` orders remembered for their way back (oldest forgotten).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext

from bridge.saga_commands import CancelWork, Work, add_command
from bridge.statistics import BridgeStatistics
from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from services.coordination.writer_tokens import WriterCredential
from services.observability.tracing import context_of, metadata_for, tracer

_tracer = tracer(__name__)
MAX_TRACED_CALLS = 64
MAX_AWAITING_EVENTS = 4_096
TRACED_CALL_TIMEOUT_S = 10.0


class OrderTraces:
    def __init__(
        self, group: str, statistics: BridgeStatistics, credential: WriterCredential
    ) -> None:
        self.group = group
        self.statistics = statistics
        self.credential = credential
        # order id -> its traced call, for the connection that sent it
        self.calls: dict[str, asyncio.Task[None]] = {}
        # order id -> its bridge.submit span, until the event that ends the order
        self.awaiting: OrderedDict[str, SpanContext] = OrderedDict()

    def connection_started(self) -> None:
        """Forget the calls of a connection that ended (its task group cancelled them)."""
        self.calls.clear()

    async def divert(
        self,
        work: list[Work],
        stub: matcher_pb2_grpc.MatcherStub,
        tasks: asyncio.TaskGroup,
    ) -> list[Work]:
        """Start a call for each sampled submit in `work`; the rest, in order, for the batch.

        Returns once no cancel in the rest can overtake its order's traced submit. A
        failed call fails `tasks`, so the lane reconnects and re-drives from the shard.
        """
        counters = self.statistics.counters
        rest: list[Work] = []
        held: list[asyncio.Task[None]] = []
        for item in work:
            if isinstance(item, CancelWork):
                call = self.calls.get(item.order_id)
                if call is not None:
                    held.append(call)
                rest.append(item)
            elif not item.trace_parent or item.order_id in self.calls:
                rest.append(item)  # unsampled, or a copy of a submit already on its way
            elif len(self.calls) >= MAX_TRACED_CALLS:
                counters.traced_batched += 1
                rest.append(item)
            else:
                self.calls[item.order_id] = tasks.create_task(self._submit(stub, item))
        if held:
            counters.cancels_held += len(held)
            await asyncio.wait(held)
        return rest

    async def _submit(self, stub: matcher_pb2_grpc.MatcherStub, order: matcher_pb2.Order) -> None:
        counters = self.statistics.counters
        try:
            with _tracer.start_as_current_span(
                "bridge.submit",
                context=context_of(order.trace_parent),
                attributes={"oms.order_id": order.order_id, "oms.matcher_group": self.group},
            ) as span:
                self._await_event(order.order_id, span)
                batch = matcher_pb2.MatcherCommandBatch()
                add_command(batch, order, correlation_id=1)
                call = stub.Execute(
                    iter((batch,)),
                    metadata=(*metadata_for(span), *self.credential.metadata()),
                    timeout=TRACED_CALL_TIMEOUT_S,
                )
                async for answer in call:
                    for result in answer.results:
                        counters.matcher_duplicates += result.duplicate
                        span.set_attribute("oms.duplicate", result.duplicate)
                counters.submits_forwarded += 1
                counters.traced_submits += 1
        finally:
            if self.calls.get(order.order_id) is asyncio.current_task():
                del self.calls[order.order_id]

    def _await_event(self, order_id: str, span: Span) -> None:
        context = span.get_span_context()
        if not context.trace_flags.sampled:
            return
        self.awaiting[order_id] = context
        self.awaiting.move_to_end(order_id)
        while len(self.awaiting) > MAX_AWAITING_EVENTS:
            self.awaiting.popitem(last=False)

    def returning(self, events: Sequence[matcher_pb2.MatcherEvent]) -> list[Span]:
        """Open a bridge.deliver_event span for each event of an awaited order in
        `events`; the event that ends the order ends its wait."""
        if not self.awaiting:
            return []
        spans: list[Span] = []
        for event in events:
            parent = self.awaiting.get(event.order_id)
            if parent is None:
                continue
            if _ends_order(event):
                del self.awaiting[event.order_id]
            spans.append(
                _tracer.start_span(
                    "bridge.deliver_event",
                    context=trace.set_span_in_context(trace.NonRecordingSpan(parent)),
                    attributes={
                        "oms.order_id": event.order_id,
                        "oms.event": event.WhichOneof("event") or "",
                        "oms.matcher_sequence": event.sequence,
                        "oms.matcher_group": self.group,
                    },
                )
            )
        return spans

    @staticmethod
    def delivered(spans: Sequence[Span]) -> None:
        for span in spans:
            span.end()


def _ends_order(event: matcher_pb2.MatcherEvent) -> bool:
    kind = event.WhichOneof("event")
    return kind in ("rejected", "cancelled", "expired") or (
        kind == "fill" and event.fill.order_done
    )
