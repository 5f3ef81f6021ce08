"""The matcher's state and the steps every command shares: streams, digests, order ends.

`MatcherEngine` (`engine.py`) is this state plus its commands; the commands live in
`submission` (a new order, matched by `matching`) and `controls` (cancel, halt,
resume, kill switch). The steps here are what they have in common: a shard's event
stream, an order's share of the state digest, and the ways an order ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from protos.oms.v1 import matcher_pb2
from services.matcher.core.commands import CommandResult
from services.matcher.core.dedup import DedupIndex
from services.matcher.core.errors import MatcherInvariantError
from services.matcher.core.event_log import CANCELLED as CANCELLED_KIND
from services.matcher.core.event_log import (
    CancelledEvent,
    EventRecord,
    ExpiredEvent,
    RejectedEvent,
    ShardStream,
    retained_event,
)
from services.matcher.core.expiry import ExpiryQueue
from services.matcher.core.market_feed import MarketFeed
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import BUY, EXPIRED, GTD, REJECTED, OrderSpec, new_record
from services.matcher.core.settings import EngineSettings, SymbolSettings
from services.matcher.core.state_digest import MASK, order_digest, static_digest, text_digest
from services.matcher.core.symbols import SymbolBook

REQUESTED: Final[int] = matcher_pb2.CANCEL_REASON_REQUESTED
IOC_REMAINDER: Final[int] = matcher_pb2.CANCEL_REASON_IOC_REMAINDER
SELF_TRADE: Final[int] = matcher_pb2.CANCEL_REASON_SELF_TRADE
KILL_SWITCH: Final[int] = matcher_pb2.CANCEL_REASON_KILL_SWITCH
HALT: Final[int] = matcher_pb2.CANCEL_REASON_HALT
PRICE_BAND: Final[int] = matcher_pb2.CANCEL_REASON_PRICE_BAND

CANCEL_OLDEST: Final[int] = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_OLDEST
CANCEL_BOTH: Final[int] = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_BOTH


class EngineState:
    """Books, dedup index, event streams and counters of one matcher group."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.books: dict[str, SymbolBook] = {}
        self.dedup = DedupIndex()
        self.streams: dict[str, ShardStream] = {}
        self.user_orders: dict[int, dict[str, OrderRecord]] = {}  # resting, arrival order
        self.kill_switched: dict[int, None] = {}  # used as an ordered set
        self.expiries = ExpiryQueue()
        self.last_trade_id = 0
        self.last_arrival = 0
        self.digest_sum = 0  # sum of every dedup record's digest, mod 2^64
        self.machine_version = 1  # the state-machine version decisions are made under
        self.feed: MarketFeed | None = None  # the market-data feed, from version 2 on
        self.install_symbols(settings.symbols)

    def install_symbols(self, symbols: Sequence[SymbolSettings]) -> None:
        """Replace the symbol table (at construction, or by a restore before its orders)."""
        self.books = {symbol.symbol: SymbolBook(symbol) for symbol in symbols}

    def shard_stream(self, oms_shard: str) -> ShardStream:
        stream = self.streams.get(oms_shard)
        if stream is None:
            stream = ShardStream(
                oms_shard, self.settings.retained_events_per_shard, text_digest(oms_shard)
            )
            self.streams[oms_shard] = stream
        return stream

    def order_key_digest(
        self, spec: OrderSpec, stream: ShardStream, arrival: int, reject_reason: int
    ) -> int:
        book = self.books.get(spec.symbol)
        symbol_digest = text_digest(spec.symbol) if book is None else book.digest
        return static_digest(spec, stream.digest, symbol_digest, arrival, reject_reason)

    def rehash(self, order: OrderRecord) -> None:
        digest = order_digest(order)
        self.digest_sum = (self.digest_sum + digest - order.digest) & MASK
        order.digest = digest

    def retire(self, order: OrderRecord, status: int, now: int) -> None:
        """A resting order ends: leave the per-user index and queue for the dedup sweep.

        The caller has already taken it out of its book.
        """
        order.move_to(status)
        order.end_time_ms = now
        self.dedup.finished.append(order)
        by_user = self.user_orders.get(order.user_id)
        if by_user is None or by_user.pop(order.order_id, None) is not order:
            raise MatcherInvariantError(f"resting order {order.order_id} is not indexed")
        if not by_user:
            del self.user_orders[order.user_id]
        if order.spec.time_in_force == GTD and status != EXPIRED:
            self.expiries.note_finished()

    def close(
        self, order: OrderRecord, status: int, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        """An incoming order that will not rest ends with its remainder cancelled."""
        order.move_to(status)
        order.end_time_ms = now
        self.dedup.finished.append(order)
        self.emit_cancelled(order, reason, now, events)

    def emit_cancelled(
        self, order: OrderRecord, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        stream = order.stream
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        spec = order.spec
        remaining = order.remaining_lots
        events.append(new_record(CancelledEvent, (sequence, now, spec, reason, remaining)))
        stream.retained.append((CANCELLED_KIND, sequence, now, reason, remaining) + spec)  # noqa: RUF005

    def cancel_resting(
        self, order: OrderRecord, status: int, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        """Cancel or expire a resting order: out of its book, one event."""
        book = self.books[order.spec.symbol]
        side = book.bids if order.side == BUY else book.asks
        self.retire(order, status, now)
        side.withdraw(order)
        if status == EXPIRED:
            stream = order.stream
            sequence = stream.next_sequence
            stream.next_sequence = sequence + 1
            spec = order.spec
            remaining = order.remaining_lots
            event: EventRecord = ExpiredEvent(sequence, now, spec, remaining)
            events.append(event)
            stream.retained.append(retained_event(event))
        else:
            self.emit_cancelled(order, reason, now, events)
        self.rehash(order)

    def reject(
        self, correlation_id: int, spec: OrderSpec, reason: int, now: int, events: list[EventRecord]
    ) -> CommandResult:
        stream = self.shard_stream(spec.oms_shard)
        order = OrderRecord(spec, stream, 0, self.order_key_digest(spec, stream, 0, reason))
        order.move_to(REJECTED)
        order.reject_reason = reason
        order.end_time_ms = now
        self.dedup.orders[spec.order_id] = order
        self.dedup.finished.append(order)
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        event = RejectedEvent(sequence, now, spec, reason)
        events.append(event)
        stream.retained.append(retained_event(event))
        self.rehash(order)
        return CommandResult(correlation_id, False, order.view(), reason, False)
