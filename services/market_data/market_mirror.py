"""`MarketMirror`: every symbol's book, trades and day, mirrored from the matchers' feeds,
and the fan-out to the streams that follow them.

Applied in the order the matcher group sent it (`apply_batch`): snapshots replace a
symbol's book (and resynchronise its book streams with a fresh book each), trades
append (in `trade_sequence`, none twice: one already held is skipped) and update the
day, book updates apply in `book_sequence` (a gap raises `FeedGapError`: the follower
reconnects from the sequences held and gets a snapshot, never applies past a gap).
After a batch, each (symbol, depth) view with subscribers makes at most one diff and
each symbol's trades make one `MarketTrades`: each serialized once and offered to
every subscriber as the same bytes. A stream that finds several waiting sends them as
one message (`coalesce_diffs`; trades concatenate); streams of one view that caught up
together share the merged diff (serialized once for them, `MERGED_HELD` kept).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from protos.oms.v1 import market_data_pb2, matcher_pb2
from services.market_data.book_mirror import UNKNOWN, FeedGapError, MirroredBook
from services.market_data.depth_view import DepthView, merge_diffs
from services.market_data.subscribers import Subscriber
from services.market_data.ticker import RollingDay

MERGED_HELD = 64  # merged diffs kept per service for streams that caught up together


class PublishedDiff:
    """A view's diff as the fan-out offers it: serialized once (an `OrderBookEvent`),
    the message kept for merging with the next ones."""

    __slots__ = ("data", "diff")

    def __init__(self, diff: market_data_pb2.OrderBookDiff, data: bytes) -> None:
        self.diff = diff
        self.data = data


BookStream = Subscriber[PublishedDiff]
TradeStream = Subscriber[bytes]


@dataclass(slots=True)
class FeedStatistics:
    batches: int = 0  # MarketDataBatch messages applied from the matchers
    book_updates: int = 0  # matcher book updates applied to the mirrored books
    trades: int = 0  # trades taken (a trade sent again after a reconnect is not counted)
    snapshots: int = 0  # books replaced by a matcher snapshot (first reads and resyncs)
    gaps: int = 0  # updates that did not follow (the feed resynchronised)
    crossed_books: int = 0  # a book found crossed after a batch (never expected)
    trades_lost: int = 0  # trades the matcher no longer held when the service asked
    messages_serialized: int = 0  # diffs and trade messages serialized (once each)
    messages_offered: int = 0  # those messages offered to streams (one per stream)
    messages_coalesced: int = 0  # offered messages a stream sent within a larger one
    diffs_merged: int = 0  # diffs merged for streams that were behind (serialized once)
    resyncs: int = 0  # book streams sent a fresh book after falling behind or a resnapshot
    streams_ended_behind: int = 0  # trade streams ended RESOURCE_EXHAUSTED


class SymbolMarket:
    __slots__ = (
        "book",
        "day",
        "followed",
        "trade_id_at_start",
        "trade_streams",
        "trades",
        "trades_at_start",
        "view_streams",
        "views",
    )

    def __init__(self, symbol: str, retained_trades: int) -> None:
        self.book = MirroredBook(symbol)
        # The last trade before the first book read: the day's earlier trades are those
        # up to it, read from the fills (`MarketDataService.seed_days`).
        self.trade_id_at_start = 0
        # And how many trades the feed had published up to it (its trade_sequence): the
        # fills up to it are all written once PostgreSQL holds as many (from version 2's
        # activation on, the feed counts every trade; an upgraded group had some before).
        self.trades_at_start = 0
        # A snapshot was applied once: the book is marked UNKNOWN again after a gap, yet
        # the trades held go on from where they were.
        self.followed = False
        self.trades: deque[market_data_pb2.MarketTrade] = deque(maxlen=retained_trades)
        self.day = RollingDay()
        self.views: dict[int, DepthView] = {}
        self.view_streams: dict[int, set[BookStream]] = {}
        self.trade_streams: set[TradeStream] = set()

    def trades_after(self, sequence: int) -> list[market_data_pb2.MarketTrade] | None:
        """Held trades after `sequence`; None when some of them are no longer held."""
        trades = self.trades
        if not trades:
            return [] if sequence >= self.book.trade_sequence else None
        first = trades[0].trade_sequence
        if sequence + 1 < first:
            return None
        return [trade for trade in trades if trade.trade_sequence > sequence]


class MarketMirror:
    def __init__(self, symbols: Iterable[str], retained_trades: int) -> None:
        self.symbols = {symbol: SymbolMarket(symbol, retained_trades) for symbol in symbols}
        self.statistics = FeedStatistics()
        self.as_of_ms: dict[str, int] = {}  # per symbol: the newest consensus time seen
        # (symbol, depth, from sequence, to sequence) -> the merged diff's bytes.
        self._merged: dict[tuple[str, int, int, int], bytes] = {}

    # --- the feed ---------------------------------------------------------------------

    def apply_batch(self, batch: matcher_pb2.MarketDataBatch) -> None:
        stats = self.statistics
        stats.batches += 1
        touched: dict[str, tuple[set[int], set[int]]] = {}
        first_times: dict[str, int] = {}  # per symbol: its first update's consensus time
        new_trades: dict[str, list[market_data_pb2.MarketTrade]] = {}
        for snapshot in batch.snapshots:
            market = self.symbols[snapshot.symbol]
            known, trades_seen = market.book.known, market.book.trade_sequence
            followed, market.followed = market.followed, True
            market.book.reset(snapshot)
            if not followed:
                market.trade_id_at_start = snapshot.last_trade_id
                market.trades_at_start = snapshot.trade_sequence
            if known:  # trades go on from where they were: they come in this batch
                market.book.trade_sequence = trades_seen
            elif followed and trades_seen < snapshot.trade_sequence:
                # Forgotten after a gap, the book was asked for with no position: the
                # group's trades go on after the snapshot's, those between never come.
                self._lose_trades(market, trades_seen, snapshot.trade_sequence + 1)
            stats.snapshots += 1
            self._seen(snapshot.symbol, snapshot.consensus_time_ms)
            self._resynchronise(market)
        for trade in batch.trades:
            market = self.symbols[trade.symbol]
            held = market.book.trade_sequence if market.book.known else None
            if held is not None and trade.trade_sequence <= held:
                continue  # already held (sent again after a reconnect)
            public = market_data_pb2.MarketTrade(
                symbol=trade.symbol,
                trade_sequence=trade.trade_sequence,
                trade_id=trade.trade_id,
                price_ticks=trade.price_ticks,
                quantity_lots=trade.quantity_lots,
                taker_side=trade.taker_side,
                consensus_time_ms=trade.consensus_time_ms,
            )
            if held is not None and trade.trade_sequence != held + 1:
                self._lose_trades(market, held, trade.trade_sequence)
            market.trades.append(public)
            market.book.trade_sequence = trade.trade_sequence
            market.book.last_trade_id = trade.trade_id
            market.book.last_price_ticks = trade.price_ticks
            market.day.add_trade(trade.consensus_time_ms, trade.price_ticks, trade.quantity_lots)
            self._seen(trade.symbol, trade.consensus_time_ms)
            new_trades.setdefault(trade.symbol, []).append(public)
            stats.trades += 1
        try:
            for update in batch.book_updates:
                market = self.symbols[update.symbol]
                try:
                    market.book.apply(update)
                except FeedGapError:
                    # Never expected (the matcher sends updates in sequence), but never
                    # shown past: the book is forgotten, so the follower's next request
                    # asks for a snapshot of it, which resynchronises its streams.
                    stats.gaps += 1
                    market.book.status = UNKNOWN
                    raise
                stats.book_updates += 1
                self._seen(update.symbol, update.consensus_time_ms)
                first_times.setdefault(update.symbol, update.consensus_time_ms)
                bids, asks = touched.setdefault(update.symbol, (set(), set()))
                bids.update(level.price_ticks for level in update.bids)
                asks.update(level.price_ticks for level in update.asks)
        finally:
            for symbol, (bids, asks) in touched.items():
                market = self.symbols[symbol]
                if market.book.crossed():
                    stats.crossed_books += 1
                if market.book.known:
                    self._publish_diffs(market, bids, asks, first_times[symbol])
            for symbol, trades in new_trades.items():
                self._publish_trades(self.symbols[symbol], trades)

    def _seen(self, symbol: str, time_ms: int) -> None:
        if time_ms > self.as_of_ms.get(symbol, 0):
            self.as_of_ms[symbol] = time_ms

    def _publish_diffs(
        self, market: SymbolMarket, bids: set[int], asks: set[int], first_time_ms: int
    ) -> None:
        stats = self.statistics
        for depth, view in market.views.items():
            diff = view.advance(bids, asks, first_time_ms)
            if diff is None:
                continue
            published = PublishedDiff(
                diff, market_data_pb2.OrderBookEvent(diff=diff).SerializeToString()
            )
            stats.messages_serialized += 1
            for subscriber in market.view_streams[depth]:
                stats.messages_offered += 1
                # Counted when the stream overflows, not again for every message it
                # skips until its writer sends the fresh book.
                behind = subscriber.resync
                if not subscriber.offer(published) and subscriber.resync and not behind:
                    stats.resyncs += 1

    def _publish_trades(
        self, market: SymbolMarket, trades: list[market_data_pb2.MarketTrade]
    ) -> None:
        if not market.trade_streams:
            return
        stats = self.statistics
        data = market_data_pb2.MarketTrades(
            symbol=market.book.symbol, trades=trades
        ).SerializeToString()
        stats.messages_serialized += 1
        for subscriber in market.trade_streams:
            stats.messages_offered += 1
            # Counted when this offer overflows it: not a stream ended already (behind,
            # or by lost trades) that its writer has not closed yet.
            ended = subscriber.ended
            if not subscriber.offer(data) and subscriber.ended and not ended:
                stats.streams_ended_behind += 1

    # --- what a stream sends ------------------------------------------------------------

    def coalesce_diffs(self, symbol: str, depth: int, diffs: Sequence[PublishedDiff]) -> bytes:
        """One message for the diffs a book stream found waiting (consecutive: its queue)."""
        if len(diffs) == 1:
            return diffs[0].data
        stats = self.statistics
        stats.messages_coalesced += len(diffs) - 1
        key = (symbol, depth, diffs[0].diff.previous_book_sequence, diffs[-1].diff.book_sequence)
        merged = self._merged.get(key)
        if merged is None:
            diff = merge_diffs([published.diff for published in diffs])
            merged = market_data_pb2.OrderBookEvent(diff=diff).SerializeToString()
            stats.diffs_merged += 1
            if len(self._merged) >= MERGED_HELD:
                del self._merged[next(iter(self._merged))]  # the oldest
            self._merged[key] = merged
        return merged

    def coalesce_trades(self, messages: Sequence[bytes]) -> bytes:
        """One `MarketTrades` for those a trade stream found waiting: protobuf appends a
        repeated field's elements when messages are concatenated, and the symbol is the
        same in every one, so the bytes joined are the trades in order."""
        self.statistics.messages_coalesced += len(messages) - 1
        return messages[0] if len(messages) == 1 else b"".join(messages)

    def _resynchronise(self, market: SymbolMarket) -> None:
        """The book was replaced: every view starts again from it, every stream gets it."""
        self._merged.clear()  # the views' diffs start again from the new book
        for depth, view in market.views.items():
            view.rebase()
            for subscriber in market.view_streams[depth]:
                subscriber.queue.clear()
                if not subscriber.resync:
                    subscriber.resync = True
                    self.statistics.resyncs += 1
                subscriber.wake.set()

    def _lose_trades(self, market: SymbolMarket, held: int, next_sequence: int) -> None:
        """Trades held+1 .. next-1 are gone for good: no stream may go on past them."""
        self.statistics.trades_lost += next_sequence - held - 1
        market.trades.clear()
        market.day.seeded = False  # the day misses them too
        why = (
            f"trades {held + 1}..{next_sequence - 1} of {market.book.symbol} were no longer"
            " held by its matcher group when the service asked; read them from the fills"
        )
        for subscriber in market.trade_streams:
            subscriber.end(why)

    # --- subscriptions ----------------------------------------------------------------

    def join_book(self, symbol: str, depth: int, subscriber: BookStream) -> bytes:
        """Register a book stream; its first message (the view's book), serialized."""
        market = self.symbols[symbol]
        view = market.views.get(depth)
        if view is None:
            view = market.views[depth] = DepthView(market.book, depth)
            market.view_streams[depth] = set()
        market.view_streams[depth].add(subscriber)
        return market_data_pb2.OrderBookEvent(book=view.order_book()).SerializeToString()

    def leave_book(self, symbol: str, depth: int, subscriber: BookStream) -> None:
        market = self.symbols[symbol]
        streams = market.view_streams.get(depth)
        if streams is None:
            return
        streams.discard(subscriber)
        if not streams:
            del market.view_streams[depth]
            del market.views[depth]

    def view_book(self, symbol: str, depth: int) -> bytes:
        """A fresh book of a stream's view, for a stream that resynchronises."""
        view = self.symbols[symbol].views[depth]
        return market_data_pb2.OrderBookEvent(book=view.order_book()).SerializeToString()

    def join_trades(
        self, symbol: str, after_sequence: int, subscriber: TradeStream, recent: int = 0
    ) -> list[market_data_pb2.MarketTrade] | None:
        """Register a trade stream; the held trades to send first: those after
        `after_sequence`, or with 0 the newest `recent` held; None when some of those
        after `after_sequence` are no longer held (nothing registered)."""
        market = self.symbols[symbol]
        backlog: list[market_data_pb2.MarketTrade] = []
        if after_sequence:
            found = market.trades_after(after_sequence)
            if found is None:
                return None
            backlog = found
        elif recent:
            held = market.trades
            backlog = list(islice(held, max(0, len(held) - recent), None))
        market.trade_streams.add(subscriber)
        return backlog

    def leave_trades(self, symbol: str, subscriber: TradeStream) -> None:
        self.symbols[symbol].trade_streams.discard(subscriber)

    def subscribers(self) -> int:
        return sum(
            len(market.trade_streams) + sum(len(s) for s in market.view_streams.values())
            for market in self.symbols.values()
        )
