"""An order the matcher has recorded: its spec, its shard's stream, its lifecycle.

Apart from `orders` (the immutable spec, views and the transition table) because a
record points at its shard's `event_log.ShardStream`, whose events hold specs.
"""

from __future__ import annotations

from services.matcher.core.event_log import ShardStream
from services.matcher.core.orders import (
    NEW,
    ORDER_TRANSITIONS,
    OrderSpec,
    OrderTransitionError,
    OrderView,
    new_record,
)


class OrderRecord:
    """One order known to the dedup index: live in a book, or finished within the horizon."""

    __slots__ = (
        "arrival",
        "digest",
        "end_time_ms",
        "fees_paid",
        "filled_lots",
        "filled_notional",
        "key_digest",
        "order_id",
        "price_ticks",
        "quote_spent",
        "reject_reason",
        "remaining_lots",
        "side",
        "spec",
        "status",
        "stream",
        "user_id",
    )

    def __init__(self, spec: OrderSpec, stream: ShardStream, arrival: int, key_digest: int) -> None:
        self.spec = spec
        self.order_id = spec.order_id
        self.user_id = spec.user_id
        self.side = spec.side
        self.price_ticks = spec.price_ticks
        self.stream = stream
        self.arrival = arrival  # acceptance order; 0 for rejected orders
        self.key_digest = key_digest
        self.digest = 0  # this record's share of the state digest sum
        self.status = NEW
        self.filled_lots = 0
        self.remaining_lots = spec.quantity_lots
        self.filled_notional = 0
        self.fees_paid = 0
        self.quote_spent = 0
        self.end_time_ms = 0
        self.reject_reason = 0

    def move_to(self, status: int) -> None:
        """The one guard of the lifecycle: refuse any edge the table does not list."""
        if status not in ORDER_TRANSITIONS[self.status]:
            raise OrderTransitionError(
                f"order {self.order_id}: no transition from status {self.status} to {status}"
            )
        self.status = status

    def view(self) -> OrderView:
        return new_record(
            OrderView,
            (
                self.spec,
                self.status,
                self.filled_lots,
                self.remaining_lots,
                self.filled_notional,
                self.fees_paid,
                self.quote_spent,
            ),
        )
