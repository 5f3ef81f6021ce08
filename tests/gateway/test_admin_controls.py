"""Halt, resume and kill-switch through the admin API reach the owning matcher groups."""

from __future__ import annotations

from gateway.client import AdminClient, OmsClient, OrderUpdateStream
from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import SOL, buy, open_account

S = common_pb2
SOL_PRICE = 15_000  # SOL-USDT reference price in ticks; 100 lots are 1.5 USDT


async def final_update(updates: OrderUpdateStream, order_id: str) -> shard_pb2.OrderUpdate:
    """The first update of `order_id` past PENDING."""
    while True:
        update = await updates.next()
        if update.order_id == order_id and update.status != S.ORDER_STATUS_PENDING:
            return update


async def final_updates(
    updates: OrderUpdateStream, *order_ids: str
) -> dict[str, shard_pb2.OrderUpdate]:
    """The first update past PENDING of each order, in whatever order they come (orders
    of two matcher groups: either group's answer may come first)."""
    found: dict[str, shard_pb2.OrderUpdate] = {}
    while len(found) < len(order_ids):
        update = await updates.next()
        if update.order_id in order_ids and update.status != S.ORDER_STATUS_PENDING:
            found.setdefault(update.order_id, update)
    return found


async def sol_buy(client: OmsClient, client_order_id: str) -> str:
    ack = await client.place(
        client_order_id, SOL, S.SIDE_BUY, price_ticks=SOL_PRICE, quantity_lots=100
    )
    assert ack.accepted, ack
    return ack.order_id


async def test_halt_and_resume_a_symbol(shared_mesh: FullMesh, admin: AdminClient) -> None:
    account = await open_account(admin, {"USDT": 10_000_000_000})
    async with (
        account.client(shared_mesh.gateway.address) as client,
        client.order_updates() as updates,
    ):
        try:
            halted = await admin.halt_symbol(SOL)
            assert halted.accepted, halted
            refused = await final_update(updates, await sol_buy(client, "while-halted"))
            assert refused.status == S.ORDER_STATUS_REJECTED
            assert refused.matcher_reason == matcher_pb2.MATCHER_REJECT_REASON_SYMBOL_HALTED
        finally:
            resumed = await admin.resume_symbol(SOL)
        assert resumed.accepted, resumed
        rested = await final_update(updates, await sol_buy(client, "after-resume"))
        assert rested.status == S.ORDER_STATUS_OPEN
        # The BTC book (another symbol, matcher group g1) never stopped.
        btc = await client.place_order(buy(client, "btc-meanwhile", 1))
        assert (await final_update(updates, btc.order_id)).status == S.ORDER_STATUS_OPEN


async def test_kill_switch_cancels_in_every_group_and_blocks_new_orders(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": 10_000_000_000})
    async with (
        account.client(shared_mesh.gateway.address) as client,
        client.order_updates() as updates,
    ):
        btc = (await client.place_order(buy(client, "btc-resting", 1))).order_id
        sol = await sol_buy(client, "sol-resting")
        rested = await final_updates(updates, btc, sol)
        assert {update.status for update in rested.values()} == {S.ORDER_STATUS_OPEN}
        try:
            switched = await admin.kill_switch(account.user_id, enable=True)
            assert switched.accepted, switched
            assert "g1" in switched.detail and "g2" in switched.detail
            cancelled = {(await updates.next()).order_id for _ in range(2)}
            assert cancelled == {btc, sol}
            assert await client.open_orders() == []
            blocked = await final_update(updates, await sol_buy(client, "while-switched"))
            assert blocked.status == S.ORDER_STATUS_REJECTED
            assert blocked.matcher_reason == matcher_pb2.MATCHER_REJECT_REASON_USER_KILL_SWITCHED
        finally:
            released = await admin.kill_switch(account.user_id, enable=False)
        assert released.accepted, released
        again = await final_update(updates, await sol_buy(client, "after-switch"))
        assert again.status == S.ORDER_STATUS_OPEN
        assert (await client.balances())["USDT"].reserved > 0
