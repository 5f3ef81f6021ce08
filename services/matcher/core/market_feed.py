"""The market-data feed (state-machine version 2): per symbol, the book's changes and the trades.

Published from the log, deterministically, at the end of each log entry (an `execute`
batch or an `on_timer` sweep), by every replica alike; only the leader sends it, like
every other egress. Per symbol, at most:

- each trade of the entry, in trade order, as a `PublicTrade` with the symbol's next
  `trade_sequence` (1, 2, 3 ... no gap): one per match, read from the taker's `Fill`
  (a match gives a maker and a taker fill; only the taker's is counted);
- then ONE `BookUpdate` with the symbol's next `book_sequence` (1, 2, 3 ... no gap) when
  its book differs from what the previous update left: the levels whose
  `(total_lots, order_count)` differ from what they were at the end of the previous
  entry, as `LevelChange(side, price_ticks, total_lots, order_count)`, bids best first
  then asks best first, `total_lots == 0` meaning the level is gone; and the book's
  status (TRADING or HALTED) at the end of the entry. A level changed and restored
  within one entry is left out, always; a change of status alone is an update with no
  level. An entry that leaves a symbol's book as it found it publishes no update.

A halted book keeps its resting orders (`HaltSymbol` without `cancel_resting`): the
update that says HALTED shows them unchanged, and cancels, GTD expiries and kill
switches go on changing its levels while halted. With `cancel_resting` the same update
that says HALTED removes every level. A kill switch is not a status: it shows as the
levels its cancels change.

Which levels to look at is read from the entry's events (every change of a book is an
event naming the order's symbol, side and limit price: a rest follows an Accepted, a
fill, a cancel or an expiry is one), so the matching loop pays nothing for the feed.
The level values come from the book's aggregates (`order_book.PriceLevel.total_lots`,
`live_count`); each symbol keeps a mirror of the values it last published, equal to
the book at every entry boundary, to tell a change from a level restored. The mirror
and the published status are derived: a restore and an activation rebuild them from
the book.

Retention: the newest `retained_market_data_per_symbol` book updates and as many
trades stay per symbol, as flat tuples of ints (untracked by CPython's cyclic garbage
collector, like `event_log`'s rows); a subscriber resumes from any retained sequence,
and from an older one gets `MarketSequenceTooOldError` and takes a new snapshot. Each
symbol also keeps a digest chained over every row it published, which the state hash
covers, so followers verify what was published, not only how much.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Final, NamedTuple, TypeAlias, TypeVar

from protos.oms.v1 import matcher_pb2
from services.matcher.core.errors import MarketSequenceTooOldError, UnknownSymbolError
from services.matcher.core.event_log import EventRecord, FillEvent, RejectedEvent
from services.matcher.core.order_book import BookSide
from services.matcher.core.orders import BUY, LIMIT, new_record
from services.matcher.core.settings import INT64_MAX
from services.matcher.core.symbols import SymbolBook

TRADING: Final[int] = matcher_pb2.BOOK_STATUS_TRADING
HALTED: Final[int] = matcher_pb2.BOOK_STATUS_HALTED
DIGEST_SIZE: Final = 16


class LevelChange(NamedTuple):
    """One level of one side as it is now; `total_lots == 0`: the level is gone."""

    side: int  # BUY or SELL
    price_ticks: int
    total_lots: int  # the remaining lots of its resting orders (at most INT64_MAX)
    order_count: int


class BookUpdate(NamedTuple):
    """What one log entry changed in one symbol's book."""

    symbol: str
    book_sequence: int  # 1, 2, 3 ... per symbol
    consensus_time_ms: int
    status: int  # TRADING or HALTED, after the entry
    levels: tuple[LevelChange, ...]  # bids best first, then asks best first


class PublicTrade(NamedTuple):
    """One match, as the public sees it: no order, no user."""

    symbol: str
    trade_sequence: int  # 1, 2, 3 ... per symbol
    trade_id: int  # the matcher group's (Fill.trade_id)
    price_ticks: int
    quantity_lots: int
    taker_side: int  # the incoming order's side: BUY lifted an ask, SELL hit a bid
    consensus_time_ms: int


class BookLevel(NamedTuple):
    price_ticks: int
    total_lots: int
    order_count: int


class BookSnapshot(NamedTuple):
    """A symbol's book as of its `book_sequence` (and trades up to `trade_sequence`)."""

    book_sequence: int
    trade_sequence: int
    status: int
    bids: tuple[BookLevel, ...]  # best (highest) first
    asks: tuple[BookLevel, ...]  # best (lowest) first
    last_trade_id: int = 0  # the symbol's last trade's id (Fill.trade_id), 0: none
    consensus_time_ms: int = 0  # of the newest retained update, 0: none
    last_price_ticks: int = 0  # the symbol's last trade's price, 0: none


MarketRecord = PublicTrade | BookUpdate

# Retained rows, flat tuples of ints:
#   a book update: (book_sequence, consensus_time_ms, status, *(side, price, total, count)...)
#   a trade: (trade_sequence, trade_id, price_ticks, quantity_lots, taker_side, time_ms)
UpdateRow: TypeAlias = tuple[int, ...]
TradeRow: TypeAlias = tuple[int, int, int, int, int, int]
_UPDATE_HEAD: Final = 3
_Row = TypeVar("_Row", bound=tuple[int, ...])


def update_record(symbol: str, row: UpdateRow) -> BookUpdate:
    levels = tuple(
        new_record(LevelChange, row[index : index + 4])
        for index in range(_UPDATE_HEAD, len(row), 4)
    )
    return new_record(BookUpdate, (symbol, row[0], row[1], row[2], levels))


def trade_record(symbol: str, row: TradeRow) -> PublicTrade:
    return new_record(PublicTrade, (symbol, *row))


class SymbolFeed:
    """One symbol's feed: its sequences, retained windows, digest, and the published mirror."""

    __slots__ = (
        "ask_levels",
        "bid_levels",
        "book_sequence",
        "digest",
        "halted",
        "symbol",
        "trade_sequence",
        "trades",
        "updates",
    )

    def __init__(self, symbol: str, retained: int) -> None:
        self.symbol = symbol
        self.book_sequence = 0  # of the newest update, 0 before the first
        self.trade_sequence = 0  # of the newest trade, 0 before the first
        self.updates: deque[UpdateRow] = deque(maxlen=retained)
        self.trades: deque[TradeRow] = deque(maxlen=retained)
        self.digest = bytes(DIGEST_SIZE)  # chained over every row published
        # Derived: (total_lots, order_count) per price as last published, and the status.
        self.bid_levels: dict[int, tuple[int, int]] = {}
        self.ask_levels: dict[int, tuple[int, int]] = {}
        self.halted = False

    def mirror(self, book: SymbolBook) -> None:
        """Take the book as published: at an activation, a restore, or an entry boundary."""
        self.bid_levels = _side_values(book.bids)
        self.ask_levels = _side_values(book.asks)
        self.halted = book.halted

    def updates_from(self, from_sequence: int, limit: int | None) -> list[BookUpdate]:
        rows = _rows_from(
            self.updates, self.book_sequence, from_sequence, limit, where=(self.symbol, "updates")
        )
        return [update_record(self.symbol, row) for row in rows]

    def trades_from(self, from_sequence: int, limit: int | None) -> list[PublicTrade]:
        rows = _rows_from(
            self.trades, self.trade_sequence, from_sequence, limit, where=(self.symbol, "trades")
        )
        return [trade_record(self.symbol, row) for row in rows]


def _side_values(side: BookSide) -> dict[int, tuple[int, int]]:
    return {price: (level.total_lots, level.live_count) for price, level in side.levels.items()}


def _rows_from(
    rows: deque[_Row],
    last_sequence: int,
    from_sequence: int,
    limit: int | None,
    *,
    where: tuple[str, str],
) -> list[_Row]:
    """Retained rows with sequence >= from_sequence (0 read as 1), oldest first; `where`
    names the symbol and the stream for the error."""
    first = last_sequence + 1 - len(rows)
    start = max(from_sequence, 1)
    if start < first:
        raise MarketSequenceTooOldError(*where, from_sequence, first)
    skip = start - first
    wanted = len(rows) - skip
    if wanted <= 0:
        return []
    if limit is not None and limit < wanted:
        return list(islice(rows, skip, skip + limit))
    # Resumes are usually near the head: walk from the newest end, O(wanted).
    newest_first = list(islice(reversed(rows), wanted))
    newest_first.reverse()
    return newest_first


def _sort_key(level: tuple[str, int, int]) -> tuple[str, int, int]:
    """Canonical order: by symbol, bids before asks, each side best first."""
    symbol, side, price = level
    return (symbol, side, -price if side == BUY else price)


class MarketFeed:
    """Every symbol's feed of one matcher group, from the activation of version 2 on."""

    __slots__ = ("retained", "symbols")

    def __init__(self, books: Mapping[str, SymbolBook], retained: int) -> None:
        self.retained = retained
        self.symbols: dict[str, SymbolFeed] = {}
        for symbol, book in books.items():
            feed = SymbolFeed(symbol, retained)
            feed.mirror(book)
            self.symbols[symbol] = feed

    def symbol_feed(self, symbol: str) -> SymbolFeed:
        feed = self.symbols.get(symbol)
        if feed is None:
            raise UnknownSymbolError(symbol)
        return feed

    # --- publishing (at the end of every log entry) -----------------------------------

    def publish(
        self,
        books: Mapping[str, SymbolBook],
        events: Sequence[EventRecord],
        controlled: Iterable[str],
        now: int,
        out: list[MarketRecord] | None,
    ) -> None:
        """Publish what the entry's `events` (and its halts and resumes of the
        `controlled` symbols) changed; append the records to `out` when given."""
        touched: set[tuple[str, int, int]] = set()
        trades: list[tuple[str, int, int, int, int]] = []
        add = touched.add
        for event in events:
            spec = event[2]
            if isinstance(event, FillEvent):
                if not event[8]:  # the taker's fill: one per match
                    trades.append((spec[2], event[3], event[4], event[5], spec[3]))
            elif isinstance(event, RejectedEvent):
                continue  # nothing rested, nothing left a book
            if spec[4] == LIMIT:  # order_type: a market order never rests
                add((spec[2], spec[3], spec[6]))  # symbol, side, price_ticks
        # Per symbol: its touched levels in canonical order, its trades in trade order.
        work: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]] = {}
        feeds = self.symbols
        for symbol in controlled:
            if symbol in feeds and symbol not in work:
                work[symbol] = ([], [])
        for symbol, side, price in sorted(touched, key=_sort_key):
            entry = work.get(symbol)
            if entry is None:
                entry = work[symbol] = ([], [])
            entry[0].append((side, price))
        for symbol, trade_id, price, quantity, taker_side in trades:
            entry = work.get(symbol)
            if entry is None:
                entry = work[symbol] = ([], [])
            entry[1].append((trade_id, price, quantity, taker_side))
        for symbol in sorted(work):
            levels, symbol_trades = work[symbol]
            self._publish_symbol(feeds[symbol], books[symbol], levels, symbol_trades, now, out)

    def _publish_symbol(  # noqa: PLR0917 (positional: called once per symbol and entry)
        self,
        feed: SymbolFeed,
        book: SymbolBook,
        levels: list[tuple[int, int]],
        trades: list[tuple[int, int, int, int]],
        now: int,
        out: list[MarketRecord] | None,
    ) -> None:
        symbol = feed.symbol
        chained: list[int] = [len(trades)]
        sequence = feed.trade_sequence
        for trade_id, price, quantity, taker_side in trades:
            sequence += 1
            row: TradeRow = (sequence, trade_id, price, quantity, taker_side, now)
            feed.trades.append(row)
            chained.extend(row)
            if out is not None:
                out.append(new_record(PublicTrade, (symbol, *row)))
        feed.trade_sequence = sequence

        changes: list[int] = []
        for side, price in levels:
            if side == BUY:
                book_side, mirror = book.bids, feed.bid_levels
            else:
                book_side, mirror = book.asks, feed.ask_levels
            level = book_side.levels.get(price)
            before = mirror.get(price)
            if level is None:
                if before is None:
                    continue  # came and went within the entry, or never was
                del mirror[price]
                changes.extend((side, price, 0, 0))
                continue
            value = (level.total_lots, level.live_count)
            if value == before:
                continue
            mirror[price] = value
            total = value[0] if value[0] <= INT64_MAX else INT64_MAX
            changes.extend((side, price, total, value[1]))
        halted = book.halted
        if changes or halted != feed.halted:
            feed.halted = halted
            sequence = feed.book_sequence + 1
            feed.book_sequence = sequence
            update: UpdateRow = (sequence, now, HALTED if halted else TRADING, *changes)
            feed.updates.append(update)
            chained.append(len(update))
            chained.extend(update)
            if out is not None:
                out.append(update_record(symbol, update))
        elif not trades:
            return
        feed.digest = hashlib.blake2b(
            feed.digest + array("q", chained).tobytes(), digest_size=DIGEST_SIZE
        ).digest()

    # --- queries (not logged) ---------------------------------------------------------

    def book_snapshot(self, book: SymbolBook, depth: int) -> BookSnapshot:
        feed = self.symbol_feed(book.symbol)
        return BookSnapshot(
            feed.book_sequence,
            feed.trade_sequence,
            HALTED if book.halted else TRADING,
            _levels(book.bids, depth),
            _levels(book.asks, depth),
            book.last_trade_id,
            feed.updates[-1][1] if feed.updates else 0,
            book.last_price_ticks if book.last_trade_id else 0,
        )


def _levels(side: BookSide, depth: int) -> tuple[BookLevel, ...]:
    levels = side.levels_best_first()
    if depth > 0:
        levels = islice(levels, depth)
    return tuple(
        BookLevel(
            level.price_ticks,
            level.total_lots if level.total_lots <= INT64_MAX else INT64_MAX,
            level.live_count,
        )
        for level in levels
    )
