"""The batched Trade stream: many orders in few messages, one answer per request id."""

from __future__ import annotations

from gateway.client import AdminClient
from protos.oms.v1 import gateway_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import PRICE, buy, limit_buy_reservation, open_account

WHALE = shard_pb2.USER_TIER_WHALE  # a deeper rate-limit bucket (5,000 orders)


async def test_many_orders_each_answered_once(shared_mesh: FullMesh, admin: AdminClient) -> None:
    account = await open_account(admin, {"USDT": 100_000_000_000}, tier=WHALE)
    address = shared_mesh.gateway.address
    before = await gateway_counters(address)
    count = 2_500
    async with account.client(address) as client, client.trade() as stream:
        orders = [buy(client, f"w-{n}", 1, price_ticks=PRICE - n % 50) for n in range(count)]
        answers = await stream.submit(orders)
        # Cancels travel the same stream.
        cancels = await stream.submit(
            [
                gateway_pb2.CancelOrderRequest(user_id=account.user_id, order_id=a.place.order_id)
                for a in answers[:100]
            ]
        )
        assert all(answer.cancel.accepted for answer in cancels), cancels[:3]
        assert set(stream.answers.values()) == {1}
        assert len(stream.answers) == count + 100
        balances = await client.balances()
    assert [answer.request_id for answer in answers] == list(range(1, count + 1))
    refused = [answer for answer in answers if not answer.place.accepted]
    assert not refused, refused[:3]
    order_ids = [answer.place.order_id for answer in answers]
    assert order_ids == [f"s1:{account.user_id}:{n}" for n in range(1, count + 1)]
    # Cancelled orders give their reservation back only once the matcher confirms.
    resting = sum(limit_buy_reservation(PRICE - n % 50, 1) for n in range(100, count))
    assert resting <= balances["USDT"].reserved <= resting + 100 * limit_buy_reservation(PRICE, 1)
    after = await gateway_counters(address)
    assert after["trade_requests.place"] - before.get("trade_requests.place", 0) == count
    # Batching: the shard saw the orders in far fewer messages than orders.
    batches = after["shard_batches_sent"] - before["shard_batches_sent"]
    assert batches < count / 5, batches


async def test_rate_limited_orders_come_back_retryable(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": 100_000_000_000})
    async with account.client(shared_mesh.gateway.address) as client, client.trade() as stream:
        answers = await stream.submit([buy(client, f"n-{n}", 1) for n in range(300)])
    limited = [a.place for a in answers if not a.place.accepted]
    assert limited, "a normal account's bucket holds 100 orders"
    assert {a.reject_reason for a in limited} == {shard_pb2.SHARD_REJECT_REASON_RATE_LIMITED}
    assert all(a.retryable for a in limited)
