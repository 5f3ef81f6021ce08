"""Through the gateway: open an account, fund it, place and cancel, read everything back."""

from __future__ import annotations

from gateway.client import AdminClient
from protos.oms.v1 import common_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import (
    BTC,
    PRICE,
    account_state,
    buy,
    eventually,
    limit_buy_reservation,
    open_account,
)

USDT_FUNDS = 10_000_000_000  # 10,000 USDT


async def test_create_fund_place_and_read_back(shared_mesh: FullMesh, admin: AdminClient) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        assert {a: (b.total, b.reserved) for a, b in (await client.balances()).items()} == {
            "USDT": (USDT_FUNDS, 0)
        }
        ack = await client.place_order(buy(client, "first", 3))
        assert ack.accepted, ack
        assert ack.order_id == f"s1:{account.user_id}:1"
        assert ack.client_order_id == "first"
        assert ack.status == common_pb2.ORDER_STATUS_PENDING
        assert not ack.duplicate and ack.stamp.position > 0

        reserved = limit_buy_reservation(PRICE, 3)
        balances = await client.balances()
        assert (balances["USDT"].total, balances["USDT"].reserved) == (USDT_FUNDS, reserved)
        # The bridge takes it to the matcher: the order rests (nothing to cross with).
        view = await eventually(
            lambda: client.get_order(order_id=ack.order_id),
            lambda v: v.status == common_pb2.ORDER_STATUS_OPEN,
        )
        assert (view.symbol, view.side, view.price_ticks, view.quantity_lots) == (
            BTC,
            common_pb2.SIDE_BUY,
            PRICE,
            3,
        )
        by_client_id = await client.get_order(client_order_id="first")
        assert by_client_id.order_id == ack.order_id
        (open_order,) = await client.open_orders()
        assert (open_order.order_id, open_order.remaining_lots) == (ack.order_id, 3)
        assert await client.open_orders("SOL-USDT") == []
        positions = await client.positions()
        assert list(positions.positions) == [] and not positions.reduce_only


async def test_retried_place_returns_the_original_ack_and_reserves_once(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        original = await client.place_order(buy(client, "again", 2))
        retried = await client.place_order(buy(client, "again", 2))
        assert retried.accepted and retried.duplicate
        assert (retried.order_id, retried.client_order_id) == (original.order_id, "again")
        state = await account_state(client)
        assert state.balances["USDT"] == (USDT_FUNDS, limit_buy_reservation(PRICE, 2))
        assert [order_id for order_id, _, _ in state.open_orders] == [original.order_id]


async def test_a_shard_refusal_is_an_ack_not_an_error(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": 1_000_000})  # 1 USDT
    async with account.client(shared_mesh.gateway.address) as client:
        ack = await client.place_order(buy(client, "too-big", 3))
        assert not ack.accepted
        assert ack.reject_reason == shard_pb2.SHARD_REJECT_REASON_INSUFFICIENT_FUNDS
        assert ack.status == common_pb2.ORDER_STATUS_REJECTED
        assert not ack.retryable
        assert (await account_state(client)).balances == {"USDT": (1_000_000, 0)}


async def test_cancel_by_client_order_id_then_the_closed_order_is_read_from_storage(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        placed = await client.place_order(buy(client, "to-cancel", 1))
        await eventually(
            lambda: client.get_order(order_id=placed.order_id),
            lambda v: v.status == common_pb2.ORDER_STATUS_OPEN,
        )
        cancelled = await client.cancel(client_order_id="to-cancel")
        assert cancelled.accepted and cancelled.order_id == placed.order_id
        # Once closed, the order leaves the shard's index: GetOrder reads the persister's row.
        view = await eventually(
            lambda: client.get_order(order_id=placed.order_id),
            lambda v: v.status == common_pb2.ORDER_STATUS_CANCELLED,
        )
        assert (view.filled_lots, view.remaining_lots) == (0, 1)
        assert await client.open_orders() == []
        assert (await client.balances())["USDT"].reserved == 0
        again = await client.cancel(order_id=placed.order_id)
        assert not again.accepted
        assert again.reject_reason in (
            shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_FOUND,
            shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_CANCELLABLE,
        )


async def test_transfers_are_idempotent_by_transfer_id(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": 5_000_000})
    first = await admin.withdraw(account.user_id, "USDT", 2_000_000, "w-1")
    again = await admin.withdraw(account.user_id, "USDT", 2_000_000, "w-1")
    assert first.accepted and not first.duplicate
    assert again.accepted and again.duplicate
    too_much = await admin.withdraw(account.user_id, "USDT", 9_000_000, "w-2")
    assert not too_much.accepted
    assert too_much.reject_reason == shard_pb2.SHARD_REJECT_REASON_INSUFFICIENT_FUNDS
    async with account.client(shared_mesh.gateway.address) as client:
        assert (await client.balances())["USDT"].total == 3_000_000


async def test_status_counts_requests(shared_mesh: FullMesh, admin: AdminClient) -> None:
    before = await gateway_counters(shared_mesh.gateway.address)
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        await client.place_order(buy(client, "counted", 1))
        await client.balances()
    after = await gateway_counters(shared_mesh.gateway.address)
    for name in ("requests.CreateUser", "requests.Deposit", "requests.PlaceOrder"):
        assert after.get(name, 0) == before.get(name, 0) + 1, name
    assert after["requests.GetBalances"] == before.get("requests.GetBalances", 0) + 1
    assert after["orders_accepted"] == before.get("orders_accepted", 0) + 1
    assert after["shard_commands_sent"] > before.get("shard_commands_sent", 0)
    # The new key was read from the persister once; the second call was served from memory.
    assert after["credential_lookups"] == before["credential_lookups"] + 1
    assert after["credential_cache_hits"] >= before["credential_cache_hits"] + 1
