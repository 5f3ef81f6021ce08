"""`CancelAllOrders` through the gateway, on real processes: every live order of the user,
or one symbol's, on every matcher group, in one request; by the unary call, on the Trade
stream (`oms client cancel-all`: tests/gateway/test_client_command.py).

Orders on BTC-USDT (matcher group g1) and SOL-USDT (g2) rest; one cancel-all of one
symbol, then one of all, end every one of them CANCELLED with their reservations
released, and nobody else's orders are touched. A retry sends nothing again. An unknown
symbol is refused by the gateway's validation.
"""

from __future__ import annotations

import functools

import grpc

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import (
    PRICE,
    SOL,
    account_state,
    assert_refused,
    buy,
    eventually,
    open_account,
    refusal,
)

USDT_FUNDS = 10_000_000_000  # 10,000 USDT
SOL_PRICE = 15_000  # SOL-USDT's reference price in ticks; 100 lots are 1.5 USDT
OPEN = common_pb2.ORDER_STATUS_OPEN
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED


def sol_buy(client: OmsClient, client_order_id: str) -> gateway_pb2.PlaceOrderRequest:
    return client.place_request(
        client_order_id, SOL, common_pb2.SIDE_BUY, price_ticks=SOL_PRICE, quantity_lots=100
    )


async def resting(client: OmsClient, requests: list[gateway_pb2.PlaceOrderRequest]) -> list[str]:
    """Place each and wait until all rest; their order ids, in the order placed."""
    order_ids = []
    for request in requests:
        ack = await client.place_order(request)
        assert ack.accepted, ack
        order_ids.append(ack.order_id)
    await eventually(
        client.open_orders,
        lambda orders: set(order_ids) <= {o.order_id for o in orders if o.status == OPEN},
    )
    return order_ids


async def all_cancelled(client: OmsClient, order_ids: list[str]) -> None:
    """Each order ends CANCELLED, nothing is open and nothing stays reserved."""
    state = await eventually(
        lambda: account_state(client),
        lambda s: not s.open_orders and all(reserved == 0 for _, reserved in s.balances.values()),
    )
    assert state.balances["USDT"] == (USDT_FUNDS, 0)
    for order_id in order_ids:
        view = await eventually(
            functools.partial(client.get_order, order_id=order_id),
            lambda v: v.status == CANCELLED,
        )
        assert view.order_id == order_id


async def test_one_symbol_then_every_symbol_on_every_matcher_group(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    bystander = await open_account(admin, {"USDT": USDT_FUNDS})
    async with (
        account.client(shared_mesh.gateway.address) as client,
        bystander.client(shared_mesh.gateway.address) as other,
    ):
        (kept,) = await resting(other, [buy(other, "theirs", 1)])
        btc_buys = [buy(client, f"b{n}", 1, price_ticks=PRICE - n) for n in range(3)]
        btc = await resting(client, btc_buys)
        sol = await resting(client, [sol_buy(client, "s1"), sol_buy(client, "s2")])
        only_sol = await client.cancel_all(symbol=SOL)
        assert only_sol.accepted and not only_sol.reject_reason, only_sol
        assert list(only_sol.cancelled_order_ids) == sol
        assert only_sol.stamp.position > 0
        every = await client.cancel_all()
        assert every.accepted, every
        # The SOL orders' cancels may still be on their way (counted), or done (not live).
        assert list(every.cancelled_order_ids) == btc
        assert every.already_cancelling <= len(sol)
        again = await client.cancel_all()
        assert again.accepted and not again.cancelled_order_ids, again
        await all_cancelled(client, btc + sol)
        nothing = await client.cancel_all()
        assert nothing.accepted and not nothing.cancelled_order_ids
        assert nothing.already_cancelling == 0
        # The other user's order rests on.
        view = await other.get_order(order_id=kept)
        assert view.status == OPEN


async def test_on_the_trade_stream_and_refusals(shared_mesh: FullMesh, admin: AdminClient) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        placed = await resting(client, [buy(client, "t1", 1), sol_buy(client, "t2")])
        error = await refusal(client.cancel_all(symbol="DOGE-USDT"))
        assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_SYMBOL")
        async with client.trade() as stream:
            unknown, every = await stream.submit(
                [
                    gateway_pb2.CancelAllOrdersRequest(user_id=account.user_id, symbol="DOGE-USDT"),
                    gateway_pb2.CancelAllOrdersRequest(user_id=account.user_id),
                ]
            )
        assert unknown.WhichOneof("response") == "error", unknown
        assert unknown.error.reason == gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL
        assert every.WhichOneof("response") == "cancel_all", every
        assert every.cancel_all.accepted
        assert list(every.cancel_all.cancelled_order_ids) == placed
        await all_cancelled(client, placed)
        # Another user's account is refused, as for a cancel.
        async with client.trade() as stream:
            (theirs,) = await stream.submit(
                [gateway_pb2.CancelAllOrdersRequest(user_id=account.user_id + 1_000_000)]
            )
        assert theirs.error.reason == gateway_pb2.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT
