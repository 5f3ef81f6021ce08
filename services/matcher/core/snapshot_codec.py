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
    (layout 3 only) the market feed (u32 count), by symbol: book and trade sequences,
    digest, retained book updates then retained trades, oldest first

Layout 3 is written when the engine has a market feed (state-machine version 2 on),
layout 2 otherwise: a version-1 engine's snapshot is byte for byte what it was
before the feed. Restore rebuilds books, per-user index, expiry heap, dedup queue and digests
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
    SPEC_FIELDS,
    RetainedEvent,
    ShardStream,
)
from services.matcher.core.market_feed import DIGEST_SIZE, MarketFeed, TradeRow, UpdateRow
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import (
    BUY,
    GTD,
    LAST_LIVE,
    OPEN,
    ORDER_TRANSITIONS,
    OrderSpec,
    new_record,
)
from services.matcher.core.settings import SymbolSettings, check_symbols
from services.matcher.core.state_digest import (
    M_END,
    M_FEES,
    M_FILLED,
    M_NOTIONAL,
    M_REMAINING,
    M_SPENT,
    M_STATUS,
    MASK,
    finish,
    static_digest,
    text_digest,
)

if TYPE_CHECKING:
    from services.matcher.core.engine import MatcherEngine

MAGIC = b"OMSMATCH"
# 2: the state-machine version in force follows the counters (a 1 is at version 1)
# 3: the market feed follows the streams (written from state-machine version 2 on)
VERSION = 3
_LAYOUT_WITHOUT_FEED = 2
_READABLE_VERSIONS = (1, 2, 3)

_HEADER = struct.Struct("<8sI")
_COUNT = struct.Struct("<I")
_COUNTERS = struct.Struct("<QQ")
_MACHINE_VERSION = struct.Struct("<I")
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
_FEED = struct.Struct(f"<QQ{DIGEST_SIZE}s")
_BOOK_UPDATE = struct.Struct("<QQBI")
_LEVEL_CHANGE = struct.Struct("<Bqqq")
_TRADE = struct.Struct("<QQqqBQ")
_new_order = object.__new__
_SPEC_OMS_SHARD = OrderSpec._fields.index("oms_shard")


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
    feed = engine.feed
    parts.append(_HEADER.pack(MAGIC, VERSION if feed is not None else _LAYOUT_WITHOUT_FEED))
    parts.append(_COUNTERS.pack(engine.last_trade_id, engine.last_arrival))
    parts.append(_MACHINE_VERSION.pack(engine.machine_version))

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

    # Keyed by the spec's fields: an OrderSpec and a retained row's plain spec tuple are equal.
    spec_index: dict[tuple[Any, ...], int] = {}
    for order in live:
        spec_index.setdefault(order.spec, len(spec_index))
    for order in finished:
        spec_index.setdefault(order.spec, len(spec_index))
    for _, stream in streams:
        for row in stream.retained:
            spec_index.setdefault(row[-SPEC_FIELDS:], len(spec_index))
    writer.count(len(spec_index))
    for spec in spec_index:
        (
            order_id,
            user_id,
            symbol,
            side,
            order_type,
            time_in_force,
            price_ticks,
            quantity_lots,
            quote_amount,
            expire_at_ms,
            self_trade_prevention,
            oms_shard,
            user_seq,
        ) = spec
        writer.text(order_id)
        writer.text(symbol)
        writer.text(oms_shard)
        parts.append(
            _SPEC.pack(
                user_id,
                user_seq,
                side,
                order_type,
                time_in_force,
                price_ticks,
                quantity_lots,
                quote_amount,
                expire_at_ms,
                self_trade_prevention,
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
        for row in stream.retained:
            _write_event(parts, row, spec_index[row[-SPEC_FIELDS:]])
    if feed is not None:
        _write_feed(writer, feed)
    return b"".join(parts)


def _write_feed(writer: _Writer, feed: MarketFeed) -> None:
    parts = writer.parts
    writer.count(len(feed.symbols))
    for symbol, symbol_feed in sorted(feed.symbols.items()):
        writer.text(symbol)
        parts.append(
            _FEED.pack(symbol_feed.book_sequence, symbol_feed.trade_sequence, symbol_feed.digest)
        )
        writer.count(len(symbol_feed.updates))
        for row in symbol_feed.updates:
            parts.append(_BOOK_UPDATE.pack(row[0], row[1], row[2], (len(row) - 3) // 4))
            parts.extend(
                _LEVEL_CHANGE.pack(*row[index : index + 4]) for index in range(3, len(row), 4)
            )
        writer.count(len(symbol_feed.trades))
        parts.extend(_TRADE.pack(*row) for row in symbol_feed.trades)


def _arrival(order: OrderRecord) -> int:
    return order.arrival


def _write_event(parts: list[bytes], row: RetainedEvent, spec_number: int) -> None:
    kind = row[0]
    parts.append(_EVENT.pack(kind, row[1], row[2], spec_number))
    if kind == FILL:
        trade_id, price, quantity, notional, fee, maker, remaining, done = row[3:-SPEC_FIELDS]
        parts.append(_FILL.pack(trade_id, price, quantity, notional, fee, maker, remaining, done))
    elif kind == CANCELLED:
        reason, remaining = row[3:-SPEC_FIELDS]
        parts.append(_CANCELLED.pack(reason, remaining))
    elif kind == REJECTED:
        parts.append(_REJECTED.pack(row[3]))
    elif kind == EXPIRED:
        parts.append(_EXPIRED.pack(row[3]))
    elif kind != ACCEPTED:
        raise SnapshotFormatError(f"unknown retained event kind {kind}")


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
    machine_version: int
    symbols: list[tuple[SymbolSettings, bool, int, int, int]]
    kill_switched: list[int]
    specs: list[OrderSpec]
    live: list[tuple[int, ...]]
    finished: list[tuple[int, ...]]
    streams: list[tuple[str, int, list[RetainedEvent]]]
    # (symbol, book_sequence, trade_sequence, digest, updates, trades); None: no feed
    feed: list[tuple[str, int, int, bytes, list[UpdateRow], list[TradeRow]]] | None


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
    if magic != MAGIC or version not in _READABLE_VERSIONS:
        raise SnapshotFormatError(f"not a matcher snapshot of a version this code reads: {version}")
    last_trade_id, last_arrival = reader.unpack(_COUNTERS)
    (machine_version,) = reader.unpack(_MACHINE_VERSION) if version >= 2 else (1,)

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

    specs = _read_specs(reader)
    live = reader.rows(_ORDER)
    finished = reader.rows(_ORDER)

    streams = []
    for _ in range(reader.count()):
        oms_shard = reader.text()
        next_sequence, retained = reader.unpack(_STREAM)
        events = _read_events(reader, specs, retained)
        streams.append((oms_shard, next_sequence, events))
    feed = _read_feed(reader) if version >= 3 else None
    if (feed is not None) != (machine_version >= 2):
        raise SnapshotFormatError(
            f"state-machine version {machine_version} with snapshot layout {version}"
        )
    if reader.offset != len(data):
        raise SnapshotFormatError("trailing bytes after the matcher snapshot")
    return _Image(
        last_trade_id,
        last_arrival,
        machine_version,
        symbols,
        kill_switched,
        specs,
        live,
        finished,
        streams,
        feed,
    )


def _read_feed(
    reader: _Reader,
) -> list[tuple[str, int, int, bytes, list[UpdateRow], list[TradeRow]]]:
    feed = []
    for _ in range(reader.count()):
        symbol = reader.text()
        book_sequence, trade_sequence, digest = reader.unpack(_FEED)
        updates: list[UpdateRow] = []
        for _ in range(reader.count()):
            sequence, time_ms, status, levels = reader.unpack(_BOOK_UPDATE)
            row = [sequence, time_ms, status]
            for _ in range(levels):
                row.extend(reader.unpack(_LEVEL_CHANGE))
            updates.append(tuple(row))
        trades: list[TradeRow] = [
            (sequence, trade_id, price, quantity, side, time_ms)
            for sequence, trade_id, price, quantity, side, time_ms in reader.rows(_TRADE)
        ]
        feed.append((symbol, book_sequence, trade_sequence, digest, updates, trades))
    return feed


def _read_specs(reader: _Reader) -> list[OrderSpec]:
    """The spec table: `reader.text()` x3 and `reader.unpack(_SPEC)` per spec, inlined."""
    data = reader.data
    size = len(data)
    offset = reader.offset
    count_at = _COUNT.unpack_from
    spec_at = _SPEC.unpack_from
    spec_size = _SPEC.size
    names: dict[bytes, str] = {}  # symbols and shard names repeat: decode each once
    (count,) = count_at(data, offset)
    offset += _COUNT.size
    specs: list[OrderSpec] = []
    append = specs.append
    for _ in range(count):
        (length,) = count_at(data, offset)
        offset += 4
        end = offset + length
        if end > size:
            raise SnapshotFormatError("text runs past the end of the snapshot")
        order_id = data[offset:end].decode()
        (length,) = count_at(data, end)
        offset = end + 4
        end = offset + length
        if end > size:
            raise SnapshotFormatError("text runs past the end of the snapshot")
        raw = data[offset:end]
        symbol = names.get(raw)
        if symbol is None:
            symbol = names[raw] = raw.decode()
        (length,) = count_at(data, end)
        offset = end + 4
        end = offset + length
        if end > size:
            raise SnapshotFormatError("text runs past the end of the snapshot")
        raw = data[offset:end]
        oms_shard = names.get(raw)
        if oms_shard is None:
            oms_shard = names[raw] = raw.decode()
        (user_id, user_seq, side, order_type, tif, price, quantity, quote, expire, stp) = spec_at(
            data, end
        )
        offset = end + spec_size
        append(
            new_record(
                OrderSpec,
                (
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
                ),
            )
        )
    reader.offset = offset
    return specs


def _read_events(reader: _Reader, specs: list[OrderSpec], count: int) -> list[RetainedEvent]:
    """`count` retained events as rows: `reader.unpack` per event, inlined."""
    data = reader.data
    offset = reader.offset
    event_at = _EVENT.unpack_from
    event_size = _EVENT.size
    fill_at = _FILL.unpack_from
    cancelled_at = _CANCELLED.unpack_from
    rejected_at = _REJECTED.unpack_from
    expired_at = _EXPIRED.unpack_from
    rows: list[RetainedEvent] = []
    append = rows.append
    for _ in range(count):
        kind, sequence, time_ms, spec_number = event_at(data, offset)
        offset += event_size
        spec = specs[spec_number]
        if kind == FILL:
            trade_id, price, quantity, notional, fee, maker, remaining, done = fill_at(data, offset)
            offset += _FILL.size
            row: RetainedEvent = (
                FILL,
                sequence,
                time_ms,
                trade_id,
                price,
                quantity,
                notional,
                fee,
                bool(maker),
                remaining,
                bool(done),
            )
        elif kind == ACCEPTED:
            row = (ACCEPTED, sequence, time_ms)
        elif kind == CANCELLED:
            row = (CANCELLED, sequence, time_ms, *cancelled_at(data, offset))
            offset += _CANCELLED.size
        elif kind == REJECTED:
            row = (REJECTED, sequence, time_ms, *rejected_at(data, offset))
            offset += _REJECTED.size
        elif kind == EXPIRED:
            row = (EXPIRED, sequence, time_ms, *expired_at(data, offset))
            offset += _EXPIRED.size
        else:
            raise SnapshotFormatError(f"unknown event kind {kind}")
        append(row + spec)
    reader.offset = offset
    return rows


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
    engine.machine_version = image.machine_version
    engine.kill_switched = {user_id: None for user_id in image.kill_switched}

    retained = engine.settings.retained_events_per_shard
    for oms_shard, next_sequence, events in image.streams:
        stream = ShardStream(oms_shard, retained, text_digest(oms_shard))
        stream.next_sequence = next_sequence
        first = next_sequence - len(events)
        for offset, row in enumerate(events):
            if row[1] != first + offset or row[_SPEC_OMS_SHARD - SPEC_FIELDS] != oms_shard:
                raise SnapshotFormatError(f"events of shard {oms_shard!r} are not contiguous")
        if first < 1:
            raise SnapshotFormatError(f"shard {oms_shard!r} has events before sequence 1")
        stream.retained.extend(events)
        engine.streams[oms_shard] = stream

    books = engine.books
    user_orders = engine.user_orders
    expiries = engine.expiries
    previous_arrival = 0
    last_arrival = image.last_arrival
    live = _orders(engine, image.specs, image.live)
    for order in live:
        if not OPEN <= order.status <= LAST_LIVE or order.end_time_ms:
            raise SnapshotFormatError(f"live order {order.order_id} has a finished state")
        arrival = order.arrival
        if not previous_arrival < arrival <= last_arrival:
            raise SnapshotFormatError(f"live order {order.order_id} is out of arrival order")
        previous_arrival = arrival
        spec = order.spec
        book = books.get(spec.symbol)
        if book is None or order.remaining_lots <= 0:
            raise SnapshotFormatError(f"live order {order.order_id} cannot rest")
        (book.bids if order.side == BUY else book.asks).rest(order)
        by_user = user_orders.get(order.user_id)
        if by_user is None:
            user_orders[order.user_id] = {order.order_id: order}
        else:
            by_user[order.order_id] = order
        if spec.time_in_force == GTD:
            expiries.push(order)

    previous_end = 0
    finished: deque[OrderRecord] = engine.dedup.finished
    for order in _orders(engine, image.specs, image.finished):
        if order.status <= LAST_LIVE or ORDER_TRANSITIONS.get(order.status) != frozenset():
            raise SnapshotFormatError(f"finished order {order.order_id} has status {order.status}")
        if order.end_time_ms < previous_end:
            raise SnapshotFormatError("finished orders are not in end-time order")
        previous_end = order.end_time_ms
        finished.append(order)

    digest_sum = 0
    for order in engine.dedup.orders.values():
        digest_sum += order.digest
    engine.digest_sum = digest_sum & MASK
    if image.feed is not None:
        _install_feed(engine, image.feed)


def _install_feed(
    engine: MatcherEngine,
    image: list[tuple[str, int, int, bytes, list[UpdateRow], list[TradeRow]]],
) -> None:
    """The feed's sequences, digests and windows; its mirror from the books just rested."""
    feed = MarketFeed(engine.books, engine.settings.retained_market_data_per_symbol)
    if sorted(feed.symbols) != [entry[0] for entry in image]:
        raise SnapshotFormatError("the market feed's symbols are not the books'")
    for symbol, book_sequence, trade_sequence, digest, updates, trades in image:
        symbol_feed = feed.symbols[symbol]
        for last, rows, stream in (
            (book_sequence, updates, "book updates"),
            (trade_sequence, trades, "trades"),
        ):
            first = last + 1 - len(rows)
            if first < 1 or any(row[0] != first + index for index, row in enumerate(rows)):
                raise SnapshotFormatError(f"{stream} of symbol {symbol!r} are not contiguous")
        symbol_feed.book_sequence = book_sequence
        symbol_feed.trade_sequence = trade_sequence
        symbol_feed.digest = digest
        symbol_feed.updates.extend(updates)
        symbol_feed.trades.extend(trades)
    engine.feed = feed


def _orders(
    engine: MatcherEngine, specs: list[OrderSpec], rows: list[tuple[int, ...]]
) -> list[OrderRecord]:
    """Records for snapshot rows, with their digests, entered in the dedup index."""
    streams = engine.streams
    dedup_orders = engine.dedup.orders
    symbol_digests = {symbol: book.digest for symbol, book in engine.books.items()}
    orders = []
    for number, status, filled, remaining, notional, fees, spent, end_ms, arrival, reason in rows:
        spec = specs[number]
        order_id = spec.order_id
        stream = streams.get(spec.oms_shard)
        if stream is None or not spec.user_seq:
            raise SnapshotFormatError(f"order {order_id} names no known OMS shard")
        symbol_digest = symbol_digests.get(spec.symbol)
        if symbol_digest is None:
            symbol_digest = text_digest(spec.symbol)
        # OrderRecord(spec, stream, arrival, MatcherEngine.order_key_digest(...)), then
        # its restored fields.
        key_digest = static_digest(spec, stream.digest, symbol_digest, arrival, reason)
        order = _new_order(OrderRecord)
        order.spec = spec
        order.order_id = order_id
        order.user_id = spec.user_id
        order.side = spec.side
        order.price_ticks = spec.price_ticks
        order.stream = stream
        order.arrival = arrival
        order.key_digest = key_digest
        order.status = status
        order.filled_lots = filled
        order.remaining_lots = remaining
        order.filled_notional = notional
        order.fees_paid = fees
        order.quote_spent = spent
        order.end_time_ms = end_ms
        order.reject_reason = reason
        # state_digest.order_digest(order), inlined
        order.digest = finish(
            (
                key_digest
                + status * M_STATUS
                + remaining * M_REMAINING
                + filled * M_FILLED
                + notional * M_NOTIONAL
                + fees * M_FEES
                + spent * M_SPENT
                + end_ms * M_END
            )
            & MASK
        )
        if dedup_orders.setdefault(order_id, order) is not order:
            raise SnapshotFormatError(f"order id {order_id} appears twice")
        orders.append(order)
    return orders
