"""A backlog of matcher events far larger than one shard log entry reaches the shard whole.

The shard logs each ShardCommandBatch as one entry, capped in bytes; the bridge
must never hand it a batch over the cap, however many events wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from protos.oms.v1 import common_pb2, matcher_pb2
from tests.bridge.mesh import SHARD_ID, MeshProcesses, mesh_clients
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.shard_service.shard_client import USDT, hydrate

pytestmark = pytest.mark.slow
USER = 61
ORDERS = 45_000  # Accepted + Cancelled each: 90,000 events (~5 MiB), all retained
BATCH = 1_000


def _ioc_batch(first_seq: int) -> matcher_pb2.MatcherCommandBatch:
    batch = matcher_pb2.MatcherCommandBatch()
    for seq in range(first_seq, first_seq + BATCH):
        command = batch.commands.add(correlation_id=seq)
        order = command.submit.order
        order.order_id = f"{SHARD_ID}:{USER}:{seq}"
        order.user_id = USER
        order.symbol = "BTC-USDT"
        order.side = common_pb2.SIDE_BUY
        order.order_type = common_pb2.ORDER_TYPE_LIMIT
        order.time_in_force = common_pb2.TIME_IN_FORCE_IOC
        order.price_ticks = 6_000_000
        order.quantity_lots = 1
    return batch


async def test_backlog_of_events_is_delivered_without_a_gap(
    new_mesh: Callable[..., MeshProcesses],
) -> None:
    processes = new_mesh()
    await asyncio.to_thread(processes.start)
    async with mesh_clients(processes) as mesh:
        await mesh.wait_bridge_connected()
        await mesh.shard.run(hydrate(USER, balances=[(USDT, 10**9)]))
        processes.bridge.kill()
        g1 = mesh.matchers["g1"]
        await g1.execute(*(_ioc_batch(1_000 + start) for start in range(0, ORDERS, BATCH)))
        assert await g1.last_sequence(SHARD_ID) == 2 * ORDERS

        await asyncio.to_thread(processes.bridge.start_serving)
        await wait_quiet(mesh, timeout_s=60)
        status = await mesh.shard.status()
        assert status.counters["orphan_events"] == 2 * ORDERS  # orders the shard never placed
        report = await mesh.bridge_status()
        assert report.counters["events_delivered"] == 2 * ORDERS, report
        await check_invariants(mesh)  # no sequence gap
