"""Two user-shard clusters behind one gateway that routes by the document in etcd.

Each user's commands go to the cluster rendezvous hashing gives it, first time (no
NOT_OWNER); trades between users of different clusters settle on both; each user's
order updates and history come from its own cluster; no user is resident in two
shards, and money is conserved over both (tests/e2e/invariants.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from gateway.client import OrderUpdateStream
from protos.oms.v1 import common_pb2, shard_pb2_grpc
from services.routing.core.routing_changes import first_document
from tests.e2e.invariants import check_mesh_invariants, resident_users
from tests.full_mesh import gateway_counters
from tests.gateway.accounts import BTC, PRICE, Account, open_account
from tests.shard_service.shard_process import aio_channel
from tests.sharded_mesh import ShardedMesh

S = common_pb2
PAIRS = 8
LOTS = 2


async def until_status(updates: OrderUpdateStream, order_id: str, status: int) -> None:
    """Read `updates` until `order_id` reaches `status` (each read has a deadline)."""
    while True:
        update = await updates.next()
        if update.order_id == order_id and update.status == status:
            return


async def residents(mesh: ShardedMesh, cluster_id: str) -> set[int]:
    async with aio_channel(mesh.clusters[cluster_id].shard.address) as channel:
        return set(await resident_users(shard_pb2_grpc.UserShardStub(channel)))


async def test_two_clusters_serve_their_own_users_and_trade_across(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    document = first_document(["s1", "s2"])
    mesh = await new_sharded_mesh(document)
    async with mesh.admin() as admin:
        accounts: dict[str, list[Account]] = {"s1": [], "s2": []}
        while min(len(users) for users in accounts.values()) < PAIRS:
            account = await open_account(admin, {"USDT": 10_000_000_000, "BTC": 10_000_000})
            owner = document.owner_of(account.user_id)
            assert owner is not None
            accounts[owner].append(account)
    sellers, buyers = accounts["s1"][:PAIRS], accounts["s2"][:PAIRS]
    acknowledged: list[str] = []
    async with AsyncExitStack() as stack:
        for index, (seller, buyer) in enumerate(zip(sellers, buyers, strict=True)):
            sell = await stack.enter_async_context(seller.client(mesh.gateway.address))
            buy = await stack.enter_async_context(buyer.client(mesh.gateway.address))
            sell_updates = await stack.enter_async_context(sell.order_updates())
            buy_updates = await stack.enter_async_context(buy.order_updates())
            ask = await sell.place(
                f"ask-{index}", BTC, S.SIDE_SELL, price_ticks=PRICE, quantity_lots=LOTS
            )
            bid = await buy.place(
                f"bid-{index}", BTC, S.SIDE_BUY, price_ticks=PRICE, quantity_lots=LOTS
            )
            assert ask.accepted and bid.accepted, (ask, bid)
            assert ask.order_id.startswith("s1:") and bid.order_id.startswith("s2:")
            acknowledged += [ask.order_id, bid.order_id]
            # Each side's updates reach its own stream, from its own cluster's shard.
            await until_status(sell_updates, ask.order_id, S.ORDER_STATUS_FILLED)
            await until_status(buy_updates, bid.order_id, S.ORDER_STATUS_FILLED)
            history = await buy.order_history()
            assert [o.order_id for o in history] == [bid.order_id]
            balances = await buy.balances()
            assert balances["BTC"].total == 10_000_000 + LOTS * 10_000

    await check_mesh_invariants(mesh.addresses(), mesh.database_url, acknowledged)
    for cluster_id in ("s1", "s2"):
        held = await residents(mesh, cluster_id)
        assert held and all(document.owner_of(user) == cluster_id for user in held)
    counters = await gateway_counters(mesh.gateway.address)
    assert counters["routing_epoch"] == 1
    assert counters.get("shard_not_owner", 0) == 0  # routed right the first time
