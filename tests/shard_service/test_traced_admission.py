"""A sampled order's trace crosses the shard's log: its span arrives at a real OTLP receiver
as a child of the caller's span, and its SubmitToME egress carries the traceparent on."""

from __future__ import annotations

from collections.abc import Callable

from tests.otlp_receiver import OtlpReceiver
from tests.shard_service.shard_client import (
    ShardClient,
    deposit,
    hydrate,
    limit_order,
)
from tests.shard_service.shard_process import ShardProcess, aio_channel

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"


async def test_a_sampled_order_has_a_shard_span_under_its_callers_span(
    new_shard: Callable[..., ShardProcess],
) -> None:
    async with OtlpReceiver() as receiver:
        process = new_shard(
            environment={"OMS_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        )
        process.start_serving()
        async with aio_channel(process.address) as channel:
            shard = ShardClient(channel)
            await shard.run(hydrate(3), deposit(3, 10_000_000_000))
            order = limit_order(3, "traced-1", price_ticks=6_500_000, quantity_lots=1)
            order.place.trace_parent = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
            (placed,) = await shard.run(order)
            assert placed.accepted, placed
            (span,) = await receiver.wait_trace(TRACE_ID, {"oms-shard"})
            assert span.name == "shard.admit_order"
            assert span.parent_span_id == CALLER_SPAN_ID
            assert span.attributes["oms.order_id"] == placed.order_id
            snapshot = await shard.in_flight()
            (submit,) = [item.submit for item in snapshot.items]
            assert submit.order.trace_parent == order.place.trace_parent
