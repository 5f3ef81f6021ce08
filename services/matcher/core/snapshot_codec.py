"""The engine's whole state as canonical bytes, and back (little-endian, versioned).

Layout, in this order:
    magic "OMSMATCH", u32 version
    u64 last trade id, u64 last arrival
    symbols (u32 count): settings, halted, last trade
    kill-switched users (u32 count), ascending
    order specs (u32 count): every spec an order record or a retained event names
    live orders (u32 count), by arrival: the books' FIFO order is arrival order
    finished orders (u32 count), in dedup-sweep order (by end time, then finish order)
    OMS shard streams (u32 count), by name: next sequence, retained events oldest first

Restore rebuilds books, per-user index, expiry heap, dedup queue and digests
from these, checking on the way in what the engine relies on (statuses, a
strictly increasing arrival order, end times in order, contiguous sequences);
a violation raises `SnapshotFormatError` and leaves the engine untouched.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.matcher.core.errors import MatcherError, SnapshotFormatError
from services.matcher.core.event_log import (
    ACCEPTED,
    CANCELLED,
    EXPIRED,
    FILL,
    REJECTED,
    AcceptedEvent,
    CancelledEvent,
    EventRecord,
    ExpiredEvent,
    FillEvent,
    RejectedEvent,
    ShardStream,
)
from services.matcher.core.orders import (
    BUY,
    GTD,
    LAST_LIVE,
    OPEN,
    ORDER_TRANSITIONS,
    OrderRecord,
    OrderSpec,
)
from services.matcher.core.settings import SymbolSettings, check_symbols
from services.matcher.core.state_digest import MASK, order_digest, text_digest

if TYPE_CHECKING:
    from services.matcher.core.engine import MatcherEngine

MAGIC = b"OMSMATCH"
VERSION = 1

_HEADER = struct.Struct("<8sI")
_COUNT = struct.Struct("<I")
_COUNTERS = struct.Struct("<QQ")
_SYMBOL = struct.Struct("<qqqqqqqBqQQ")
_USER = struct.Struct("<Q")
_SPEC = struct.Struct("<QQiiiqqqQi")
_ORDER = struct.Struct("<IiqqqqqQQi")
_STREAM = struct.Struct("<QI")
_EVENT = struct.Struct("<BQQI")
_REJECTED = struct.Struct("<i")
_FILL = struct.Struct("<QqqqqBqB")
_CANCELLED = struct.Struct("<iq")
_EXPIRED = struct.Struct("<q")


# --- writing ----------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def text(self, value: str) -> None:
        data = value.encode()
        self.parts.append(_COUNT.pack(len(data)))
        self.parts.append(data)

    def count(self, value: int) -> None:
        self.parts.append(_COUNT.pack(value))


def write_snapshot(engine: MatcherEngine) -> bytes:
    writer = _Writer()
    parts = writer.parts
    parts.append(_HEADER.pack(MAGIC, VERSION))
    parts.append(_COUNTERS.pack(engine.last_trade_id, engine.last_arrival))

    writer.count(len(engine.books))
    for book in engine.books.values():
        config = book.settings
        writer.text(config.symbol)
        writer.text(config.base_asset)
        writer.text(config.quote_asset)
        parts.append(
            _SYMBOL.pack(
                config.lot_size,
                config.tick_size,
                config.min_notional,
                config.price_band_bps,
                config.reference_price_ticks,
                config.maker_fee_ppm,
                config.taker_fee_ppm,
                book.halted,
                book.last_price_ticks,
                book.last_trade_id,
                book.last_trade_time_ms,
            )
        )

    writer.count(len(engine.kill_switched))
    parts.extend(_USER.pack(user_id) for user_id in sorted(engine.kill_switched))

    live = sorted(
        (order for order in engine.dedup.orders.values() if order.status <= LAST_LIVE),
        key=_arrival,
    )
    finished = list(engine.dedup.finished)
    if len(live) + len(finished) != len(engine.dedup.orders):
        raise SnapshotFormatError("the dedup index and its sweep queue disagree")
    streams = sorted(engine.streams.items())

    spec_index: dict[OrderSpec, int] = {}
    for order in live:
        spec_index.setdefault(order.spec, len(spec_index))
    for order in finished:
        spec_index.setdefault(order.spec, len(spec_index))
    for _, stream in streams:
        for event in stream.retained:
            spec_index.setdefault(event.spec, len(spec_index))
    writer.count(len(spec_index))
    for spec in spec_index:
        writer.text(spec.order_id)
        writer.text(spec.symbol)
        writer.text(spec.oms_shard)
        parts.append(
            _SPEC.pack(
                spec.user_id,
                spec.user_seq,
                spec.side,
                spec.order_type,
                spec.time_in_force,
                spec.price_ticks,
                spec.quantity_lots,
                spec.quote_amount,
                spec.expire_at_ms,
                spec.self_trade_prevention,
            )
        )

    for orders in (live, finished):
        writer.count(len(orders))
        parts.extend(
            _ORDER.pack(
                spec_index[order.spec],
                order.status,
                order.filled_lots,
                order.remaining_lots,
                order.filled_notional,
                order.fees_paid,
                order.quote_spent,
                order.end_time_ms,
                order.arrival,
                order.reject_reason,
            )
            for order in orders
        )

    writer.count(len(streams))
    for oms_shard, stream in streams:
        writer.text(oms_shard)
        parts.append(_STREAM.pack(stream.next_sequence, len(stream.retained)))
        for event in stream.retained:
            _write_event(parts, event, spec_index[event.spec])
    return b"".join(parts)


def _arrival(order: OrderRecord) -> int:
    return order.arrival


def _write_event(parts: list[bytes], event: EventRecord, spec_number: int) -> None:
    if isinstance(event, FillEvent):
        parts.append(_EVENT.pack(FILL, event.sequence, event.consensus_time_ms, spec_number))
        parts.append(
            _FILL.pack(
                event.trade_id,
                event.price_ticks,
                event.quantity_lots,
                event.notional,
                event.fee,
                event.maker,
                event.remaining_lots,
                event.order_done,
            )
        )
    elif isinstance(event, AcceptedEvent):
        parts.append(_EVENT.pack(ACCEPTED, event.sequence, event.consensus_time_ms, spec_number))
    elif isinstance(event, CancelledEvent):
        parts.append(_EVENT.pack(CANCELLED, event.sequence, event.consensus_time_ms, spec_number))
        parts.append(_CANCELLED.pack(event.reason, event.remaining_lots))
    elif isinstance(event, RejectedEvent):
        parts.append(_EVENT.pack(REJECTED, event.sequence, event.consensus_time_ms, spec_number))
        parts.append(_REJECTED.pack(event.reason))
    else:
        parts.append(_EVENT.pack(EXPIRED, event.sequence, event.consensus_time_ms, spec_number))
        parts.append(_EXPIRED.pack(event.remaining_lots))


# --- reading ----------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values

    def count(self) -> int:
        return int(self.unpack(_COUNT)[0])

    def rows(self, layout: struct.Struct) -> list[tuple[Any, ...]]:
        """A u32 count, then that many fixed-size rows, read in one pass."""
        count = self.count()
        end = self.offset + count * layout.size
        if end > len(self.data):
            raise SnapshotFormatError("rows run past the end of the snapshot")
        rows = list(layout.iter_unpack(self.data[self.offset : end]))
        self.offset = end
        return rows

    def text(self) -> str:
        length = self.count()
        end = self.offset + length
        if end > len(self.data):
            raise SnapshotFormatError("text runs past the end of the snapshot")
        value = self.data[self.offset : end].decode()
        self.offset = end
        return value


@dataclass
class _Image:
    """A parsed snapshot, not yet installed in an engine."""

    last_trade_id: int
    last_arrival: int
    symbols: list[tuple[SymbolSettings, bool, int, int, int]]
    kill_switched: list[int]
    specs: list[OrderSpec]
    live: list[tuple[int, ...]]
    finished: list[tuple[int, ...]]
    streams: list[tuple[str, int, list[EventRecord]]]


def restore_snapshot(engine: MatcherEngine, data: bytes) -> None:
    """Replace the engine's whole state with the snapshot's."""
    try:
        image = _read_image(data)
    except SnapshotFormatError:
        raise
    except (struct.error, UnicodeDecodeError, IndexError, ValueError, MatcherError) as error:
        raise SnapshotFormatError(f"unreadable matcher snapshot: {error}") from error
    scratch = type(engine)(engine.settings)
    _install(scratch, image)
    # Only a fully built and checked image replaces the live state, all of it at once.
    vars(engine).update(vars(scratch))


def _read_image(data: bytes) -> _Image:
    reader = _Reader(data)
    magic, version = reader.unpack(_HEADER)
    if magic != MAGIC or version != VERSION:
        raise SnapshotFormatError(f"not a version {VERSION} matcher snapshot")
    last_trade_id, last_arrival = reader.unpack(_COUNTERS)

    symbols = []
    for _ in range(reader.count()):
        symbol, base_asset, quote_asset = reader.text(), reader.text(), reader.text()
        (lot, tick, min_notional, band, reference, maker, taker, halted, price, trade, time_ms) = (
            reader.unpack(_SYMBOL)
        )
        settings = SymbolSettings(
            symbol, base_asset, quote_asset, lot, tick, min_notional, band, reference, maker, taker
        )
        symbols.append((settings, bool(halted), price, trade, time_ms))

    kill_switched = [row[0] for row in reader.rows(_USER)]

    specs = []
    for _ in range(reader.count()):
        order_id, symbol, oms_shard = reader.text(), reader.text(), reader.text()
        (user_id, user_seq, side, order_type, tif, price, quantity, quote, expire, stp) = (
            reader.unpack(_SPEC)
        )
        specs.append(
            OrderSpec(
                order_id,
                user_id,
                symbol,
                side,
                order_type,
                tif,
                price,
                quantity,
                quote,
                expire,
                stp,
                oms_shard,
                user_seq,
            )
        )

    live = reader.rows(_ORDER)
    finished = reader.rows(_ORDER)

    streams = []
    for _ in range(reader.count()):
        oms_shard = reader.text()
        next_sequence, retained = reader.unpack(_STREAM)
        events = [_read_event(reader, specs) for _ in range(retained)]
        streams.append((oms_shard, next_sequence, events))
    if reader.offset != len(data):
        raise SnapshotFormatError("trailing bytes after the matcher snapshot")
    return _Image(
        last_trade_id, last_arrival, symbols, kill_switched, specs, live, finished, streams
    )


def _read_event(reader: _Reader, specs: list[OrderSpec]) -> EventRecord:
    kind, sequence, time_ms, spec_number = reader.unpack(_EVENT)
    spec = specs[spec_number]
    if kind == FILL:
        trade_id, price, quantity, notional, fee, maker, remaining, done = reader.unpack(_FILL)
        return FillEvent(
            sequence,
            time_ms,
            spec,
            trade_id,
            price,
            quantity,
            notional,
            fee,
            bool(maker),
            remaining,
            bool(done),
        )
    if kind == ACCEPTED:
        return AcceptedEvent(sequence, time_ms, spec)
    if kind == CANCELLED:
        reason, remaining = reader.unpack(_CANCELLED)
        return CancelledEvent(sequence, time_ms, spec, reason, remaining)
    if kind == REJECTED:
        return RejectedEvent(sequence, time_ms, spec, reader.unpack(_REJECTED)[0])
    if kind == EXPIRED:
        return ExpiredEvent(sequence, time_ms, spec, reader.unpack(_EXPIRED)[0])
    raise SnapshotFormatError(f"unknown event kind {kind}")


def _install(engine: MatcherEngine, image: _Image) -> None:
    symbol_settings = [entry[0] for entry in image.symbols]
    problems = check_symbols(tuple(symbol_settings))
    if problems:
        raise SnapshotFormatError("; ".join(problems))
    engine.install_symbols(symbol_settings)
    for settings, halted, price, trade_id, time_ms in image.symbols:
        symbol_book = engine.books[settings.symbol]
        symbol_book.halted = halted
        symbol_book.last_price_ticks = price
        symbol_book.last_trade_id = trade_id
        symbol_book.last_trade_time_ms = time_ms
    engine.last_trade_id = image.last_trade_id
    engine.last_arrival = image.last_arrival
    engine.kill_switched = {user_id: None for user_id in image.kill_switched}

    retained = engine.settings.retained_events_per_shard
    for oms_shard, next_sequence, events in image.streams:
        stream = ShardStream(oms_shard, retained, text_digest(oms_shard))
        stream.next_sequence = next_sequence
        first = next_sequence - len(events)
        for offset, event in enumerate(events):
            if event.sequence != first + offset or event.spec.oms_shard != oms_shard:
                raise SnapshotFormatError(f"events of shard {oms_shard!r} are not contiguous")
        if first < 1:
            raise SnapshotFormatError(f"shard {oms_shard!r} has events before sequence 1")
        stream.retained.extend(events)
        engine.streams[oms_shard] = stream

    previous_arrival = 0
    for fields in image.live:
        order = _order(engine, image.specs, fields)
        if not OPEN <= order.status <= LAST_LIVE or order.end_time_ms:
            raise SnapshotFormatError(f"live order {order.order_id} has a finished state")
        if not previous_arrival < order.arrival <= image.last_arrival:
            raise SnapshotFormatError(f"live order {order.order_id} is out of arrival order")
        previous_arrival = order.arrival
        book = engine.books.get(order.spec.symbol)
        if book is None or order.remaining_lots <= 0:
            raise SnapshotFormatError(f"live order {order.order_id} cannot rest")
        (book.bids if order.side == BUY else book.asks).rest(order)
        engine.user_orders.setdefault(order.user_id, {})[order.order_id] = order
        if order.spec.time_in_force == GTD:
            engine.expiries.push(order)

    previous_end = 0
    finished: deque[OrderRecord] = engine.dedup.finished
    for fields in image.finished:
        order = _order(engine, image.specs, fields)
        if order.status <= LAST_LIVE or ORDER_TRANSITIONS.get(order.status) != frozenset():
            raise SnapshotFormatError(f"finished order {order.order_id} has status {order.status}")
        if order.end_time_ms < previous_end:
            raise SnapshotFormatError("finished orders are not in end-time order")
        previous_end = order.end_time_ms
        finished.append(order)

    digest_sum = 0
    for order in engine.dedup.orders.values():
        order.digest = order_digest(order)
        digest_sum += order.digest
    engine.digest_sum = digest_sum & MASK


def _order(engine: MatcherEngine, specs: list[OrderSpec], fields: tuple[int, ...]) -> OrderRecord:
    (number, status, filled, remaining, notional, fees, spent, end_ms, arrival, reason) = fields
    spec = specs[number]
    stream = engine.streams.get(spec.oms_shard)
    if stream is None or not spec.user_seq:
        raise SnapshotFormatError(f"order {spec.order_id} names no known OMS shard")
    order = OrderRecord(
        spec, stream, arrival, engine.order_key_digest(spec, stream, arrival, reason)
    )
    order.status = status
    order.filled_lots = filled
    order.remaining_lots = remaining
    order.filled_notional = notional
    order.fees_paid = fees
    order.quote_spent = spent
    order.end_time_ms = end_ms
    order.reject_reason = reason
    if engine.dedup.orders.setdefault(spec.order_id, order) is not order:
        raise SnapshotFormatError(f"order id {spec.order_id} appears twice")
    return order
