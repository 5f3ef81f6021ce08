"""A sampled order's way back through the shard: its fills settled, its trace carried on.

An order the gateway sampled reaches the shard's egress with its W3C traceparent
(`SubmitToME.order.trace_parent`, the gateway's span). When the shard's service frames
that egress it remembers the order (`MAX_TRACED_ORDERS` at most, the oldest
forgotten); each later fill of the order gets a "shard.settle_fill" span, from the
fill's log entry (its consensus time) to its egress being durable, under the
gateway's span; and the order's fill and order-update items carry the settlement's
traceparent (`ShardEgress.trace_parent`: the admission's for an update with no fill
at its position), so the persister's write of the rows and the gateway's update to
its subscriber continue the same trace. An update that ends the order forgets it.

The state machine knows nothing of this: it decides the same with tracing on or off,
and the traceparent is never in its hash. Unsampled orders cost a dictionary look-up
per fill or update item while any sampled order is remembered, and nothing otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from protos.oms.v1 import common_pb2
from services.observability.tracing import context_of, trace_parent_of, tracer

_tracer = tracer(__name__)
MAX_TRACED_ORDERS = 4_096
_TERMINAL = frozenset(
    {
        common_pb2.ORDER_STATUS_FILLED,
        common_pb2.ORDER_STATUS_CANCELLED,
        common_pb2.ORDER_STATUS_REJECTED,
        common_pb2.ORDER_STATUS_EXPIRED,
    }
)


class SettlementTraces:
    def __init__(self, capacity: int = MAX_TRACED_ORDERS) -> None:
        self.capacity = capacity
        # order id -> the traceparent its settlements are children of (the gateway's span)
        self.orders: OrderedDict[str, str] = OrderedDict()
        self.settled = 0  # shard.settle_fill spans started

    def mark(self, messages: Sequence[Any], time_ms: int) -> None:
        """Remember the sampled orders admitted in `messages` (one record's egress, as
        `shard_pb2.ShardEgress`), and give the fills and updates of remembered orders
        their span and traceparent. Fills first: an update at the same position is
        the settlement's child."""
        orders = self.orders
        for message in messages:
            if message.WhichOneof("egress") == "submit" and message.submit.order.trace_parent:
                order = message.submit.order
                orders[order.order_id] = order.trace_parent
                orders.move_to_end(order.order_id)
                while len(orders) > self.capacity:
                    orders.popitem(last=False)
        if not orders:
            return
        settled: dict[str, str] = {}
        for message in messages:
            if message.WhichOneof("egress") != "fill":
                continue
            fill = message.fill
            parent = orders.get(fill.order_id)
            if parent is None:
                continue
            span = _tracer.start_span(
                "shard.settle_fill",
                context=context_of(parent),
                start_time=time_ms * 1_000_000,
                attributes={
                    "oms.order_id": fill.order_id,
                    "oms.trade_id": fill.trade_id,
                    "oms.log_position": message.stamp.position,
                    "oms.quantity_lots": fill.quantity_lots,
                },
            )
            span.end()
            self.settled += 1
            settled[fill.order_id] = message.trace_parent = trace_parent_of(span)
        for message in messages:
            if message.WhichOneof("egress") != "order_update":
                continue
            update = message.order_update
            parent = orders.get(update.order_id)
            if parent is None:
                continue
            message.trace_parent = settled.get(update.order_id, parent)
            if update.status in _TERMINAL:
                del orders[update.order_id]
