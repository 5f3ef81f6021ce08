"""The matcher service: a matcher group's books as a state machine on the runtime.

Execute streams carry serialized `MatcherCommandBatch` bytes straight into the
log (one entry per batch, never re-encoded) with up to `max_inflight_batches`
in flight per stream, and answer each with its `MatcherResultBatch` once the
entry is durable. Subscribe serves one OMS shard's lifecycle events from a
sequence, never past what is durable: events are read from the engine's
retained window, bounded by the durable sequence the egress feed reports.
Queries wait until the state applied equals the state durable, so an answer
never reflects an entry that a crash could still lose; while one waits, Execute
streams hold new batches back, so the sequencer drains and the wait ends instead
of lasting until the load pauses (applying overlaps writing: under load the
state applied is nearly always one record ahead of the durable one).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from protos.oms.v1 import matcher_pb2
from services.clients.matcher_results import wants_exceptions_only
from services.coordination.writer_tokens import WriterFenced, WriterFences
from services.matcher.core.codec import result_batch_message
from services.matcher.core.errors import SequenceTooOldError
from services.matcher.core.event_log import FillEvent
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.matcher.core.market_feed import BookUpdate
from services.matcher.market_data import MarketDataServing
from services.observability.tracing import context_from_metadata, tracer
from services.runtime.hosting import HostPlan, RuntimeHost
from services.runtime.sequencer import Receipt
from services.runtime.upgrades import start_new_log_at
from services.serving.user_batches import user_batch_problem
from services.serving.writer_admission import admit_writer, superseded

log = structlog.get_logger(__name__)
_tracer = tracer(__name__)
SERVICE_NAME = "oms.v1.Matcher"
EVENTS_PER_MESSAGE = 1000
MAX_PRICE_INTERVAL_MS = 10_000


class DurableView:
    """What is durable, per OMS shard stream and per symbol, fed by the egress feed."""

    def __init__(self, machine: MatcherMachine) -> None:
        self.machine = machine
        self.changed = asyncio.Condition()
        self._read_machine()

    def _read_machine(self) -> None:
        """Start from the machine itself: only when it has applied nothing beyond what is
        durable (a replica taking the lead has; so has one just recovered)."""
        machine = self.machine
        self.sequences: dict[str, int] = {
            shard: stream.last_sequence for shard, stream in machine.engine.streams.items()
        }
        self.last_prices: dict[str, matcher_pb2.LastPrice] = {
            price.symbol: price for price in machine.last_prices()
        }
        # Per symbol, the newest durable book update and trade (version 2's feed).
        feed = machine.engine.feed
        self.book_sequences: dict[str, int] = {}
        self.trade_sequences: dict[str, int] = {}
        if feed is not None:
            for symbol, symbol_feed in feed.symbols.items():
                self.book_sequences[symbol] = symbol_feed.book_sequence
                self.trade_sequences[symbol] = symbol_feed.trade_sequence

    async def follow(self, host: RuntimeHost[MatcherEgress]) -> None:
        # A follower applied records while it followed, after this view was made.
        self._read_machine()
        async for record in host.feed.subscribe(host.feed.durable_position + 1):
            # Prices come from this record's fills, not from the machine: the machine may
            # already have applied the next record, whose trades are not durable yet.
            last_fills: dict[str, FillEvent] = {}
            for _, egress in record.items:
                for event in egress.events:
                    shard = event.spec.oms_shard
                    if event.sequence > self.sequences.get(shard, 0):
                        self.sequences[shard] = event.sequence
                    if isinstance(event, FillEvent):
                        last_fills[event.spec.symbol] = event
                for market in egress.market:
                    if isinstance(market, BookUpdate):
                        self.book_sequences[market.symbol] = market.book_sequence
                    else:
                        self.trade_sequences[market.symbol] = market.trade_sequence
            for symbol, fill in last_fills.items():
                self.last_prices[symbol] = matcher_pb2.LastPrice(
                    symbol=symbol,
                    price_ticks=fill.price_ticks,
                    trade_id=fill.trade_id,
                    consensus_time_ms=fill.consensus_time_ms,
                )
            async with self.changed:
                self.changed.notify_all()

    async def wait_change(self) -> None:
        async with self.changed:
            await self.changed.wait()


class MatcherServicer:
    def __init__(
        self,
        host: RuntimeHost[MatcherEgress],
        max_inflight: int,
        fences: WriterFences,
        version_at_start: int = 0,
    ) -> None:
        self.host = host
        self.version_at_start = version_at_start
        # Made before the host's sequencer runs: an empty log now is a new group's.
        self.new_log = host.node.replica.applied_position == 0
        self.fences = fences  # the bridges' terms (their tokens ride on Execute)
        self.machine: MatcherMachine = host.node.replica.machine  # type: ignore[assignment]
        self.view = DurableView(self.machine)
        self.max_inflight = max_inflight
        self.market_data = MarketDataServing(host, self.machine, self.view)

    async def execute(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        writer = await admit_writer(self.fences, context)
        exceptions_only = wants_exceptions_only(context.invocation_metadata())
        ingress = self.host.ingress
        window: asyncio.Queue[asyncio.Future[Receipt[MatcherEgress]] | None] = asyncio.Queue(
            self.max_inflight
        )
        fenced: list[WriterFenced] = []

        async def read_ahead() -> None:
            try:
                async for payload in requests:
                    if refusal := superseded(self.fences, writer):
                        fenced.append(refusal)  # a newer bridge writes now: nothing more
                        break
                    # In turn, so the stream's batches keep their order in the log.
                    await window.put(await ingress.enqueue(payload))
            except Exception:
                # The answers loop ends, then `await reader` raises this, instead of the
                # call waiting forever. (Cancelled: the call is going away anyway.)
                await window.put(None)
                raise
            await window.put(None)

        reader = asyncio.create_task(read_ahead())
        # A traced batch arrives on its own call carrying `traceparent` (the bridge opens one
        # per sampled order): its span covers the call, from the batch in to its results out.
        parent = context_from_metadata(context.invocation_metadata())
        span = None if parent is None else _tracer.start_span("matcher.execute", context=parent)
        try:
            while True:
                submitted = await window.get()
                if submitted is None:
                    break
                try:
                    outputs = (await submitted).outputs[0]
                except ValueError as error:  # over the log's entry size cap: nothing logged
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                    raise AssertionError("abort() raises") from error
                egress: MatcherEgress = outputs[0]
                if egress.refused is not None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, egress.refused)
                if not exceptions_only:
                    yield egress.result_batch().SerializeToString()
                elif exceptional := egress.exception_results():
                    yield result_batch_message(exceptional).SerializeToString()
            await reader
            if fenced:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(fenced[0]))
        finally:
            reader.cancel()
            if span is not None:
                span.end()

    async def subscribe(
        self, request: matcher_pb2.SubscribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[matcher_pb2.MatcherEventBatch]:
        shard = request.oms_shard
        next_sequence = max(1, request.from_sequence)
        while True:
            durable = self.view.sequences.get(shard, 0)
            if next_sequence <= durable:
                try:
                    events = self.machine.events_from(
                        shard, next_sequence, min(EVENTS_PER_MESSAGE, durable - next_sequence + 1)
                    )
                except SequenceTooOldError as error:
                    await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(error))
                if events:
                    next_sequence = events[-1].sequence + 1
                    yield matcher_pb2.MatcherEventBatch(events=events)
                    continue
            await self.view.wait_change()

    async def get_order(
        self, request: matcher_pb2.OrderQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> matcher_pb2.OrderState:
        await self.host.settled()
        state = self.machine.order_state(request.order_id)
        if state is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no order {request.order_id!r}")
            raise AssertionError("abort() raises")  # for type checkers: never reached
        return state

    async def get_open_orders(
        self, request: matcher_pb2.OpenOrdersQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> matcher_pb2.OpenOrdersSnapshot:
        await self.host.settled()
        return self.machine.open_orders(request.oms_shard, request.user_id)

    async def get_open_order_batch(
        self, request: matcher_pb2.OpenOrdersBatchQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> matcher_pb2.OpenOrdersBatch:
        if problem := user_batch_problem(request.user_ids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self.host.settled()
        batch = matcher_pb2.OpenOrdersBatch()
        for user_id in request.user_ids:
            snapshot = self.machine.open_orders(request.oms_shard, user_id)
            snapshot.user_id = user_id
            batch.snapshots.append(snapshot)
        return batch

    async def stream_last_prices(
        self, request: matcher_pb2.LastPriceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[matcher_pb2.LastPrice]:
        wanted = set(request.symbols)
        interval_s = min(request.min_interval_ms, MAX_PRICE_INTERVAL_MS) / 1000
        sent: dict[str, int] = {}
        while True:
            for symbol, price in list(self.view.last_prices.items()):
                if (not wanted or symbol in wanted) and sent.get(symbol) != price.trade_id:
                    sent[symbol] = price.trade_id
                    yield price
            await self.view.wait_change()
            if interval_s > 0:
                await asyncio.sleep(interval_s)  # prices of that span conflate: newest wins

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Execute": grpc.stream_stream_rpc_method_handler(
                self.execute, request_deserializer=None, response_serializer=None
            ),
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                self.subscribe,
                request_deserializer=matcher_pb2.SubscribeRequest.FromString,
                response_serializer=matcher_pb2.MatcherEventBatch.SerializeToString,
            ),
            "GetOrder": grpc.unary_unary_rpc_method_handler(
                self.get_order,
                request_deserializer=matcher_pb2.OrderQuery.FromString,
                response_serializer=matcher_pb2.OrderState.SerializeToString,
            ),
            "GetOpenOrders": grpc.unary_unary_rpc_method_handler(
                self.get_open_orders,
                request_deserializer=matcher_pb2.OpenOrdersQuery.FromString,
                response_serializer=matcher_pb2.OpenOrdersSnapshot.SerializeToString,
            ),
            "GetOpenOrderBatch": grpc.unary_unary_rpc_method_handler(
                self.get_open_order_batch,
                request_deserializer=matcher_pb2.OpenOrdersBatchQuery.FromString,
                response_serializer=matcher_pb2.OpenOrdersBatch.SerializeToString,
            ),
            "StreamLastPrices": grpc.unary_stream_rpc_method_handler(
                self.stream_last_prices,
                request_deserializer=matcher_pb2.LastPriceRequest.FromString,
                response_serializer=matcher_pb2.LastPrice.SerializeToString,
            ),
        }
        handlers.update(self.market_data.handlers())
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )

    def plan(self) -> HostPlan:
        return HostPlan(
            service_names=(SERVICE_NAME,),
            register=self.register,
            loops=[
                lambda: self.view.follow(self.host),
                self.start_new_log,
            ],
            metrics=[("matcher", self.metric_numbers)],
        )

    async def start_new_log(self) -> None:
        if self.new_log:
            await start_new_log_at(self.host, self.version_at_start)

    def metric_numbers(self) -> dict[str, int]:
        """For the metrics endpoint (a follower's are those of the log it has applied)."""
        return {
            name: int(value)
            for name, value in dataclasses.asdict(self.machine.statistics()).items()
        }
