"""`MirroredBook`: one symbol's L2 book, rebuilt from its matcher group's snapshot and updates.

Pure: the service feeds it the matcher's `BookSnapshot` and `BookUpdate` messages in
sequence. An update that does not follow the book's sequence is a gap
(`FeedGapError`): the follower then asks its matcher group for a fresh snapshot, never
applies past a gap. Prices are kept sorted per side (ascending), so the best `depth`
levels are a slice.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import TypeAlias

from protos.oms.v1 import market_data_pb2, matcher_pb2

Status: TypeAlias = market_data_pb2.MarketStatus.ValueType
TRADING = market_data_pb2.MARKET_STATUS_TRADING
HALTED = market_data_pb2.MARKET_STATUS_HALTED
UNKNOWN = market_data_pb2.MARKET_STATUS_UNKNOWN
# The matcher's BookStatus values map onto MarketStatus by number (both TRADING 1,
# HALTED 2); `tests/market_data` pins it.
Level = tuple[int, int]  # (total_lots, order_count)
LevelRow = tuple[int, int, int]  # (price_ticks, total_lots, order_count)


class FeedGapError(RuntimeError):
    """An update that does not follow the mirrored book's sequence."""


class BookSideMirror:
    __slots__ = ("descending", "levels", "prices")

    def __init__(self, descending: bool) -> None:
        self.descending = descending  # bids: the best is the highest price
        self.levels: dict[int, Level] = {}
        self.prices: list[int] = []  # ascending

    def reset(self, rows: Iterable[matcher_pb2.BookLevel]) -> None:
        self.levels = {row.price_ticks: (row.total_lots, row.order_count) for row in rows}
        self.prices = sorted(self.levels)

    def set(self, price: int, total_lots: int, order_count: int) -> None:
        if total_lots == 0:
            if self.levels.pop(price, None) is not None:
                index = bisect_left(self.prices, price)
                del self.prices[index]
            return
        if price not in self.levels:
            insort(self.prices, price)
        self.levels[price] = (total_lots, order_count)

    def best(self, depth: int) -> list[LevelRow]:
        """The best `depth` levels (0: all), best first."""
        prices = self.prices
        if self.descending:
            chosen = prices[::-1] if depth <= 0 else prices[: -depth - 1 : -1]
        else:
            chosen = prices if depth <= 0 else prices[:depth]
        levels = self.levels
        return [(price, *levels[price]) for price in chosen]

    def top(self) -> LevelRow | None:
        if not self.prices:
            return None
        price = self.prices[-1] if self.descending else self.prices[0]
        return (price, *self.levels[price])


class MirroredBook:
    __slots__ = (
        "asks",
        "bids",
        "book_sequence",
        "consensus_time_ms",
        "last_price_ticks",
        "last_trade_id",
        "status",
        "symbol",
        "trade_sequence",
    )

    def __init__(self, symbol: str) -> None:
        self.symbol = symbol
        self.status: Status = UNKNOWN  # until the first snapshot
        self.book_sequence = 0
        self.trade_sequence = 0
        self.last_trade_id = 0
        self.last_price_ticks = 0
        self.consensus_time_ms = 0
        self.bids = BookSideMirror(descending=True)
        self.asks = BookSideMirror(descending=False)

    @property
    def known(self) -> bool:
        return self.status != UNKNOWN

    def reset(self, snapshot: matcher_pb2.BookSnapshot) -> None:
        self.status = Status(snapshot.status)
        self.book_sequence = snapshot.book_sequence
        self.trade_sequence = snapshot.trade_sequence
        self.last_trade_id = snapshot.last_trade_id
        self.last_price_ticks = snapshot.last_price_ticks
        self.consensus_time_ms = snapshot.consensus_time_ms
        self.bids.reset(snapshot.bids)
        self.asks.reset(snapshot.asks)

    def apply(self, update: matcher_pb2.BookUpdate) -> None:
        if update.book_sequence != self.book_sequence + 1 or not self.known:
            raise FeedGapError(
                f"{self.symbol}: update {update.book_sequence} after {self.book_sequence}"
            )
        for row in update.bids:
            self.bids.set(row.price_ticks, row.total_lots, row.order_count)
        for row in update.asks:
            self.asks.set(row.price_ticks, row.total_lots, row.order_count)
        self.status = Status(update.status)
        self.book_sequence = update.book_sequence
        self.consensus_time_ms = update.consensus_time_ms

    def crossed(self) -> bool:
        bid, ask = self.bids.top(), self.asks.top()
        return bid is not None and ask is not None and bid[0] >= ask[0]

    def order_book(self, depth: int) -> market_data_pb2.OrderBook:
        book = market_data_pb2.OrderBook(
            symbol=self.symbol,
            book_sequence=self.book_sequence,
            trade_sequence=self.trade_sequence,
            status=self.status,
            consensus_time_ms=self.consensus_time_ms,
        )
        fill_levels(book.bids, self.bids.best(depth))
        fill_levels(book.asks, self.asks.best(depth))
        return book


def fill_levels(target: object, rows: Iterable[LevelRow]) -> None:
    add = target.add  # type: ignore[attr-defined]
    for price, total_lots, order_count in rows:
        add(price_ticks=price, total_lots=total_lots, order_count=order_count)
