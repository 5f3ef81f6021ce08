"""`DepthView`: a mirrored book as the subscribers of one depth see it, and its diffs.

Every stream of one (symbol, depth) shares one view: after each batch from the
matcher, the view compares what it last published with the book now and makes ONE
`OrderBookDiff` (serialized once by the fan-out, whatever the number of
subscribers), or none when nothing within its depth changed. A depth-limited view
compares the best `depth` levels (a level that falls below the depth is sent
removed, one that rises into it is sent whole); the full view (depth 0) compares
only the prices the batch touched. A diff chains from the view's last one
(`previous_book_sequence`), so a client can tell a diff it can apply from a missed
one even where updates that changed nothing within its depth were skipped.
`merge_diffs` makes consecutive diffs one (a stream that fell behind sends them so):
applied, it leaves the book exactly as they would one after another.
Pure: no asyncio, no gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protos.oms.v1 import market_data_pb2
from services.market_data.book_mirror import BookSideMirror, Level, LevelRow, MirroredBook, Status

STREAM_DEPTHS = frozenset({0, 1, 5, 10, 20, 50, 100, 500, 1000})


class DepthView:
    __slots__ = ("ask_levels", "bid_levels", "book", "depth", "sequence", "status")

    def __init__(self, book: MirroredBook, depth: int) -> None:
        self.book = book
        self.depth = depth
        self.rebase()

    def rebase(self) -> None:
        """Take the book as it is now as published (a new view, or a resynchronised book)."""
        book = self.book
        self.bid_levels = _as_dict(book.bids.best(self.depth))
        self.ask_levels = _as_dict(book.asks.best(self.depth))
        self.sequence = book.book_sequence
        self.status: Status = book.status

    def order_book(self) -> market_data_pb2.OrderBook:
        """What the view last published, whole: a new subscriber's first message."""
        book = self.book
        message = market_data_pb2.OrderBook(
            symbol=book.symbol,
            book_sequence=self.sequence,
            trade_sequence=book.trade_sequence,
            status=self.status,
            consensus_time_ms=book.consensus_time_ms,
        )
        _fill(message.bids, _best_first(self.bid_levels, descending=True))
        _fill(message.asks, _best_first(self.ask_levels, descending=False))
        return message

    def advance(
        self, touched_bids: Iterable[int], touched_asks: Iterable[int], first_time_ms: int
    ) -> market_data_pb2.OrderBookDiff | None:
        """The diff from what was published to the book now; None if nothing changed.
        `first_time_ms`: the consensus time of the first of the updates that touched
        these prices (those before changed nothing the view shows)."""
        book = self.book
        if self.depth == 0:
            bids = _changed_prices(book.bids, self.bid_levels, touched_bids, descending=True)
            asks = _changed_prices(book.asks, self.ask_levels, touched_asks, descending=False)
        else:
            bids = _changed_top(book.bids, self.bid_levels, self.depth)
            asks = _changed_top(book.asks, self.ask_levels, self.depth)
        if not bids and not asks and book.status == self.status:
            return None
        diff = market_data_pb2.OrderBookDiff(
            symbol=book.symbol,
            previous_book_sequence=self.sequence,
            book_sequence=book.book_sequence,
            status=book.status,
            consensus_time_ms=book.consensus_time_ms,
            first_consensus_time_ms=first_time_ms,
        )
        _fill(diff.bids, bids)
        _fill(diff.asks, asks)
        self.sequence = book.book_sequence
        self.status = book.status
        return diff


def merge_diffs(diffs: Sequence[market_data_pb2.OrderBookDiff]) -> market_data_pb2.OrderBookDiff:
    """Consecutive diffs of one view as one: from the first's previous sequence to the
    last's sequence, each price at its last value, best first. ValueError when they do
    not chain (never expected: a stream's queue is dropped whole when it resynchronises)."""
    first, last = diffs[0], diffs[-1]
    bids: dict[int, market_data_pb2.PriceLevel] = {}
    asks: dict[int, market_data_pb2.PriceLevel] = {}
    sequence = first.previous_book_sequence
    for diff in diffs:
        if diff.previous_book_sequence != sequence:
            raise ValueError(
                f"a diff from {diff.previous_book_sequence} does not follow {sequence}"
            )
        sequence = diff.book_sequence
        for level in diff.bids:
            bids[level.price_ticks] = level
        for level in diff.asks:
            asks[level.price_ticks] = level
    return market_data_pb2.OrderBookDiff(
        symbol=last.symbol,
        previous_book_sequence=first.previous_book_sequence,
        book_sequence=last.book_sequence,
        status=last.status,
        bids=[bids[price] for price in sorted(bids, reverse=True)],
        asks=[asks[price] for price in sorted(asks)],
        consensus_time_ms=last.consensus_time_ms,
        first_consensus_time_ms=first.first_consensus_time_ms,
    )


def _as_dict(rows: Iterable[LevelRow]) -> dict[int, Level]:
    return {price: (lots, count) for price, lots, count in rows}


def _best_first(levels: dict[int, Level], *, descending: bool) -> list[LevelRow]:
    return [(price, *levels[price]) for price in sorted(levels, reverse=descending)]


def _changed_prices(
    side: BookSideMirror, published: dict[int, Level], touched: Iterable[int], *, descending: bool
) -> list[LevelRow]:
    changes: list[LevelRow] = []
    for price in sorted(set(touched), reverse=descending):
        now = side.levels.get(price)
        before = published.get(price)
        if now == before:
            continue
        if now is None:
            del published[price]
            changes.append((price, 0, 0))
        else:
            published[price] = now
            changes.append((price, *now))
    return changes


def _changed_top(side: BookSideMirror, published: dict[int, Level], depth: int) -> list[LevelRow]:
    top = side.best(depth)
    changes: list[LevelRow] = []
    now_prices = set()
    for price, lots, count in top:
        now_prices.add(price)
        if published.get(price) != (lots, count):
            changes.append((price, lots, count))
    gone = [price for price in published if price not in now_prices]
    if not changes and not gone:
        return []
    for price in gone:
        del published[price]
    for price, lots, count in changes:
        published[price] = (lots, count)
    changes.extend((price, 0, 0) for price in gone)
    changes.sort(key=lambda row: -row[0] if side.descending else row[0])
    return changes


def _fill(target: object, rows: Iterable[LevelRow]) -> None:
    add = target.add  # type: ignore[attr-defined]
    for price, total_lots, order_count in rows:
        add(price_ticks=price, total_lots=total_lots, order_count=order_count)
