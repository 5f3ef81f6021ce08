"""A sampled order's call of its own keeps the bridge's ordering: its cancel never overtakes it.

Shard, matchers and bridge run as real processes exporting to a real OTLP
receiver. A sampled submit and its cancel leave the shard in one log entry, so
the bridge takes them together: the submit goes on its own traced call and the
cancel must wait for that call's answer (were it written at once on the batched
stream, the matcher could see it first, answer not_found and leave the order
resting). An unsampled order in the same mesh travels in the batch, untraced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protos.oms.v1 import common_pb2
from tests.bridge.mesh import MeshClients, MeshProcesses, mesh_clients
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.bridge.order_updates import wait_order_update
from tests.otlp_receiver import OtlpReceiver
from tests.shard_service.shard_client import USDT, cancel, hydrate, limit_order

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
USER = 7_001
FUNDS = 1_000_000_000
PRICE = 6_400_000
OPEN = common_pb2.ORDER_STATUS_OPEN
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED


@pytest.fixture
async def traced_mesh(tmp_path: Path) -> AsyncIterator[tuple[MeshClients, OtlpReceiver]]:
    async with OtlpReceiver() as receiver:
        processes = MeshProcesses.create(tmp_path / "mesh")
        for process in processes.all():
            process.environment.update(
                {"OMS_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
            )
        try:
            await asyncio.to_thread(processes.start)
            async with mesh_clients(processes) as clients:
                await clients.wait_bridge_connected()
                yield clients, receiver
        finally:
            await asyncio.to_thread(processes.stop)


async def test_a_cancel_waits_for_its_sampled_submits_own_call(
    traced_mesh: tuple[MeshClients, OtlpReceiver],
) -> None:
    mesh, receiver = traced_mesh
    shard = mesh.shard
    await shard.run(hydrate(USER, balances=[(USDT, FUNDS)]))
    (plain,) = await shard.run(limit_order(USER, "plain", price_ticks=PRICE, quantity_lots=1))
    assert plain.accepted, plain
    await wait_order_update(shard, plain.order_id, OPEN, from_position=plain.stamp.position)

    place = limit_order(USER, "traced", price_ticks=PRICE, quantity_lots=1)
    place.place.trace_parent = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
    traced_id = f"s1:{USER}:2"  # the shard numbers a user's orders 1, 2, ...
    placed, cancelling = await shard.run(place, cancel(USER, traced_id))
    assert (placed.accepted, placed.order_id, cancelling.accepted) == (True, traced_id, True)
    await wait_order_update(shard, traced_id, CANCELLED, from_position=placed.stamp.position)
    state = await mesh.matchers["g1"].get_order(traced_id)
    assert state is not None and state.status == CANCELLED

    await wait_quiet(mesh)
    await check_invariants(mesh)
    counters = (await mesh.bridge_status()).counters
    assert counters["cancels_held"] == 1
    assert counters["cancels_not_found"] == 0
    assert (counters["submits_forwarded"], counters["traced_submits"]) == (2, 1)

    spans = await receiver.wait_trace(TRACE_ID, {"oms-shard", "oms-bridge", "oms-matcher"})
    assert not [s for s in receiver.spans if s.attributes.get("oms.order_id") == plain.order_id]
    (submit,) = [span for span in spans if span.name == "bridge.submit"]
    assert submit.parent_span_id == CALLER_SPAN_ID
    assert submit.attributes["oms.order_id"] == traced_id
