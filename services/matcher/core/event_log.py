"""Lifecycle events, sequenced and retained per owning OMS shard (contract point 3).

Every event belongs to the OMS shard named by its order id's prefix and carries
that shard's next `sequence` (1, 2, 3, ... with no gap). The newest
`retained_events_per_shard` events of each shard stay in the state, so a
subscriber resumes from any retained sequence; older ones raise
`SequenceTooOldError`. Events are plain records here; `codec` turns them into
`oms.v1.MatcherEvent` at the edge, identically for live egress and for resumes.

The retained window holds each event as a `RetainedEvent`: one flat tuple of plain
values, `(kind, sequence, consensus_time_ms, *the kind's own fields, *the 13 fields
of its OrderSpec)`. Holding no container, such a tuple is untracked by CPython's
cyclic garbage collector, which therefore never walks the (large) retained windows;
`events_from` turns rows back into records.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Final, NamedTuple, TypeAlias

from services.matcher.core.errors import SequenceTooOldError
from services.matcher.core.orders import OrderSpec, new_record

ACCEPTED: Final = 1
REJECTED: Final = 2
FILL: Final = 3
CANCELLED: Final = 4
EXPIRED: Final = 5


class AcceptedEvent(NamedTuple):
    sequence: int
    consensus_time_ms: int
    spec: OrderSpec  # the state at acceptance is OPEN, nothing filled


class RejectedEvent(NamedTuple):
    sequence: int
    consensus_time_ms: int
    spec: OrderSpec
    reason: int  # MatcherRejectReason


class FillEvent(NamedTuple):
    sequence: int
    consensus_time_ms: int
    spec: OrderSpec
    trade_id: int
    price_ticks: int
    quantity_lots: int
    notional: int
    fee: int
    maker: bool
    remaining_lots: int
    order_done: bool


class CancelledEvent(NamedTuple):
    sequence: int
    consensus_time_ms: int
    spec: OrderSpec
    reason: int  # CancelReason
    remaining_lots: int


class ExpiredEvent(NamedTuple):
    sequence: int
    consensus_time_ms: int
    spec: OrderSpec
    remaining_lots: int


EventRecord = AcceptedEvent | RejectedEvent | FillEvent | CancelledEvent | ExpiredEvent

# (kind, sequence, consensus_time_ms, *own fields, *OrderSpec fields): see the docstring.
RetainedEvent: TypeAlias = tuple[Any, ...]
SPEC_FIELDS: Final = len(OrderSpec._fields)


def retained_event(event: EventRecord) -> RetainedEvent:
    """The flat row of an event record (the engine's hot paths build their rows inline)."""
    sequence, consensus_time_ms, spec, *own = event
    if isinstance(event, FillEvent):
        kind = FILL
    elif isinstance(event, AcceptedEvent):
        kind = ACCEPTED
    elif isinstance(event, CancelledEvent):
        kind = CANCELLED
    elif isinstance(event, RejectedEvent):
        kind = REJECTED
    else:
        kind = EXPIRED
    return (kind, sequence, consensus_time_ms, *own, *spec)


def event_record(row: RetainedEvent) -> EventRecord:
    """The record of a retained row: a new OrderSpec equal to the one it was made from."""
    kind = row[0]
    spec = new_record(OrderSpec, row[-SPEC_FIELDS:])
    head = (row[1], row[2], spec)
    if kind == FILL:
        return new_record(FillEvent, head + row[3:-SPEC_FIELDS])
    if kind == ACCEPTED:
        return new_record(AcceptedEvent, head)
    if kind == CANCELLED:
        return new_record(CancelledEvent, head + row[3:-SPEC_FIELDS])
    if kind == REJECTED:
        return new_record(RejectedEvent, head + row[3:-SPEC_FIELDS])
    return new_record(ExpiredEvent, head + row[3:-SPEC_FIELDS])


class ShardStream:
    """One OMS shard's event stream: its sequence counter and its retained window."""

    __slots__ = ("digest", "next_sequence", "oms_shard", "retained")

    def __init__(self, oms_shard: str, retained_events: int, digest: int) -> None:
        self.oms_shard = oms_shard
        self.next_sequence = 1
        self.retained: deque[RetainedEvent] = deque(maxlen=retained_events)
        self.digest = digest  # stable digest of the shard name, for order digests

    @property
    def last_sequence(self) -> int:
        """The sequence of the newest event, 0 before the first."""
        return self.next_sequence - 1

    @property
    def first_retained_sequence(self) -> int:
        return self.next_sequence - len(self.retained)

    def events_from(self, from_sequence: int, limit: int | None = None) -> list[EventRecord]:
        """Retained events with sequence >= from_sequence, oldest first, at most `limit`."""
        first = self.first_retained_sequence
        start = max(from_sequence, 1)
        if start < first:
            raise SequenceTooOldError(self.oms_shard, from_sequence, first)
        retained = self.retained
        wanted = len(retained) - (start - first)  # counted from the newest end
        if wanted <= 0:
            return []
        if limit is not None and limit < wanted:
            return [
                event_record(row) for row in islice(retained, start - first, start - first + limit)
            ]
        # Resumes are usually near the head: walk from the newest end, O(wanted).
        newest_first = list(islice(reversed(retained), wanted))
        newest_first.reverse()
        return [event_record(row) for row in newest_first]
