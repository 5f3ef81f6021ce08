"""What a user reads of their account: orders, balances, positions.

A resident user's balances and positions are read from the shard (`GetActor`,
answered at a durable position); a user who is not resident is flat (no open
order, saga or reservation), so theirs are what PostgreSQL holds from the last
flush. The shard is asked first: a user leaves memory only after the flush is
written, so "not resident" implies the stored state is current. Orders, any of
them, are read from PostgreSQL as of the shard's position (`order`).
"""

from __future__ import annotations

from gateway.clusters import ShardCluster
from gateway.core.refusals import GatewayError
from gateway.history import stored_order_view
from gateway.hydrate_ahead import HydrateAhead
from gateway.routing import ShardRouter
from protos.oms.v1 import gateway_pb2, persister_pb2, shard_pb2
from services.markets.catalog import Market

G = gateway_pb2


def order_not_found(detail: str) -> GatewayError:
    return GatewayError(G.GATEWAY_ERROR_REASON_ORDER_NOT_FOUND, detail)


def unknown_user(user_id: int) -> GatewayError:
    return GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_USER, f"user {user_id} has no account")


class AccountQueries:
    def __init__(
        self,
        router: ShardRouter,
        hydrate_ahead: HydrateAhead,
        markets: dict[str, Market],
    ) -> None:
        self.router = router
        self.hydrate_ahead = hydrate_ahead
        self.markets = markets

    async def _actor(
        self, user_id: int, *, orders_only: bool = False
    ) -> tuple[ShardCluster, shard_pb2.ActorView]:
        """The user's cluster, and its actor as that cluster's shard has it."""
        cluster = await self.router.cluster(user_id)
        view = await cluster.shard.actor(user_id, orders_only=orders_only)
        if view.resident:
            self.hydrate_ahead.note_resident(user_id)
        return cluster, view

    async def _stored_state(self, cluster: ShardCluster, user_id: int) -> shard_pb2.UserState:
        stored = await cluster.persister.stored_user(user_id)
        if not stored.known:
            raise unknown_user(user_id)
        return stored.state

    async def order(self, request: gateway_pb2.GetOrderRequest) -> gateway_pb2.OrderView:
        """Any order the user ever placed, from PostgreSQL as of the shard's position at
        this call: the persister answers once everything the shard had applied is
        written, so an order whose row is still in the write-behind is found, with the
        status it has now. With PostgreSQL out of reach, an open order still comes from
        the shard's index."""
        user_id = request.user_id
        cluster, view = await self._actor(user_id, orders_only=True)
        query = persister_pb2.StoredOrderQuery(
            order_id=request.order_id,
            client_order_id="" if request.order_id else request.client_order_id,
            user_id=user_id,
            as_of_position=view.as_of_position,
        )
        try:
            stored = await cluster.persister.stored_order(query)
        except GatewayError as error:
            if error.reason != G.GATEWAY_ERROR_REASON_UNAVAILABLE:
                raise
            for open_order in view.open_orders:
                if (request.order_id and open_order.order_id == request.order_id) or (
                    request.client_order_id
                    and open_order.client_order_id == request.client_order_id
                ):
                    return open_view(open_order)
            raise
        if (
            stored is None
            or stored.user_id != user_id
            or (request.client_order_id and stored.client_order_id != request.client_order_id)
        ):
            which = request.order_id or f"with client_order_id {request.client_order_id!r}"
            raise order_not_found(f"no order {which} for user {user_id}")
        return stored_order_view(stored)

    async def open_orders(
        self, request: gateway_pb2.GetOpenOrdersRequest
    ) -> gateway_pb2.OpenOrders:
        _, view = await self._actor(request.user_id, orders_only=True)
        answer = gateway_pb2.OpenOrders()
        for open_order in view.open_orders:
            if not request.symbol or open_order.symbol == request.symbol:
                answer.orders.append(open_view(open_order))
        return answer

    async def balances(self, request: gateway_pb2.GetBalancesRequest) -> gateway_pb2.Balances:
        user_id = request.user_id
        cluster, view = await self._actor(user_id)
        state = view.state if view.resident else await self._stored_state(cluster, user_id)
        answer = gateway_pb2.Balances()
        for balance in sorted(state.balances, key=lambda b: b.asset):
            answer.balances.add(asset=balance.asset, total=balance.total, reserved=balance.reserved)
        return answer

    async def positions(self, request: gateway_pb2.GetPositionsRequest) -> gateway_pb2.Positions:
        user_id = request.user_id
        cluster, view = await self._actor(user_id)
        state = view.state if view.resident else await self._stored_state(cluster, user_id)
        marks = {mark.symbol: mark.price_ticks for mark in view.marks}
        answer = gateway_pb2.Positions(reduce_only=state.reduce_only)
        for position in sorted(state.positions, key=lambda p: p.symbol):
            mark = marks.get(position.symbol, 0)
            market = self.markets.get(position.symbol)
            unrealized = 0
            if mark > 0 and position.quantity_lots and market is not None:
                # Value at the mark minus what the open quantity cost (the shard's own rule).
                unrealized = position.quantity_lots * mark * market.tick_size - position.cost_basis
            answer.positions.add(
                symbol=position.symbol,
                quantity_lots=position.quantity_lots,
                cost_basis=position.cost_basis,
                realized_pnl=position.realized_pnl,
                mark_price_ticks=mark,
                unrealized_pnl=unrealized,
            )
        return answer


def open_view(order: shard_pb2.OpenOrderView) -> gateway_pb2.OrderView:
    return gateway_pb2.OrderView(
        order_id=order.order_id,
        client_order_id=order.client_order_id,
        symbol=order.symbol,
        side=order.side,
        order_type=order.order_type,
        price_ticks=order.price_ticks,
        quantity_lots=order.quantity_lots,
        filled_lots=order.filled_lots,
        remaining_lots=order.remaining_lots,
        status=order.status,
        time_in_force=order.time_in_force,
        quote_amount=order.quote_amount,
    )
