"""`CancelAllAfter`, a dead man's switch, on real processes.

The switch runs in the user's shard, on its consensus time: armed, it cancels every live
order of the user unless armed again in time, whatever happens to the client or to the
gateway (SIGKILLed here while the switch is armed); 0 disarms it; a timeout outside its
range is refused INVALID_TIMEOUT and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, shard_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import PRICE, account_state, buy, eventually, open_account

USDT_FUNDS = 10_000_000_000  # 10,000 USDT
OPEN = common_pb2.ORDER_STATUS_OPEN
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
SWITCH_MS = 2_000
# What the orders must survive while armed again in time: several timeouts.
REARMED_FOR_S = 3 * SWITCH_MS / 1000


async def resting(client: OmsClient, count: int, prefix: str) -> list[str]:
    order_ids = []
    for number in range(count):
        ack = await client.place_order(buy(client, f"{prefix}{number}", 1, price_ticks=PRICE - 1))
        assert ack.accepted, ack
        order_ids.append(ack.order_id)
    await eventually(
        client.open_orders,
        lambda orders: set(order_ids) <= {o.order_id for o in orders if o.status == OPEN},
    )
    return order_ids


async def cancelled(client: OmsClient) -> None:
    """Nothing open, nothing reserved (balances and open orders are two reads: a cancel
    may land between them, so both are waited for)."""
    state = await eventually(
        lambda: account_state(client),
        lambda s: not s.open_orders and s.balances["USDT"][1] == 0,
    )
    assert state.balances["USDT"] == (USDT_FUNDS, 0)


async def test_armed_again_in_time_nothing_is_cancelled_then_it_fires_and_disarms(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        placed = await resting(client, 2, "k")
        armed = await client.cancel_all_after(SWITCH_MS)
        assert armed.accepted and not armed.reject_reason, armed
        assert armed.cancel_all_at_ms == armed.stamp.consensus_time_ms + SWITCH_MS
        # A bot's heartbeat: armed again every quarter of the timeout, for three timeouts.
        until = time.monotonic() + REARMED_FOR_S
        while time.monotonic() < until:
            await asyncio.sleep(SWITCH_MS / 4000)
            again = await client.cancel_all_after(SWITCH_MS)
            assert again.accepted and again.cancel_all_at_ms > armed.cancel_all_at_ms
        state = await account_state(client)
        assert sorted(order_id for order_id, _, _ in state.open_orders) == sorted(placed)
        # The heartbeat stops: the shard cancels everything.
        await cancelled(client)
        for order_id in placed:
            assert (await client.get_order(order_id=order_id)).status == CANCELLED
        # It fired once and disarmed: a new order rests on.
        (late,) = await resting(client, 1, "after")
        await asyncio.sleep(SWITCH_MS / 1000)  # past what the fired switch would have been
        assert (await client.get_order(order_id=late)).status == OPEN


async def test_disarmed_nothing_fires_and_a_bad_timeout_is_refused(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        (order_id,) = await resting(client, 1, "d")
        armed = await client.cancel_all_after(SWITCH_MS)
        off = await client.cancel_all_after(0)
        assert off.accepted and off.cancel_all_at_ms == 0, off
        for timeout_ms in (1, 999, 86_400_001):
            refused = await client.cancel_all_after(timeout_ms)
            assert not refused.accepted and not refused.retryable, refused
            assert refused.reject_reason == shard_pb2.SHARD_REJECT_REASON_INVALID_TIMEOUT
        # Past the disarmed switch's time (consensus time follows the wall clock here).
        await eventually(
            client.positions,
            lambda _: time.time() * 1000 > armed.cancel_all_at_ms + 1_000,
        )
        assert (await client.get_order(order_id=order_id)).status == OPEN
        await client.cancel_all()


async def test_it_fires_when_the_gateway_dies_with_the_client(
    new_mesh: Callable[..., FullMesh],
) -> None:
    mesh = new_mesh()
    mesh.start()
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(mesh.gateway.address) as client:
        await resting(client, 3, "g")
        assert (await client.cancel_all_after(SWITCH_MS)).accepted
    mesh.gateway.kill()  # the client and its gateway are gone; the shard is not
    await asyncio.to_thread(mesh.gateway.start_serving)
    async with account.client(mesh.gateway.address) as client:
        await cancelled(client)
