"""StreamOrderUpdates: a user's own updates, never another user's; slow readers are cut off."""

from __future__ import annotations

import grpc
import pytest

from gateway.client import AdminClient, GatewayCallError, OrderUpdateStream
from protos.oms.v1 import common_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import BTC, PRICE, buy, eventually, open_account

S = common_pb2
CROSS_PRICE = PRICE + 777
SMALL_WINDOW = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 16_384),
)


async def updates_until(
    stream: OrderUpdateStream, order_id: str, status: int
) -> list[shard_pb2.OrderUpdate]:
    """Every update read until `order_id` reaches `status`."""
    seen: list[shard_pb2.OrderUpdate] = []
    while True:
        update = await stream.next()
        seen.append(update)
        if update.order_id == order_id and update.status == status:
            return seen


async def test_each_user_sees_only_their_own_updates(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    address = shared_mesh.gateway.address
    buyer = await open_account(admin, {"USDT": 10_000_000_000})
    seller = await open_account(admin, {"BTC": 1_000_000})
    async with (
        buyer.client(address) as buying,
        seller.client(address) as selling,
        buying.order_updates() as buyer_updates,
        selling.order_updates() as seller_updates,
    ):
        # Above every bid other tests leave on the shared book, so the ask meets this one.
        bid = await buying.place_order(buy(buying, "bid", 3, price_ticks=CROSS_PRICE))
        seen_by_buyer = await updates_until(buyer_updates, bid.order_id, S.ORDER_STATUS_OPEN)
        assert [u.status for u in seen_by_buyer] == [S.ORDER_STATUS_PENDING, S.ORDER_STATUS_OPEN]
        ask = await selling.place("ask", BTC, S.SIDE_SELL, price_ticks=CROSS_PRICE, quantity_lots=3)
        assert ask.accepted, ask
        # The seller's stream carries the seller's order only, up to its fill ...
        seen_by_seller = await updates_until(seller_updates, ask.order_id, S.ORDER_STATUS_FILLED)
        # ... and the buyer's stream the buyer's fill.
        seen_by_buyer += await updates_until(buyer_updates, bid.order_id, S.ORDER_STATUS_FILLED)
    assert {u.user_id for u in seen_by_buyer} == {buyer.user_id}
    assert {u.order_id for u in seen_by_buyer} == {bid.order_id}
    assert {u.user_id for u in seen_by_seller} == {seller.user_id}
    assert {u.order_id for u in seen_by_seller} == {ask.order_id}
    filled = seen_by_buyer[-1]
    assert (filled.filled_lots, filled.remaining_lots) == (3, 0)
    assert (filled.last_fill_price_ticks, filled.last_fill_lots) == (CROSS_PRICE, 3)
    assert filled.client_order_id == "bid" and filled.symbol == BTC
    assert filled.stamp.position > seen_by_buyer[0].stamp.position
    async with buyer.client(address) as buying:
        positions = await buying.positions()
        (position,) = positions.positions
        assert (position.symbol, position.quantity_lots) == (BTC, 3)
        assert (await buying.balances())["BTC"].total == 3 * 10_000


async def test_a_slow_subscriber_is_disconnected_and_others_keep_up(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    gateway = shared_mesh.new_gateway(
        "gateway-small-queues", environment={"OMS_GATEWAY_ORDER_UPDATE_QUEUE": "300"}
    )
    shared_mesh.start(gateway)
    account = await open_account(admin, {"USDT": 100_000_000_000}, tier=shard_pb2.USER_TIER_WHALE)
    rounds, per_round = 8, 100  # each order makes two updates (PENDING, OPEN)
    # The idle reader has a connection of its own with a small flow-control window: the
    # window fills (it never reads), then its queue at the gateway does.
    idle_channel = grpc.aio.insecure_channel(gateway.address, options=SMALL_WINDOW)
    async with (
        idle_channel,
        account.client(gateway.address) as client,
        account.client(gateway.address, channel=idle_channel) as idle_client,
        idle_client.order_updates() as idle,
        client.order_updates() as reader,
    ):
        assert (await gateway_counters(gateway.address))["stream_subscribers"] == 2
        async with client.trade() as stream:
            for round_number in range(rounds):
                orders = [buy(client, f"s-{round_number}-{n}", 1) for n in range(per_round)]
                answers = await stream.submit(orders)
                assert all(answer.place.accepted for answer in answers)
                opened = 0
                while opened < per_round:  # the reader keeps up, round by round
                    update = await reader.next()
                    opened += update.status == S.ORDER_STATUS_OPEN
        with pytest.raises(GatewayCallError) as cut_off:
            while True:
                await idle.next()
        assert cut_off.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert cut_off.value.reason == "GATEWAY_ERROR_REASON_SLOW_CONSUMER"
        counters = await eventually(
            lambda: gateway_counters(gateway.address), lambda c: c["stream_subscribers"] == 1
        )
        assert counters["order_update_slow_subscribers"] == 1


async def test_a_gateway_receives_only_the_updates_of_users_subscribed_there(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    """The shard sends a gateway the order updates of the users that have a subscriber
    there, and none while nobody subscribes (most clients never do; an update per order
    state for nobody was a third of the shard's messages)."""
    gateway = shared_mesh.new_gateway("gateway-updates-on-demand")
    shared_mesh.start(gateway)
    watched = await open_account(admin, {"USDT": 10_000_000_000})
    other = await open_account(admin, {"USDT": 10_000_000_000})
    async with watched.client(gateway.address) as watching, other.client(gateway.address) as busy:
        first = await watching.place_order(buy(watching, "before", 1))
        assert first.accepted
        assert (await busy.place_order(buy(busy, "unwatched-0", 1))).accepted
        async with watching.order_updates() as updates:
            placed = await watching.place_order(buy(watching, "watched", 1))
            assert (await busy.place_order(buy(busy, "unwatched-1", 1))).accepted
            seen = await updates_until(updates, placed.order_id, S.ORDER_STATUS_OPEN)
            assert {u.user_id for u in seen} == {watched.user_id}
            # The other user's order reached its matcher too (it is open there) ...
            await eventually(
                lambda: busy.get_order(client_order_id="unwatched-1"),
                lambda order: order.status == S.ORDER_STATUS_OPEN,
            )
        # ... yet the gateway received the watched user's updates only, none before its
        # subscriber came: PENDING and OPEN of "watched" (the first order's OPEN may have
        # come after the subscription, so at most one more).
        counters = await eventually(
            lambda: gateway_counters(gateway.address), lambda c: c["stream_subscribers"] == 0
        )
        assert 2 <= counters["order_updates_seen"] <= 3, counters
        assert (await busy.place_order(buy(busy, "unwatched-2", 1))).accepted
        assert (await watching.place_order(buy(watching, "after", 1))).accepted
        await eventually(
            lambda: watching.get_order(client_order_id="after"),
            lambda order: order.status == S.ORDER_STATUS_OPEN,
        )
        assert (await gateway_counters(gateway.address))["order_updates_seen"] == counters[
            "order_updates_seen"
        ]
