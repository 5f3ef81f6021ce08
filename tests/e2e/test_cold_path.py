"""Users who leave the shard's memory for PostgreSQL and come back, on the whole mesh.

This module's shard evicts a flat user after one idle second (sweeps every 50 ms),
so users go cold within a test. What it proves:
- an evicted user's stored state is exactly the state it had in the shard (balances,
  positions, order sequence, recent client order ids with their results), and its next
  call hydrates exactly that state back: a retry of an old client order id returns the
  original ack, answered from the hydrated recent ids without a DB dedup lookup;
- a fill for an evicted user is not lost: the matcher's events for a user the shard
  does not hold park, hydrate the user from PostgreSQL on the miss, and settle after.
  The shard never evicts a user with a live order (tests/shard/test_eviction.py,
  `test_user_never_leaves_while_an_order_rests`), so on a healthy mesh such an event
  only comes from drift; it is made here the way tests/reconciler makes drift: an order
  in the shard's id format placed on the matcher directly, as if the shard had sent it;
- a user who is not resident, evicted or never back since a shard restart, still finds
  every order by client order id and by order id, and histories that match the balances.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest

from gateway.client import AdminClient, GatewayCallError
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from tests.e2e.account_audit import audit_account
from tests.e2e.invariants import check_full_mesh
from tests.full_mesh import FullMesh, running_mesh
from tests.gateway.accounts import BTC, Account, eventually, open_account
from tests.matcher_service.matcher_client import MatcherClient
from tests.persister.persister_client import PersisterClient
from tests.reconciler.drift_injection import foreign_order
from tests.service_process import aio_channel
from tests.shard_service.shard_client import ShardClient

S = common_pb2
COLD_SHARD = {"OMS_SHARD_IDLE_TTL_MS": "1000", "OMS_SHARD_TIMER_MS": "50"}
EVICTION_WAIT_S = 20.0
PRICE = 6_500_000


@pytest.fixture(scope="module")
def cold_mesh(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[FullMesh]:
    with running_mesh(
        tmp_path_factory.mktemp("cold-mesh"), database_url, shard_environment=COLD_SHARD
    ) as mesh:
        yield mesh


@pytest.fixture
async def shard(cold_mesh: FullMesh) -> AsyncIterator[ShardClient]:
    async with aio_channel(cold_mesh.shard.address) as channel:
        yield ShardClient(channel)


@pytest.fixture
async def persister(cold_mesh: FullMesh) -> AsyncIterator[PersisterClient]:
    async with aio_channel(cold_mesh.persister.address) as channel:
        yield PersisterClient(channel)


@pytest.fixture
async def admin(cold_mesh: FullMesh) -> AsyncIterator[AdminClient]:
    async with cold_mesh.admin() as client:
        yield client


async def wait_resident(shard: ShardClient, user_id: int, resident: bool) -> shard_pb2.ActorView:
    return await eventually(
        lambda: shard.actor(user_id), lambda v: v.resident == resident, timeout_s=EVICTION_WAIT_S
    )


def as_flushed(state: shard_pb2.UserState) -> shard_pb2.UserState:
    """The state without its DB version (each flush moves that on by one)."""
    copy = shard_pb2.UserState()
    copy.CopyFrom(state)
    copy.db_version = 0
    return copy


def positions_held(positions: gateway_pb2.Positions) -> list[tuple[str, int, int, int]]:
    return [(p.symbol, p.quantity_lots, p.cost_basis, p.realized_pnl) for p in positions.positions]


async def counters(shard: ShardClient) -> dict[str, int]:
    return dict((await shard.status()).counters)


async def test_an_evicted_user_comes_back_with_exactly_its_state(
    cold_mesh: FullMesh, shard: ShardClient, persister: PersisterClient, admin: AdminClient
) -> None:
    address = cold_mesh.gateway.address
    buyer = await open_account(admin, {"USDT": 10_000_000_000})
    seller = await open_account(admin, {"BTC": 1_000_000})
    async with buyer.client(address) as buying, seller.client(address) as selling:
        bid_request = buying.place_request(
            "cold-bid", BTC, S.SIDE_BUY, price_ticks=PRICE, quantity_lots=2
        )
        bid = await buying.place_order(bid_request)
        await eventually(
            lambda: buying.get_order(order_id=bid.order_id),
            lambda v: v.status == S.ORDER_STATUS_OPEN,
        )
        ask = await selling.place("cold-ask", BTC, S.SIDE_SELL, price_ticks=PRICE, quantity_lots=2)
        assert bid.accepted and ask.accepted, (bid, ask)
        await eventually(
            lambda: buying.get_order(order_id=bid.order_id),
            lambda v: v.status == S.ORDER_STATUS_FILLED,
        )
        # Flat now; still resident until a second of idleness has passed.
        hot = (await shard.actor(buyer.user_id)).state
        hot_balances = await buying.balances()
        hot_positions = await buying.positions()
        assert [p.quantity_lots for p in hot_positions.positions] == [2]
        assert "cold-bid" in [r.client_order_id for r in hot.recent]

        await wait_resident(shard, buyer.user_id, False)
        stored = await persister.stored_user(buyer.user_id)
        assert stored.known
        assert as_flushed(stored.state) == as_flushed(hot)
        assert stored.state.db_version > hot.db_version

        before = await counters(shard)
        # The first call after eviction: the retry of an old client order id.
        retried = await buying.place_order(bid_request)
        assert (retried.accepted, retried.duplicate, retried.order_id) == (
            True,
            True,
            bid.order_id,
        )
        back = await wait_resident(shard, buyer.user_id, True)
        after = await counters(shard)
        assert as_flushed(back.state) == as_flushed(hot)
        assert after["hydrations_completed"] > before["hydrations_completed"]
        # Answered from the recent ids that came back with the state: no DB lookup.
        assert after["dedup_lookups_sent"] == before["dedup_lookups_sent"]
        assert await buying.balances() == hot_balances
        # The mark price is the market's, not the user's state: it may have moved meanwhile.
        assert positions_held(await buying.positions()) == positions_held(hot_positions)
    await check_full_mesh(cold_mesh, [bid.order_id, ask.order_id])


async def test_a_fill_for_an_evicted_user_is_parked_hydrated_and_settled(
    cold_mesh: FullMesh, shard: ShardClient, persister: PersisterClient, admin: AdminClient
) -> None:
    address = cold_mesh.gateway.address
    cold = await open_account(admin, {"USDT": 10_000_000_000})
    seller = await open_account(admin, {"BTC": 1_000_000})
    await wait_resident(shard, cold.user_id, False)
    async with seller.client(address) as selling:
        ask = await selling.place("rest-ask", BTC, S.SIDE_SELL, price_ticks=PRICE, quantity_lots=1)
        assert ask.accepted, ask
        await eventually(
            lambda: selling.get_order(order_id=ask.order_id),
            lambda v: v.status == S.ORDER_STATUS_OPEN,
        )
        assert not (await shard.actor(cold.user_id)).resident
        before = await counters(shard)
        hydrations_read = (await persister.counters())["hydration_requests"]

        # The cold user's IOC buy, as the matcher sees it: it takes the resting ask.
        order = foreign_order(cold.user_id, price_ticks=PRICE, time_in_force=S.TIME_IN_FORCE_IOC)
        async with aio_channel(cold_mesh.matchers["g1"].address) as channel:
            (taken,) = await MatcherClient(channel).submit(order)
        assert taken.order.status == S.ORDER_STATUS_FILLED, taken

        await eventually(
            lambda: selling.get_order(order_id=ask.order_id),
            lambda v: v.status == S.ORDER_STATUS_FILLED,
        )
        settled = await eventually(
            lambda: counters(shard),
            lambda c: c["orphan_fills_settled"] > before["orphan_fills_settled"],
        )
        assert settled["matcher_events_parked"] >= before["matcher_events_parked"] + 2
        assert settled["hydrations_completed"] > before["hydrations_completed"]
        assert (await persister.counters())["hydration_requests"] > hydrations_read
        # The seller, maker: 6,500,000 * 1 lot = 6,500,000 notional, maker fee 6,500.
        seller_balances = await _balances(seller, address)
        assert seller_balances == {"BTC": (990_000, 0), "USDT": (6_493_500, 0)}

    # The cold user, taker: pays 6,500,000 + 13,000, gets 1 lot = 10,000 sats.
    assert await _balances(cold, address) == {"USDT": (9_993_487_000, 0), "BTC": (10_000, 0)}
    async with cold.client(address) as client:
        (position,) = (await client.positions()).positions
    assert (position.quantity_lots, position.cost_basis, position.realized_pnl) == (
        1,
        6_500_000,
        -13_000,
    )
    # The auditor sees what the test did: a fill of an order no shard admitted (the
    # matcher was given it directly), with no order row behind it.
    await check_full_mesh(cold_mesh, [ask.order_id], audit_expects={"fill-order": 1})


async def _balances(account: Account, address: str) -> dict[str, tuple[int, int]]:
    async with account.client(address) as client:
        return {a: (b.total, b.reserved) for a, b in (await client.balances()).items()}


async def test_orders_and_histories_of_a_user_not_resident_evicted_and_after_a_restart(
    new_mesh: Callable[..., Awaitable[FullMesh]],
) -> None:
    mesh = await new_mesh(shard_environment=COLD_SHARD)
    address = mesh.gateway.address
    async with mesh.admin() as admin:
        buyer = await open_account(admin, {"USDT": 10_000_000_000})
        seller = await open_account(admin, {"BTC": 1_000_000})
    async with buyer.client(address) as buying, seller.client(address) as selling:
        requests = [
            buying.place_request(f"h-{n}", BTC, S.SIDE_BUY, price_ticks=PRICE, quantity_lots=1)
            for n in range(3)
        ]
        for request in requests:
            assert (await buying.place_order(request)).accepted
        ask = await selling.place("h-ask", BTC, S.SIDE_SELL, price_ticks=PRICE, quantity_lots=2)
        assert ask.accepted
        # Two bids fill; the third rests until cancelled.
        await eventually(buying.open_orders, lambda orders: len(orders) == 1, timeout_s=15)
        (resting,) = await buying.open_orders()
        assert (await buying.cancel(order_id=resting.order_id)).accepted
        await eventually(buying.open_orders, lambda orders: not orders, timeout_s=15)

    async with aio_channel(mesh.shard.address) as channel:
        shard = ShardClient(channel)
        for account in (buyer, seller):
            await wait_resident(shard, account.user_id, False)
    before = await _lookups(buyer, address, requests)
    assert before is not None

    # A restart: the shard's resident set comes back from its snapshot and log, and
    # these users are not in it; the gateway reads them from PostgreSQL all the same.
    mesh.shard.kill()
    await asyncio.to_thread(mesh.shard.start_serving)
    async with aio_channel(mesh.shard.address) as channel:
        shard = ShardClient(channel)
        await wait_resident(shard, buyer.user_id, False)
    after = await eventually(
        lambda: _lookups(buyer, address, requests, retry=True),
        lambda found: found is not None,
        timeout_s=30,
    )
    assert after == before
    async with seller.client(address) as selling:
        await audit_account(selling, {"BTC": 1_000_000})
    await check_full_mesh(mesh, [ask.order_id, *[order.order_id for order in before[0]]])


async def _lookups(
    account: Account,
    address: str,
    requests: list[gateway_pb2.PlaceOrderRequest],
    *,
    retry: bool = False,
) -> tuple[list[gateway_pb2.OrderView], list[gateway_pb2.FillView]] | None:
    """Each order by client id and by order id, then the audited histories."""
    async with account.client(address) as client:
        try:
            found = []
            for request in requests:
                by_client_id = await client.get_order(client_order_id=request.client_order_id)
                assert await client.get_order(order_id=by_client_id.order_id) == by_client_id
                found.append(by_client_id)
            statuses = sorted(order.status for order in found)
            assert statuses == [
                S.ORDER_STATUS_FILLED,
                S.ORDER_STATUS_FILLED,
                S.ORDER_STATUS_CANCELLED,
            ]
            story = await audit_account(client, {"USDT": 10_000_000_000}, page_size=1)
        except GatewayCallError as error:
            if retry and error.code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                return None
            raise
    assert story.orders == found
    return found, story.fills
