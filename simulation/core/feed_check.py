"""The matchers' market-data feed (state-machine version 2), checked on every replica.

A consumer of the feed (`oms marketdata`, a client's `LocalBook`) keeps a book from the
`BookUpdate`s alone and trusts the sequences to tell it when it missed one. So, on
every matcher replica that applies the log, after every record, from the egress the
machine produced (`MatcherEgress.market`, `services/matcher/core/market_feed.py`):

- per symbol, `book_sequence` and `trade_sequence` go up by exactly one: no gap, no
  repeat, and at most one book update per symbol in one log entry;
- a book kept from the updates alone (levels set, `total_lots == 0` removed, the
  status taken) equals the engine's own book (`book_snapshot`: every level and the
  status) for every symbol the record touched, with the engine's sequences equal to
  the last ones published, and is never crossed (best bid below best ask);
- an update changes something: no level published as it already was, no level
  removed that was not there, no update with neither a level nor a change of status;
- the public trades of each entry are its taker fills, one for one (a match gives a
  maker and a taker fill): the same trade ids, prices, quantities, taker sides and
  consensus time, per symbol in trade order.

What a replica last saw is its own memory: it starts again from the machine's feed
state at every restore (a snapshot, a peer's state, or nothing), and a replica whose
machine is still at version 1 starts at the entry that activates version 2, from the
book as it was there. Pure: it reads the machine's egress and queries, consumes no
randomness and schedules nothing, so it changes no seed's trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from services.matcher.core.event_log import FillEvent
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.matcher.core.market_feed import (
    HALTED,
    TRADING,
    BookLevel,
    BookSnapshot,
    BookUpdate,
    PublicTrade,
)
from services.matcher.core.orders import BUY, SELL
from services.runtime.core.log_batch import LogBatch, decode_version
from services.runtime.core.state_machine import EntryKind

_VERSION: Final = int(EntryKind.VERSION)
_DECIDING: Final = frozenset({int(EntryKind.COMMAND), int(EntryKind.TIMER)})
FEED_VERSION: Final = 2  # the matcher's first state-machine version with the feed

# (total_lots, order_count) per price: one side of a book as the feed told it.
Levels = dict[int, tuple[int, int]]


class SymbolView:
    """One symbol's feed as a consumer saw it: its last sequences and the book kept."""

    __slots__ = ("asks", "bids", "book_sequence", "status", "trade_sequence")

    def __init__(
        self, book_sequence: int, trade_sequence: int, status: int, bids: Levels, asks: Levels
    ) -> None:
        self.book_sequence = book_sequence
        self.trade_sequence = trade_sequence
        self.status = status
        self.bids = bids
        self.asks = asks


class MarketFeedCheck:
    """One matcher replica's feed, checked after every record it applies."""

    __slots__ = ("at_activation", "book_updates", "books_compared", "trades", "views")

    def __init__(self) -> None:
        # None while the machine is at version 1 (no feed yet).
        self.views: dict[str, SymbolView] | None = None
        # The book before a record that activates the feed (taken only then).
        self.at_activation: dict[str, SymbolView] | None = None
        self.book_updates = 0
        self.trades = 0
        self.books_compared = 0

    def start(self, machine: MatcherMachine) -> None:
        """At a restore or a restart: from the machine's feed state, if it has a feed."""
        self.at_activation = None
        engine = machine.engine
        if engine.feed is None:
            self.views = None
            return
        views = {}
        for symbol in sorted(engine.books):
            snapshot = engine.book_snapshot(symbol)
            views[symbol] = SymbolView(
                snapshot.book_sequence,
                snapshot.trade_sequence,
                snapshot.status,
                _levels(snapshot.bids),
                _levels(snapshot.asks),
            )
        self.views = views

    def before_record(self, machine: MatcherMachine, batch: LogBatch) -> None:
        """A record that may activate the feed: the book as it is before it (version 1
        publishes nothing, so only the engine's book says where the feed starts)."""
        if self.views is not None or not any(kind == _VERSION for kind, _ in batch.entries):
            return
        engine = machine.engine
        at = {}
        for symbol, book in sorted(engine.books.items()):
            sides = []
            for side in (BUY, SELL):
                sides.append(
                    {
                        price: (sum(order.remaining_lots for order in orders), len(orders))
                        for price, orders in engine.levels(symbol, side)
                    }
                )
            at[symbol] = SymbolView(0, 0, HALTED if book.halted else TRADING, *sides)
        self.at_activation = at

    def after_record(
        self, machine: MatcherMachine, batch: LogBatch, outputs: Sequence[Sequence[Any]]
    ) -> str | None:
        """What the record's feed broke, if anything (the first thing found)."""
        entries = batch.entries
        first = 0
        if self.views is None:
            if machine.engine.feed is None:
                return None  # still version 1: no feed
            activation = next(
                (
                    index
                    for index, (kind, payload) in enumerate(entries)
                    if kind == _VERSION and decode_version(payload) >= FEED_VERSION
                ),
                None,
            )
            before = self.at_activation
            self.at_activation = None
            if (
                activation is None
                or before is None
                or any(kind in _DECIDING for kind, _ in entries[:activation])
            ):
                # Entries decided before the switch in this record: the book at the
                # switch is not known here; start after the record instead.
                self.start(machine)
                return None
            self.views = before
            first = activation + 1
        views = self.views
        touched: set[str] = set()
        position = batch.first_position + first
        for items in outputs[first:]:
            for egress in items:
                problem = self._entry(views, egress, batch.consensus_time_ms, touched)
                if problem is not None:
                    return f"position {position}: {problem}"
            position += 1
        engine = machine.engine
        for symbol in sorted(touched):
            view = views.get(symbol)
            if view is None:
                continue  # a refused order naming no symbol of this group
            problem = _compare(symbol, view, engine.book_snapshot(symbol))
            if problem is not None:
                return f"record {batch.first_position}..{batch.last_position}: {problem}"
            self.books_compared += 1
        return None

    def _entry(
        self,
        views: dict[str, SymbolView],
        egress: MatcherEgress,
        consensus_time_ms: int,
        touched: set[str],
    ) -> str | None:
        taker_fills = []
        for event in egress.events:
            symbol = event[2][2]  # spec.symbol
            touched.add(symbol)
            if type(event) is FillEvent and not event[8]:  # the taker's fill
                spec = event[2]
                taker_fills.append((symbol, event[3], event[4], event[5], spec[3], event[1]))
        trades = []
        updated: set[str] = set()
        for record in egress.market:
            symbol = record[0]
            view = views.get(symbol)
            if view is None:
                return f"{type(record).__name__} of {symbol}, not a symbol of this group"
            touched.add(symbol)
            if type(record) is PublicTrade:
                if record.trade_sequence != view.trade_sequence + 1:
                    return (
                        f"{symbol} trade_sequence {record.trade_sequence} after"
                        f" {view.trade_sequence}"
                    )
                view.trade_sequence = record.trade_sequence
                trades.append((symbol, *record[2:]))
                self.trades += 1
                continue
            assert type(record) is BookUpdate
            if symbol in updated:
                return f"{symbol}: two book updates in one entry"
            updated.add(symbol)
            problem = _apply_update(view, record, consensus_time_ms)
            if problem is not None:
                return f"{symbol} book_sequence {record.book_sequence}: {problem}"
            self.book_updates += 1
        if trades or taker_fills:
            taker_fills.sort(key=_symbol_of)  # stable: per symbol in trade order
            if trades != taker_fills:
                return f"public trades {trades[:3]} are not the taker fills {taker_fills[:3]}"
        return None


def _symbol_of(trade: tuple[Any, ...]) -> str:
    symbol: str = trade[0]
    return symbol


def _levels(levels: Sequence[BookLevel]) -> Levels:
    return {level[0]: (level[1], level[2]) for level in levels}


def _apply_update(view: SymbolView, update: BookUpdate, consensus_time_ms: int) -> str | None:
    if update.book_sequence != view.book_sequence + 1:
        return f"after {view.book_sequence}"
    if update.consensus_time_ms != consensus_time_ms:
        return f"at {update.consensus_time_ms} ms in a record at {consensus_time_ms} ms"
    if update.status not in {TRADING, HALTED}:
        return f"status {update.status}"
    if not update.levels and update.status == view.status:
        return "changes nothing"
    for side, price, total_lots, order_count in update.levels:
        levels = view.bids if side == BUY else view.asks
        before = levels.get(price)
        if total_lots == 0:
            if before is None:
                return f"removes level {side}/{price}, which it never had"
            del levels[price]
        elif order_count <= 0:
            return f"level {side}/{price}: {total_lots} lots in {order_count} orders"
        elif before == (total_lots, order_count):
            return f"level {side}/{price} published as it already was"
        else:
            levels[price] = (total_lots, order_count)
    view.book_sequence = update.book_sequence
    view.status = update.status
    return None


def _compare(symbol: str, view: SymbolView, snapshot: BookSnapshot) -> str | None:
    """The book kept from the feed, then against the engine's (`MarketFeed.book_snapshot`)."""
    if view.bids and view.asks:
        best_bid, best_ask = max(view.bids), min(view.asks)
        if best_bid >= best_ask:
            return f"{symbol} crossed from the feed: best bid {best_bid}, best ask {best_ask}"
    bids, asks = snapshot.bids, snapshot.asks
    if (snapshot.book_sequence, snapshot.trade_sequence) != (
        view.book_sequence,
        view.trade_sequence,
    ):
        return (
            f"{symbol}: the engine is at book/trade sequences {snapshot.book_sequence}/"
            f"{snapshot.trade_sequence}, its feed said {view.book_sequence}/{view.trade_sequence}"
        )
    if snapshot.status != view.status:
        return f"{symbol}: status {view.status} from the feed, {snapshot.status} in the engine"
    for side, kept, engine in (("bids", view.bids, bids), ("asks", view.asks, asks)):
        if len(kept) != len(engine) or any(
            kept.get(level[0]) != (level[1], level[2]) for level in engine
        ):
            return (
                f"{symbol} {side} from the feed {_best_first(kept, side)[:4]},"
                f" in the engine {[tuple(level) for level in engine[:4]]}"
            )
    return None


def _best_first(levels: Levels, side: str) -> list[tuple[int, int, int]]:
    prices = sorted(levels, reverse=side == "bids")
    return [(price, *levels[price]) for price in prices]
