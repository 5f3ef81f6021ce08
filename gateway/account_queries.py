"""What a user reads of their account: orders, balances, positions.

A resident user is read from the shard (`GetActor`, answered at a durable
position); a user who is not resident is flat (no open order, saga or
reservation), so their balances and positions are what PostgreSQL holds from
the last flush, and a finished order is read from the persister's order rows.
The shard is asked first: a user leaves memory only after the flush is
written, so "not resident" implies the stored state is current.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError
from gateway.hydrate_ahead import HydrateAhead
from gateway.persister_client import PersisterClient
from gateway.routing import ShardRouter
from protos.oms.v1 import gateway_pb2, persister_pb2, shard_pb2
from services.markets.catalog import Market

G = gateway_pb2
WRITE_BEHIND_WAIT_S = 2.0
WRITE_BEHIND_POLL_S = 0.02


def _issued(order_id: str, user_id: int, user_seq: int) -> bool:
    """Whether `order_id` is one the shard already issued to this user."""
    parts = order_id.split(":")
    return (
        len(parts) == 3
        and parts[1] == str(user_id)
        and parts[2].isdigit()
        and 0 < int(parts[2]) <= user_seq
    )


def order_not_found(detail: str) -> GatewayError:
    return GatewayError(G.GATEWAY_ERROR_REASON_ORDER_NOT_FOUND, detail)


def unknown_user(user_id: int) -> GatewayError:
    return GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_USER, f"user {user_id} has no account")


class AccountQueries:
    def __init__(
        self,
        router: ShardRouter,
        persister: PersisterClient,
        hydrate_ahead: HydrateAhead,
        markets: dict[str, Market],
    ) -> None:
        self.router = router
        self.persister = persister
        self.hydrate_ahead = hydrate_ahead
        self.markets = markets

    async def _actor(self, user_id: int) -> shard_pb2.ActorView:
        view = await self.router.endpoint(user_id).actor(user_id)
        if view.resident:
            self.hydrate_ahead.note_resident(user_id)
        return view

    async def _stored_state(self, user_id: int) -> shard_pb2.UserState:
        stored = await self.persister.stored_user(user_id)
        if not stored.known:
            raise unknown_user(user_id)
        return stored.state

    async def order(self, request: gateway_pb2.GetOrderRequest) -> gateway_pb2.OrderView:
        user_id = request.user_id
        view = await self._actor(user_id)
        for open_order in view.open_orders:
            if (request.order_id and open_order.order_id == request.order_id) or (
                request.client_order_id and open_order.client_order_id == request.client_order_id
            ):
                return open_view(open_order)
        order_id = request.order_id
        if not order_id:
            recent = (
                view.state.recent if view.resident else (await self._stored_state(user_id)).recent
            )
            order_id = next(
                (r.order_id for r in recent if r.client_order_id == request.client_order_id), ""
            )
            if not order_id:
                raise order_not_found(f"no order with client_order_id {request.client_order_id!r}")
        stored = await self.persister.stored_order(order_id, user_id)
        if stored is None and view.resident and _issued(order_id, user_id, view.state.user_seq):
            stored = await self._row_on_its_way(order_id, user_id)
        if stored is None or stored.user_id != user_id:
            raise order_not_found(f"no order {order_id!r} for user {user_id}")
        return stored_view(stored)

    async def _row_on_its_way(
        self, order_id: str, user_id: int
    ) -> persister_pb2.StoredOrder | None:
        """The shard issued this id and no longer holds the order: its row is in the
        persister's write-behind (about 10 ms, longer under load). Wait for it, bounded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WRITE_BEHIND_WAIT_S
        while loop.time() < deadline:
            await asyncio.sleep(WRITE_BEHIND_POLL_S)
            stored = await self.persister.stored_order(order_id, user_id)
            if stored is not None:
                return stored
        return None

    async def open_orders(
        self, request: gateway_pb2.GetOpenOrdersRequest
    ) -> gateway_pb2.OpenOrders:
        view = await self._actor(request.user_id)
        answer = gateway_pb2.OpenOrders()
        for open_order in view.open_orders:
            if not request.symbol or open_order.symbol == request.symbol:
                answer.orders.append(open_view(open_order))
        return answer

    async def balances(self, request: gateway_pb2.GetBalancesRequest) -> gateway_pb2.Balances:
        user_id = request.user_id
        view = await self._actor(user_id)
        state = view.state if view.resident else await self._stored_state(user_id)
        answer = gateway_pb2.Balances()
        for balance in sorted(state.balances, key=lambda b: b.asset):
            answer.balances.add(asset=balance.asset, total=balance.total, reserved=balance.reserved)
        return answer

    async def positions(self, request: gateway_pb2.GetPositionsRequest) -> gateway_pb2.Positions:
        user_id = request.user_id
        view = await self._actor(user_id)
        state = view.state if view.resident else await self._stored_state(user_id)
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
    )


def stored_view(order: persister_pb2.StoredOrder) -> gateway_pb2.OrderView:
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
    )
