"""Users who left the shard's memory: reads come from PostgreSQL, and signing in hydrates ahead.

This module runs its own mesh whose shard evicts a flat user after one idle
second, and whose gateway may hydrate ahead every 200 ms, so a user goes cold
within a test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters, running_mesh
from tests.gateway.accounts import BTC, PRICE, Account, buy, eventually, open_account
from tests.shard_service.shard_client import ShardClient
from tests.shard_service.shard_process import aio_channel

S = common_pb2


@pytest.fixture(scope="module")
def cold_mesh(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[FullMesh]:
    with running_mesh(
        tmp_path_factory.mktemp("cold-mesh"),
        database_url,
        shard_environment={"OMS_SHARD_IDLE_TTL_MS": "1000"},
        gateway_environment={"OMS_GATEWAY_PREFETCH_INTERVAL_MS": "200"},
    ) as mesh:
        yield mesh


@pytest.fixture
async def shard(cold_mesh: FullMesh) -> AsyncIterator[ShardClient]:
    async with aio_channel(cold_mesh.shard.address) as channel:
        yield ShardClient(channel)


async def wait_resident(shard: ShardClient, user_id: int, resident: bool) -> None:
    async def view() -> shard_pb2.ActorView:
        return await shard.actor(user_id)

    await eventually(view, lambda v: v.resident == resident, timeout_s=20)


async def crossed_pair(mesh: FullMesh, admin: AdminClient) -> tuple[Account, Account, str]:
    """A buyer and a seller whose orders filled each other; both flat afterwards."""
    buyer = await open_account(admin, {"USDT": 10_000_000_000})
    seller = await open_account(admin, {"BTC": 1_000_000})
    async with (
        buyer.client(mesh.gateway.address) as buying,
        seller.client(mesh.gateway.address) as selling,
    ):
        bid = await buying.place_order(buy(buying, "cold-bid", 2))
        await eventually(
            lambda: buying.get_order(order_id=bid.order_id),
            lambda v: v.status == S.ORDER_STATUS_OPEN,
        )
        ask = await selling.place("cold-ask", BTC, S.SIDE_SELL, price_ticks=PRICE, quantity_lots=2)
        assert ask.accepted, ask
        await eventually(
            lambda: buying.get_order(order_id=bid.order_id),
            lambda v: v.status == S.ORDER_STATUS_FILLED,
        )
    return buyer, seller, bid.order_id


async def test_an_evicted_user_reads_the_same_from_storage(
    cold_mesh: FullMesh, shard: ShardClient
) -> None:
    async with cold_mesh.admin() as admin:
        buyer, _, _ = await crossed_pair(cold_mesh, admin)
    async with buyer.client(cold_mesh.gateway.address) as client:
        hot_balances = await client.balances()
        hot_positions = await client.positions()
        assert hot_positions.positions[0].quantity_lots == 2
        await wait_resident(shard, buyer.user_id, False)
        cold_balances = await client.balances()
        cold_positions = await client.positions()
        assert cold_balances == hot_balances
        assert [
            (p.symbol, p.quantity_lots, p.cost_basis, p.realized_pnl)
            for p in cold_positions.positions
        ] == [
            (p.symbol, p.quantity_lots, p.cost_basis, p.realized_pnl)
            for p in hot_positions.positions
        ]
        assert await client.open_orders() == []


async def test_finished_orders_of_an_evicted_user_are_found_by_either_id(
    cold_mesh: FullMesh, shard: ShardClient
) -> None:
    async with cold_mesh.admin() as admin:
        buyer, _, bid = await crossed_pair(cold_mesh, admin)
    async with buyer.client(cold_mesh.gateway.address) as client:
        await wait_resident(shard, buyer.user_id, False)
        by_order_id = await client.get_order(order_id=bid)
        by_client_id = await client.get_order(client_order_id="cold-bid")
    assert by_order_id == by_client_id
    assert (by_order_id.status, by_order_id.filled_lots, by_order_id.remaining_lots) == (
        S.ORDER_STATUS_FILLED,
        2,
        0,
    )


async def test_signing_in_hydrates_the_user_ahead_of_the_first_order(
    cold_mesh: FullMesh, shard: ShardClient
) -> None:
    async with cold_mesh.admin() as admin:
        account = await open_account(admin, {"USDT": 10_000_000_000})
    await wait_resident(shard, account.user_id, False)
    before = await gateway_counters(cold_mesh.gateway.address)
    async with OmsClient(
        cold_mesh.gateway.address,
        user_id=account.user_id,
        api_key=account.api_key,
        api_secret=account.api_secret,
    ) as client:
        # A read changes nothing in the shard, yet the user is loaded: hydrate-ahead.
        assert (await client.balances())["USDT"].total == 10_000_000_000
        await wait_resident(shard, account.user_id, True)
    after = await gateway_counters(cold_mesh.gateway.address)
    assert after["prefetch_users"] > before.get("prefetch_users", 0)
