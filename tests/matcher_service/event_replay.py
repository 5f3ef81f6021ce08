"""What a shard's event stream implies: contiguity, each order's grammar, its open orders.

Grammar of one order (matcher.proto): Accepted | Rejected, then after Accepted
Fill* and at most one end: a Fill with order_done, Cancelled or Expired.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.matcher_messages import OPEN, PARTIALLY_FILLED


def kind(event: matcher_pb2.MatcherEvent) -> str:
    which = event.WhichOneof("event")
    assert which is not None, f"event without a body: {event}"
    return which


def assert_contiguous(events: Sequence[matcher_pb2.MatcherEvent], first: int = 1) -> None:
    sequences = [event.sequence for event in events]
    assert sequences == list(range(first, first + len(events))), sequences


@dataclass
class OpenOrder:
    order_id: str
    user_id: int
    remaining_lots: int
    filled_lots: int = 0

    @property
    def status(self) -> int:
        return PARTIALLY_FILLED if self.filled_lots else OPEN


class StreamReplay:
    """Applies one shard's events in order, checking the grammar of every order."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self.last_sequence = 0
        self.open: dict[str, OpenOrder] = {}
        self.created: dict[str, str] = {}  # order id -> "accepted" | "rejected"
        self.ended: set[str] = set()
        self.trade_ids: dict[int, int] = {}  # trade id -> fills seen in this stream

    def apply_all(self, events: Iterable[matcher_pb2.MatcherEvent]) -> StreamReplay:
        for event in events:
            self.apply(event)
        return self

    def apply(self, event: matcher_pb2.MatcherEvent) -> None:
        assert event.oms_shard == self.shard, event
        assert event.sequence == self.last_sequence + 1, (self.last_sequence, event)
        self.last_sequence = event.sequence
        order_id = event.order_id
        assert order_id.startswith(f"{self.shard}:"), event
        body = kind(event)
        if body in ("accepted", "rejected"):
            assert order_id not in self.created, f"{order_id} created twice: {event}"
            self.created[order_id] = body
            if body == "accepted":
                order = event.accepted.order
                self.open[order_id] = OpenOrder(order_id, event.user_id, order.order.quantity_lots)
            else:
                self.ended.add(order_id)
            return
        assert self.created.get(order_id) == "accepted", f"{body} before Accepted: {event}"
        assert order_id not in self.ended, f"{body} after the end of {order_id}: {event}"
        live = self.open[order_id]
        if body == "fill":
            fill = event.fill
            self.trade_ids[fill.trade_id] = self.trade_ids.get(fill.trade_id, 0) + 1
            assert fill.quantity_lots > 0, event
            live.filled_lots += fill.quantity_lots
            if fill.order_done:
                self._end(order_id)
            else:
                assert fill.remaining_lots > 0, event
                live.remaining_lots = fill.remaining_lots
        elif body == "cancelled":
            assert event.cancelled.remaining_lots == live.remaining_lots, event
            self._end(order_id)
        else:
            assert event.expired.remaining_lots == live.remaining_lots, event
            self._end(order_id)

    def _end(self, order_id: str) -> None:
        del self.open[order_id]
        self.ended.add(order_id)

    def open_for(self, user_id: int) -> dict[str, tuple[int, int, int]]:
        """order id -> (status, filled_lots, remaining_lots) of the user's open orders."""
        return {
            order.order_id: (order.status, order.filled_lots, order.remaining_lots)
            for order in self.open.values()
            if order.user_id == user_id
        }


def snapshot_orders(snapshot: matcher_pb2.OpenOrdersSnapshot) -> dict[str, tuple[int, int, int]]:
    """The same shape as `StreamReplay.open_for`, from a GetOpenOrders answer."""
    return {
        state.order.order_id: (state.status, state.filled_lots, state.remaining_lots)
        for state in snapshot.orders
    }
