"""The shard's memory of sampled orders for their fills' way back is bounded and let go:
at most its capacity (the oldest forgotten), an order forgotten by the update that ends
it, and unsampled orders never remembered. (The spans themselves, against a real
receiver, are in `tests/tracing/test_order_trace.py`.)"""

from __future__ import annotations

from protos.oms.v1 import common_pb2, shard_pb2
from services.shard.settlement_traces import SettlementTraces

TRACE_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _submit(order_id: str, trace_parent: str = TRACE_PARENT) -> shard_pb2.ShardEgress:
    egress = shard_pb2.ShardEgress()
    egress.submit.order.order_id = order_id
    egress.submit.order.trace_parent = trace_parent
    return egress


def _update(order_id: str, status: int) -> shard_pb2.ShardEgress:
    egress = shard_pb2.ShardEgress()
    egress.order_update.order_id = order_id
    egress.order_update.status = status  # type: ignore[assignment]
    return egress


def test_at_most_capacity_orders_are_remembered_the_oldest_forgotten() -> None:
    traces = SettlementTraces(capacity=3)
    traces.mark([_submit(f"o{n}") for n in range(5)], time_ms=1)
    assert list(traces.orders) == ["o2", "o3", "o4"]


def test_an_unsampled_order_is_never_remembered_nor_marked() -> None:
    traces = SettlementTraces()
    update = _update("plain", common_pb2.ORDER_STATUS_OPEN)
    traces.mark([_submit("plain", trace_parent=""), update], time_ms=1)
    assert not traces.orders and not update.trace_parent


def test_updates_carry_the_trace_until_the_one_that_ends_the_order() -> None:
    traces = SettlementTraces()
    traces.mark([_submit("o1")], time_ms=1)
    opened = _update("o1", common_pb2.ORDER_STATUS_OPEN)
    traces.mark([opened], time_ms=2)
    assert opened.trace_parent == TRACE_PARENT and "o1" in traces.orders
    cancelled = _update("o1", common_pb2.ORDER_STATUS_CANCELLED)
    traces.mark([cancelled], time_ms=3)
    assert cancelled.trace_parent == TRACE_PARENT and not traces.orders
