"""Checks of a running mesh from the outside, through the services' own read APIs.

`wait_quiet`: no saga in flight, nothing parked, and the shard has applied every
event each matcher sequenced for it. `check_invariants` then holds after every
test: the shard's books conserve each asset, every reservation is backed by an
open order, and the matcher's open orders equal the shard's index.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence

import grpc

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2
from tests.bridge.mesh import GROUP_OF_SYMBOL, SHARD_ID, MeshClients
from tests.matcher_service.matcher_client import MatcherClient
from tests.shard_service.shard_client import ShardClient, cancel, eventually

QUIET_TIMEOUT_S = 30.0
QUERY_CHUNK = 200
LIVE = (common_pb2.ORDER_STATUS_OPEN, common_pb2.ORDER_STATUS_PARTIALLY_FILLED)
TERMINAL = (
    common_pb2.ORDER_STATUS_FILLED,
    common_pb2.ORDER_STATUS_CANCELLED,
    common_pb2.ORDER_STATUS_EXPIRED,
    common_pb2.ORDER_STATUS_REJECTED,
)


async def wait_quiet(mesh: MeshClients, timeout_s: float = QUIET_TIMEOUT_S) -> None:
    """Until nothing is in flight and the shard applied every event of every group."""

    async def probe() -> tuple[int, int, dict[str, tuple[int, int]]]:
        try:
            status = await mesh.shard.status()
            in_flight = await mesh.shard.in_flight()
            positions = {
                group: (in_flight.matcher_sequences.get(group, 0), await m.last_sequence(SHARD_ID))
                for group, m in mesh.matchers.items()
            }
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return -1, -1, {}  # a process just restarted: ask again
        return status.in_flight_sagas, status.parked_commands, positions

    def quiet(value: tuple[int, int, dict[str, tuple[int, int]]]) -> bool:
        sagas, parked, positions = value
        return sagas == 0 and parked == 0 and all(a == b for a, b in positions.values())

    await eventually(probe, quiet, timeout_s=timeout_s)


async def resident_users(shard: ShardClient) -> list[int]:
    users: list[int] = []
    after = 0
    while True:
        page = await shard.stub.ListUsers(
            shard_pb2.UserPageRequest(after_user_id=after, limit=1_000), timeout=10
        )
        users.extend(page.user_ids)
        if not page.next_after_user_id:
            return users
        after = page.next_after_user_id


async def check_invariants(
    mesh: MeshClients,
    *,
    extra_users: Iterable[int] = (),
    clearing_settled: bool = True,
    gaps_expected: bool = False,
) -> None:
    """The outside checks every test ends with (call after `wait_quiet`)."""
    status = await mesh.shard.status()
    if not gaps_expected:
        # The bridge never skips: every event reached the shard in sequence.
        assert status.counters["matcher_sequence_gaps"] == 0, dict(status.counters)
    assert status.accounts, "the shard keeps books"
    for books in status.accounts:
        held = books.resident + books.clearing + books.fees
        owed = books.deposits - books.withdrawals + books.hydrated_in - books.dehydrated_out
        assert held == owed, f"{books.asset} books do not balance: {books}"
        if clearing_settled:
            # One shard owns both legs of every trade here: once settled they cancel out.
            assert books.clearing == 0, f"{books.asset}: clearing left {books.clearing}"
    users = sorted({*await resident_users(mesh.shard), *extra_users})
    for user in users:
        await check_user(mesh, user)


async def check_user(mesh: MeshClients, user: int) -> None:
    view = await mesh.shard.actor(user)
    reserved_by_orders: Counter[str] = Counter()
    for order in view.open_orders:
        assert order.status in LIVE, f"user {user}: {order.order_id} is {order.status}"
        if order.reserved:
            assert order.reserved_asset, order
            reserved_by_orders[order.reserved_asset] += order.reserved
    for balance in view.state.balances:
        assert balance.reserved == reserved_by_orders[balance.asset], (
            f"user {user}: {balance.asset} reserved {balance.reserved}, "
            f"open orders back {reserved_by_orders[balance.asset]}"
        )
    for group, matcher in mesh.matchers.items():
        snapshot = await matcher.open_orders(SHARD_ID, user)
        at_matcher = [(o.order.order_id, o.remaining_lots) for o in snapshot.orders]
        assert len({order_id for order_id, _ in at_matcher}) == len(at_matcher), at_matcher
        in_shard = [
            (o.order_id, o.remaining_lots)
            for o in view.open_orders
            if GROUP_OF_SYMBOL[o.symbol] == group
        ]
        assert sorted(at_matcher) == sorted(in_shard), (
            f"user {user}, group {group}: matcher {sorted(at_matcher)} != shard {sorted(in_shard)}"
        )


async def order_statuses(shard: ShardClient) -> dict[str, shard_pb2.OrderUpdate]:
    """The latest order update of every order, read from egress up to a fence."""
    (fence,) = await shard.run(cancel(0, "fence"))
    through = fence.stamp.position
    assert through > 0, fence

    def done(items: list[shard_pb2.ShardEgress]) -> bool:
        return bool(items) and items[-1].stamp.position >= through

    items = await shard.egress(["order_update", "result"], until=done, timeout_s=30)
    latest: dict[str, shard_pb2.OrderUpdate] = {}
    for item in items:
        if item.HasField("order_update"):
            latest[item.order_update.order_id] = item.order_update
    return latest


async def matcher_orders(
    matcher: MatcherClient, order_ids: Sequence[str]
) -> list[matcher_pb2.OrderState | None]:
    states: list[matcher_pb2.OrderState | None] = []
    for start in range(0, len(order_ids), QUERY_CHUNK):
        chunk = order_ids[start : start + QUERY_CHUNK]
        states.extend(await asyncio.gather(*(matcher.get_order(oid) for oid in chunk)))
    return states


async def check_orders_agree(mesh: MeshClients, orders: Sequence[tuple[str, str]]) -> None:
    """Each (order id, group) is known to its matcher and ends in the same state as in the shard."""
    latest = await order_statuses(mesh.shard)
    by_group: dict[str, list[str]] = {}
    for order_id, group in orders:
        by_group.setdefault(group, []).append(order_id)
    for group, order_ids in by_group.items():
        states = await matcher_orders(mesh.matchers[group], order_ids)
        for order_id, state in zip(order_ids, states, strict=True):
            assert state is not None, f"{order_id} accepted by the shard never reached {group}"
            update = latest.get(order_id)
            assert update is not None, f"{order_id}: no order update from the shard"
            assert (update.status, update.remaining_lots) == (state.status, state.remaining_lots), (
                f"{order_id}: shard {update.status}/{update.remaining_lots}, "
                f"matcher {state.status}/{state.remaining_lots}"
            )
