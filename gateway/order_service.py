"""`oms.v1.OrderGateway`: place, cancel, queries, order updates and the Trade stream.

Every call arrives authenticated and authorized (`GatewayInterceptor`), so the
handlers validate, route and translate only. Orders and cancels travel to the
shard through the process's one shared `ShardLink`; a refusal by the shard is
an `OrderAck`/`CancelAck` with its reason, not an RPC error.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from gateway.account_queries import AccountQueries
from gateway.authentication import caller
from gateway.core.acks import (
    cancel_ack,
    cancel_all_ack,
    cancel_all_after_ack,
    cancel_all_after_command,
    cancel_all_command,
    cancel_command,
    order_ack,
    place_command,
)
from gateway.core.validation import RequestValidator
from gateway.direct_orders import submit_directly
from gateway.disconnect_sessions import DisconnectSession
from gateway.history import HistoryQueries
from gateway.order_updates import OrderUpdateFanout
from gateway.routing import ShardRouter
from gateway.statistics import GatewayCounters
from gateway.trade_stream import TradeSession
from protos.oms.v1 import gateway_pb2, shard_pb2
from services.observability.metrics import ACK_LATENCY
from services.observability.tracing import trace_parent_of, tracer, tracing_enabled

SERVICE_NAME = "oms.v1.OrderGateway"
log = structlog.get_logger(__name__)
_tracer = tracer(__name__)
# The histogram's series for unary calls, looked up once (a lookup by labels costs as
# much as the rest of the observation).
_UNARY_ACK_LATENCY = {
    outcome: ACK_LATENCY.labels("unary", outcome) for outcome in ("accepted", "refused", "error")
}
Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)


class OrderService:
    def __init__(
        self,
        *,
        validator: RequestValidator,
        router: ShardRouter,
        queries: AccountQueries,
        history: HistoryQueries,
        order_updates: OrderUpdateFanout,
        counters: GatewayCounters,
        trade_in_flight: int,
        request_deadline_s: float,
    ) -> None:
        self.validator = validator
        self.router = router
        self.queries = queries
        self.history = history
        self.order_updates = order_updates
        self.counters = counters
        self.trade_in_flight = trade_in_flight
        self.request_deadline_s = request_deadline_s

    # --- orders (shared by the unary calls and the Trade stream) ---------------------------

    async def place(
        self, request: gateway_pb2.PlaceOrderRequest, session_id: int = 0
    ) -> gateway_pb2.OrderAck:
        """`session_id`: the Trade stream's cancel-on-disconnect session (0: none)."""
        if not tracing_enabled():
            command = place_command(request)
            command.place.session_id = session_id
            result = await self.router.execute(request.user_id, command)
            ack = order_ack(request.client_order_id, result)
            self.counters.add("orders_accepted" if ack.accepted else "orders_refused")
            return ack
        # A sampled order's trace continues in the shard's log and on to the matcher.
        with _tracer.start_as_current_span("gateway.place_order") as span:
            command = place_command(request)
            command.place.session_id = session_id
            command.place.trace_parent = trace_parent_of(span)
            result = await self.router.execute(request.user_id, command)
            # Inside the span, so the line carries the order's trace id.
            log.debug(
                "gateway.order_placed",
                user_id=request.user_id,
                client_order_id=request.client_order_id,
                order_id=result.order_id,
                accepted=result.accepted,
            )
        ack = order_ack(request.client_order_id, result)
        self.counters.add("orders_accepted" if ack.accepted else "orders_refused")
        return ack

    async def cancel(self, request: gateway_pb2.CancelOrderRequest) -> gateway_pb2.CancelAck:
        result = await self.router.execute(request.user_id, cancel_command(request))
        return cancel_ack(result)

    async def cancel_all(
        self, request: gateway_pb2.CancelAllOrdersRequest
    ) -> gateway_pb2.CancelAllAck:
        result = await self.router.execute(request.user_id, cancel_all_command(request))
        return cancel_all_ack(result)

    def check_trade_request(self, request: gateway_pb2.TradeRequest) -> None:
        if request.HasField("place"):
            self.validator.place(request.place)
        elif request.HasField("cancel_all"):
            self.validator.symbol_filter(request.cancel_all.symbol)
        else:
            self.validator.order_reference(request.cancel.order_id, request.cancel.client_order_id)

    # --- handlers -------------------------------------------------------------------------

    async def place_order(
        self, request: gateway_pb2.PlaceOrderRequest, context: Context
    ) -> gateway_pb2.OrderAck:
        self.validator.place(request)
        started = time.perf_counter()
        outcome = "error"
        try:
            ack = await self.place(request)
            outcome = "accepted" if ack.accepted else "refused"
            return ack
        finally:
            _UNARY_ACK_LATENCY[outcome].observe(time.perf_counter() - started)

    async def cancel_order(
        self, request: gateway_pb2.CancelOrderRequest, context: Context
    ) -> gateway_pb2.CancelAck:
        self.validator.order_reference(request.order_id, request.client_order_id)
        return await self.cancel(request)

    async def cancel_all_orders(
        self, request: gateway_pb2.CancelAllOrdersRequest, context: Context
    ) -> gateway_pb2.CancelAllAck:
        self.validator.symbol_filter(request.symbol)
        return await self.cancel_all(request)

    async def cancel_all_after(
        self, request: gateway_pb2.CancelAllAfterRequest, context: Context
    ) -> gateway_pb2.CancelAllAfterAck:
        # The timeout's range is the shard's to decide: INVALID_TIMEOUT in the ack.
        result = await self.router.execute(request.user_id, cancel_all_after_command(request))
        return cancel_all_after_ack(result)

    async def get_order(
        self, request: gateway_pb2.GetOrderRequest, context: Context
    ) -> gateway_pb2.OrderView:
        self.validator.order_reference(request.order_id, request.client_order_id)
        return await self.queries.order(request)

    async def get_open_orders(
        self, request: gateway_pb2.GetOpenOrdersRequest, context: Context
    ) -> gateway_pb2.OpenOrders:
        self.validator.symbol_filter(request.symbol)
        return await self.queries.open_orders(request)

    async def get_balances(
        self, request: gateway_pb2.GetBalancesRequest, context: Context
    ) -> gateway_pb2.Balances:
        return await self.queries.balances(request)

    async def get_positions(
        self, request: gateway_pb2.GetPositionsRequest, context: Context
    ) -> gateway_pb2.Positions:
        return await self.queries.positions(request)

    async def list_orders(
        self, request: gateway_pb2.ListOrdersRequest, context: Context
    ) -> gateway_pb2.OrderHistory:
        return await self.history.orders(request)

    async def list_fills(
        self, request: gateway_pb2.ListFillsRequest, context: Context
    ) -> gateway_pb2.FillHistory:
        return await self.history.fills(request)

    async def stream_order_updates(
        self, request: gateway_pb2.StreamOrderUpdatesRequest, context: Context
    ) -> AsyncIterator[shard_pb2.OrderUpdate]:
        async for update in self.order_updates.stream(request.user_id, context):
            yield update

    async def trade(
        self, requests: AsyncIterator[gateway_pb2.TradeRequestBatch], context: Context
    ) -> AsyncIterator[gateway_pb2.TradeResponseBatch]:
        # Admitted (the interceptor authenticated and authorized the stream): say so at
        # once. A client that waits for this before writing never races a refusal, whose
        # status grpc.aio can lose to a write issued as it arrives (grpc/grpc#36066: the
        # client then sees INTERNAL "Internal error from Core" instead).
        await context.send_initial_metadata(())
        session = TradeSession(
            caller.get(),
            check=self.check_trade_request,
            place=self.place,
            cancel=self.cancel,
            cancel_all=self.cancel_all,
            counters=self.counters,
            max_in_flight=self.trade_in_flight,
            deadline_s=self.request_deadline_s,
            submit=functools.partial(submit_directly, self.router),
            open_session=functools.partial(DisconnectSession, self.router),
        )
        context.add_done_callback(lambda _: session.ended())
        async for batch in session.run(requests):
            yield batch

    # --- wiring ---------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        g = gateway_pb2
        unary = grpc.unary_unary_rpc_method_handler

        def call(handler: Any, request: Any, response: Any) -> Any:
            return unary(
                handler,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        handlers = {
            "PlaceOrder": call(self.place_order, g.PlaceOrderRequest, g.OrderAck),
            "CancelOrder": call(self.cancel_order, g.CancelOrderRequest, g.CancelAck),
            "CancelAllOrders": call(
                self.cancel_all_orders, g.CancelAllOrdersRequest, g.CancelAllAck
            ),
            "CancelAllAfter": call(
                self.cancel_all_after, g.CancelAllAfterRequest, g.CancelAllAfterAck
            ),
            "GetOrder": call(self.get_order, g.GetOrderRequest, g.OrderView),
            "GetOpenOrders": call(self.get_open_orders, g.GetOpenOrdersRequest, g.OpenOrders),
            "GetBalances": call(self.get_balances, g.GetBalancesRequest, g.Balances),
            "GetPositions": call(self.get_positions, g.GetPositionsRequest, g.Positions),
            "ListOrders": call(self.list_orders, g.ListOrdersRequest, g.OrderHistory),
            "ListFills": call(self.list_fills, g.ListFillsRequest, g.FillHistory),
            "StreamOrderUpdates": grpc.unary_stream_rpc_method_handler(
                self.stream_order_updates,
                request_deserializer=g.StreamOrderUpdatesRequest.FromString,
                response_serializer=shard_pb2.OrderUpdate.SerializeToString,
            ),
            "Trade": grpc.stream_stream_rpc_method_handler(
                self.trade,
                request_deserializer=g.TradeRequestBatch.FromString,
                response_serializer=g.TradeResponseBatch.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
