"""A matcher event lost on its way to the shard, healed by the running reconciler: whole mesh.

The injection is the one tests/reconciler/test_drift_healing.py makes on a partial
mesh: with the bridge stopped, a resting order is cancelled at the matcher, and the
shard is handed only the events after that Cancelled, so it skips one sequence and
keeps a phantom OPEN order with its reservation. Here the order was placed through
the gateway, the reconciler is the mesh's own (running all along, every 0.2 s), and
the client sees the heal on its order-update stream.
"""

from __future__ import annotations

import asyncio

from gateway.client import AdminClient
from protos.oms.v1 import common_pb2
from tests.bridge.bridge_process import service_status
from tests.e2e.exactly_once import matcher_clients
from tests.e2e.invariants import check_full_mesh
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, eventually, open_account
from tests.reconciler.drift_injection import foreign_order, matcher_cancel
from tests.service_process import aio_channel
from tests.shard_service.shard_client import ShardClient, matcher_events

S = common_pb2
FUNDS = 1_000_000_000
PRICE = 6_000_000  # below every ask: rests, and the IOC below meets nothing
RESERVED = 6_012_000  # 6,000,000 * 1 lot + the 2,000 ppm taker-rate fee
HEAL_WAIT_S = 15.0


async def test_a_dropped_matcher_event_is_healed_by_the_reconciler(
    e2e_mesh: FullMesh, admin: AdminClient
) -> None:
    owner = await open_account(admin, {"USDT": FUNDS})
    other = await open_account(admin, {"USDT": FUNDS})
    shard_id = e2e_mesh.shard.shard_id
    async with (
        owner.client(e2e_mesh.gateway.address) as client,
        client.order_updates() as updates,
        aio_channel(e2e_mesh.shard.address) as shard_channel,
        matcher_clients(e2e_mesh) as matchers,
    ):
        shard = ShardClient(shard_channel)
        g1 = matchers["g1"]
        placed = await client.place("resting", BTC, S.SIDE_BUY, price_ticks=PRICE, quantity_lots=1)
        assert placed.accepted, placed
        while (await updates.next()).status != S.ORDER_STATUS_OPEN:
            pass
        assert (await client.balances())["USDT"].reserved == RESERVED
        before = (await shard.status()).counters

        # Drop one event: the bridge is away while the matcher cancels the order and
        # then sequences an IOC (Accepted, Cancelled) the shard never placed; the shard
        # gets those two directly, and so never sees the Cancelled.
        assert await asyncio.to_thread(e2e_mesh.bridge.terminate) == 0
        last = await g1.last_sequence(shard_id)
        (cancelled,) = await g1.run(matcher_cancel(placed.order_id, owner.user_id))
        assert cancelled.order.status == S.ORDER_STATUS_CANCELLED
        ioc = foreign_order(other.user_id, price_ticks=PRICE, time_in_force=S.TIME_IN_FORCE_IOC)
        (answer,) = await g1.submit(ioc)
        assert not answer.reject_reason, answer
        events = await g1.events(shard_id, last + 1)
        assert [(e.order_id, e.WhichOneof("event")) for e in events] == [
            (placed.order_id, "cancelled"),
            (ioc.order_id, "accepted"),
            (ioc.order_id, "cancelled"),
        ]
        await shard.run(matcher_events(events[1:], group="g1"))
        after_drop = (await shard.status()).counters
        assert after_drop["matcher_sequence_gaps"] == before["matcher_sequence_gaps"] + 1
        await asyncio.to_thread(e2e_mesh.bridge.start_serving)

        # The reconciler finds the phantom (the matcher has nothing open, the shard an
        # OPEN order with its reservation), and the shard closes it.
        healed = await updates.next(timeout_s=HEAL_WAIT_S)
        assert (healed.order_id, healed.status) == (placed.order_id, S.ORDER_STATUS_CANCELLED)
        status = await eventually(
            shard.status,
            lambda s: (
                s.counters["reconcile_reservations_released"]
                > before["reconcile_reservations_released"]
            ),
        )
        counters = status.counters
        assert counters["reconcile_phantoms_closed"] == before["reconcile_phantoms_closed"] + 1
        assert counters["reconcile_impossible_states"] == before["reconcile_impossible_states"]
        usdt = (await client.balances())["USDT"]
        assert (usdt.total, usdt.reserved) == (FUNDS, 0)
        assert await client.open_orders() == []
        report = await service_status(e2e_mesh.reconciler.address)
        assert report.counters["reports_sent"] >= 1, report
    await check_full_mesh(e2e_mesh, [placed.order_id])
