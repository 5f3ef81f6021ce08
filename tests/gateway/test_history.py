"""Every order a user placed, and every fill, through the public API.

GetOrder answers for any order, open or long finished, by order id or client
order id, also the moment after it finished (its row still in the write-behind);
ListOrders and ListFills page through the history oldest first, filter by
symbol, status and time, refuse a cursor made under other filters, and agree
with the balances.
"""

from __future__ import annotations

import asyncio

import grpc

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from tests.e2e.account_audit import audit_account
from tests.full_mesh import FullMesh
from tests.gateway.accounts import (
    PRICE,
    SOL,
    assert_refused,
    buy,
    eventually,
    open_account,
    refusal,
)

S = common_pb2
WHALE = shard_pb2.USER_TIER_WHALE
FUNDS = {"USDT": 10**13, "BTC": 10**10, "ETH": 10**12, "SOL": 10**13}
ETH = "ETH-USDT"
ETH_PRICE = 360_000  # 3 lots: 1,080,000, above the minimum notional
SOL_PRICE = 16_500
# More orders than a user's window of recent results (1,000): the oldest are found
# only in PostgreSQL.
BEYOND_RECENT = 1_100


async def _no_open_orders(client: OmsClient) -> None:
    await eventually(client.open_orders, lambda orders: not orders, timeout_s=30)


async def test_get_order_finds_every_order_beyond_the_recent_window(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS, tier=WHALE)
    async with account.client(shared_mesh.gateway.address) as client:
        orders = [
            buy(client, f"old-{n}", 1, price_ticks=PRICE - 100_000) for n in range(BEYOND_RECENT)
        ]
        async with client.trade() as stream:
            answers = await stream.submit(orders, timeout_s=60)
            assert all(answer.place.accepted for answer in answers), answers[0]
            order_ids = [answer.place.order_id for answer in answers]
            cancels = [
                gateway_pb2.CancelOrderRequest(user_id=client.user_id, order_id=order_id)
                for order_id in order_ids
            ]
            cancelled = await stream.submit(cancels, timeout_s=60)
            assert all(answer.cancel.accepted for answer in cancelled), cancelled[0]
        await _no_open_orders(client)

        async def check(request: gateway_pb2.PlaceOrderRequest, order_id: str) -> None:
            by_client_id = await client.get_order(client_order_id=request.client_order_id)
            by_id = await client.get_order(order_id=order_id)
            assert by_client_id == by_id, (by_client_id, by_id)
            assert (by_id.order_id, by_id.client_order_id) == (order_id, request.client_order_id)
            assert by_id.status == S.ORDER_STATUS_CANCELLED and by_id.remaining_lots == 1
            assert by_id.accepted_at_ms > 0 and by_id.updated_at_ms >= by_id.accepted_at_ms

        for start in range(0, BEYOND_RECENT, 100):
            await asyncio.gather(
                *(
                    check(request, order_id)
                    for request, order_id in zip(
                        orders[start : start + 100], order_ids[start : start + 100], strict=True
                    )
                )
            )
        history = await client.order_history(limit=1_000)
    assert [order.order_id for order in history] == order_ids


async def test_an_order_is_found_the_moment_it_is_acknowledged_and_finished(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS, tier=WHALE)
    async with account.client(shared_mesh.gateway.address) as client:
        for n in range(100):
            # An IOC far from the book: the matcher cancels it at once.
            ack = await client.place_order(
                buy(
                    client,
                    f"ioc-{n}",
                    1,
                    price_ticks=PRICE - 100_000,
                    time_in_force=S.TIME_IN_FORCE_IOC,
                )
            )
            assert ack.accepted, ack
            found = await client.get_order(client_order_id=f"ioc-{n}")
            assert found.order_id == ack.order_id
            assert found.status in (S.ORDER_STATUS_PENDING, S.ORDER_STATUS_CANCELLED), found
        final = await client.get_order(client_order_id="ioc-0")
        assert final.status == S.ORDER_STATUS_CANCELLED


async def test_histories_page_filter_and_agree_with_the_balances(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    # ETH-USDT is traded by no other test on this mesh; SOL-USDT at a price none uses.
    address = shared_mesh.gateway.address
    buyer = await open_account(admin, FUNDS, tier=WHALE)
    seller = await open_account(admin, FUNDS, tier=WHALE)
    async with buyer.client(address) as buying, seller.client(address) as selling:
        # Three ETH trades of 3 lots each, one SOL trade, and a bid that is cancelled.
        for n in range(3):
            ask = await selling.place(
                f"ask-{n}", ETH, S.SIDE_SELL, price_ticks=ETH_PRICE, quantity_lots=3
            )
            bid = await buying.place(
                f"bid-{n}", ETH, S.SIDE_BUY, price_ticks=ETH_PRICE, quantity_lots=3
            )
            assert ask.accepted and bid.accepted
        await selling.place("sol-ask", SOL, S.SIDE_SELL, price_ticks=SOL_PRICE, quantity_lots=100)
        await buying.place("sol-bid", SOL, S.SIDE_BUY, price_ticks=SOL_PRICE, quantity_lots=100)
        rest = await buying.place(
            "rest", ETH, S.SIDE_BUY, price_ticks=ETH_PRICE - 10_000, quantity_lots=3
        )
        assert (await buying.cancel(order_id=rest.order_id)).accepted
        await _cancel_what_rests(buying)
        await _cancel_what_rests(selling)

        story = await audit_account(buying, FUNDS, page_size=2)
        assert [o.client_order_id for o in story.orders] == [
            "bid-0", "bid-1", "bid-2", "sol-bid", "rest",
        ]  # fmt: skip
        eth_fills = [f for f in story.fills if f.symbol == ETH]
        assert sum(f.quantity_lots for f in eth_fills) == 9
        assert all((f.base_asset, f.quote_asset) == ("ETH", "USDT") for f in eth_fills)
        await audit_account(selling, FUNDS, page_size=3)

        eth = await buying.order_history(symbol=ETH)
        assert [o.client_order_id for o in eth] == ["bid-0", "bid-1", "bid-2", "rest"]
        cancelled = await buying.order_history(statuses=[S.ORDER_STATUS_CANCELLED])
        assert "rest" in [o.client_order_id for o in cancelled]
        assert all(o.status == S.ORDER_STATUS_CANCELLED for o in cancelled)
        sol_fills = await buying.fill_history(symbol=SOL)
        assert sum(f.base_amount for f in sol_fills) == 100 * 1_000_000
        first = story.orders[0].accepted_at_ms
        later = await buying.order_history(from_ms=first + 1)
        assert all(o.accepted_at_ms > first for o in later)
        assert await buying.order_history(to_ms=first) == []

        # A cursor belongs to its filters; a damaged one is refused; pages are bounded.
        page = await buying.list_orders(limit=2)
        assert page.next_cursor
        error = await refusal(buying.list_orders(symbol=ETH, limit=2, cursor=page.next_cursor))
        assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        error = await refusal(buying.list_orders(cursor="not-a-cursor"))
        assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        error = await refusal(buying.list_fills(limit=1_001))
        assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, "OUT_OF_RANGE")
        error = await refusal(buying.list_orders(symbol="DOGE-USDT"))
        assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_SYMBOL")


async def _cancel_what_rests(client: OmsClient) -> None:
    """Cancel whatever of the client's still rests (another test's order may have taken
    a counterparty first), until nothing is open."""

    async def cancel_all() -> list[gateway_pb2.OrderView]:
        orders = await client.open_orders()
        for order in orders:
            await client.cancel(order_id=order.order_id)
        return orders

    await eventually(cancel_all, lambda orders: not orders, timeout_s=30)


async def test_an_order_of_another_user_is_not_found(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    owner = await open_account(admin, FUNDS)
    other = await open_account(admin, FUNDS)
    async with owner.client(shared_mesh.gateway.address) as client:
        ack = await client.place_order(buy(client, "mine", 1, price_ticks=PRICE - 100_000))
    async with other.client(shared_mesh.gateway.address) as client:
        for call in (
            client.get_order(order_id=ack.order_id),
            client.get_order(client_order_id="mine"),
        ):
            error = await refusal(call)
            assert_refused(error, grpc.StatusCode.NOT_FOUND, "ORDER_NOT_FOUND")
        assert await client.order_history() == []
