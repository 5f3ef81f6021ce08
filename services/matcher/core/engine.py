"""The matching engine: decides every command and timer tick of one matcher group.

Pure and deterministic: it reads time only from the `now_ms` it is given (the
consensus time of the log entry) and walks only dicts, lists and deques.

Per submitted order, in this order:
1. a malformed id (`order_ids`) is answered INVALID_ORDER_ID and recorded
   nowhere: no dedup entry, no event (there is no owning shard to sequence it);
2. a known id is answered `duplicate` with the existing order, nothing else;
3. admission checks (`validation`), then POST_ONLY_WOULD_CROSS, FOK_NOT_FILLABLE,
   NO_LIQUIDITY: a reject records the order as REJECTED in the dedup index and
   emits Rejected; nothing else changes;
4. Accepted, then matching in price-time priority at the resting orders' prices:
   per trade one Fill for the resting order (maker) then one for the incoming
   order (taker), sharing a `trade_id`; then the remainder rests (GTC, GTD,
   POST_ONLY) or is cancelled (IOC, FOK, market: IOC_REMAINDER; market beyond
   the band: PRICE_BAND; self-trade: SELF_TRADE).

Market orders: the price band is fixed at the order's arrival (its reference is
the last trade before it); a buy takes asks up to ref + ref*band/10000, a sell
bids down to ref - ref*band/10000. A market buy takes, at each resting order
in turn, the most lots whose notional plus taker fee fits in what is left of
`quote_amount` (one fill per resting order); it stops at the first resting
order it cannot take whole. It is FILLED when it spent its quote amount
exactly, else its remainder is cancelled. A market order is rejected
NO_LIQUIDITY when its first step fills nothing for want of liquidity: no
contra order, the best one beyond the band, or (buy) one lot at the best price
costs more than the quote amount. Self-trade prevention does not count as
liquidity missing: such an order is accepted and then cancelled SELF_TRADE.

Self-trade prevention, when the next resting order belongs to the incoming
order's user: CANCEL_NEWEST (and UNSPECIFIED) cancels the incoming remainder;
CANCEL_OLDEST cancels that resting order and goes on; CANCEL_BOTH cancels the
resting order, then the incoming remainder. A FOK counts only what it could
take before such a stop (CANCEL_OLDEST: skipping the user's own orders).

Halt with `cancel_resting` cancels the symbol's resting orders in book order
(bids best first, then asks, FIFO within a level); a kill switch cancels the
user's resting orders in arrival order.

From state-machine version 2 on, each entry (an `execute` batch, an `on_timer`
sweep) ends by publishing its market data (`market_feed`): per symbol its trades
and one book update, sequenced per symbol, retained, in the snapshot and the state
hash. Version 1 publishes none, and its snapshot and state hash are as before.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from services.matcher.core.commands import (
    CancelCommand,
    Command,
    CommandResult,
    HaltCommand,
    KillSwitchCommand,
    ResumeCommand,
    SubmitCommand,
)
from services.matcher.core.controls import cancel, halt, kill_switch, resume
from services.matcher.core.engine_state import EngineState
from services.matcher.core.errors import MarketFeedInactiveError, UnknownSymbolError
from services.matcher.core.event_log import EventRecord
from services.matcher.core.market_feed import (
    BookSnapshot,
    BookUpdate,
    MarketFeed,
    MarketRecord,
    PublicTrade,
)
from services.matcher.core.orders import BUY, EXPIRED, OrderView
from services.matcher.core.state_digest import MASK
from services.matcher.core.submission import submit
from services.matcher.core.symbols import LastTrade
from services.matcher.core.validation import INVALID_ORDER

_HASH_HEADER = struct.Struct("<QQQQQQ")
_HASH_SETTINGS = struct.Struct("<QQQQQ")
_HASH_SYMBOL = struct.Struct("<qqqqqqqBqQQ")
_HASH_STREAM = struct.Struct("<QQ")
_HASH_USER = struct.Struct("<Q")
_HASH_VERSION = struct.Struct("<I")
_HASH_FEED = struct.Struct("<QQQQQ")
_HASH_RETAINED = struct.Struct("<Q")


class MatcherEngine(EngineState):
    """The matcher group's state machine core: its state, its commands, timers and queries."""

    def execute(
        self,
        commands: Sequence[Command],
        now_ms: int,
        market: list[MarketRecord] | None = None,
    ) -> tuple[list[CommandResult], list[EventRecord]]:
        """Apply commands in order at consensus time `now_ms`: one result each, and events.

        From version 2 on, the entry's market data is published at the end (and
        appended to `market` when given: per symbol, its trades then its book update).
        """
        results: list[CommandResult] = []
        events: list[EventRecord] = []
        controlled: list[str] = []  # symbols halted or resumed: their status may change
        append = results.append
        for command in commands:
            if isinstance(command, SubmitCommand):
                append(submit(self, command, now_ms, events))
            elif isinstance(command, CancelCommand):
                append(cancel(self, command, now_ms, events))
            elif isinstance(command, HaltCommand):
                append(halt(self, command, now_ms, events))
                controlled.append(command.symbol)
            elif isinstance(command, ResumeCommand):
                append(resume(self, command))
                controlled.append(command.symbol)
            elif isinstance(command, KillSwitchCommand):
                append(kill_switch(self, command, now_ms, events))
            else:
                append(CommandResult(command.correlation_id, False, None, INVALID_ORDER, False))
        feed = self.feed
        if feed is not None:
            feed.publish(self.books, events, controlled, now_ms, market)
        return results, events

    # --- timers -----------------------------------------------------------------------

    def on_timer(self, now_ms: int, market: list[MarketRecord] | None = None) -> list[EventRecord]:
        """Expire due GTD orders, then forget ids past the dedup horizon; both bounded.

        From version 2 on, the expiries' book updates are published (see `execute`).
        """
        events: list[EventRecord] = []
        settings = self.settings
        for order in self.expiries.pop_due(now_ms, settings.max_expiries_per_timer):
            self.cancel_resting(order, EXPIRED, 0, now_ms, events)
        forgotten = self.dedup.sweep(
            now_ms, settings.dedup_horizon_ms, settings.max_dedup_sweeps_per_timer
        )
        digest_sum = self.digest_sum
        for order in forgotten:
            digest_sum -= order.digest
        self.digest_sum = digest_sum & MASK
        feed = self.feed
        if feed is not None and events:
            feed.publish(self.books, events, (), now_ms, market)
        return events

    # --- versions ---------------------------------------------------------------------

    def activate_version(self, version: int) -> None:
        """Decide under `version` from the next entry on; version 2 starts the market feed
        here, its sequences at 1 with the next change."""
        if version >= 2 and self.feed is None:
            self.feed = MarketFeed(self.books, self.settings.retained_market_data_per_symbol)
        self.machine_version = version

    # --- queries (not logged) ---------------------------------------------------------

    def order_view(self, order_id: str) -> OrderView | None:
        order = self.dedup.orders.get(order_id)
        return None if order is None else order.view()

    def open_orders(self, oms_shard: str, user_id: int) -> tuple[int, list[OrderView]]:
        """(as-of sequence of the shard's stream, the user's resting orders from that shard)."""
        stream = self.streams.get(oms_shard)
        as_of = 0 if stream is None else stream.last_sequence
        resting = self.user_orders.get(user_id, {})
        return as_of, [
            order.view() for order in resting.values() if order.stream.oms_shard == oms_shard
        ]

    def events_from(
        self, oms_shard: str, from_sequence: int, limit: int | None = None
    ) -> list[EventRecord]:
        stream = self.streams.get(oms_shard)
        if stream is None:
            # Nothing was ever sequenced for this shard: every sequence is still to come.
            return []
        return stream.events_from(from_sequence, limit)

    def last_trades(self) -> list[LastTrade]:
        """The last trade of every symbol that traded, in symbol order."""
        trades = [book.last_trade() for _, book in sorted(self.books.items())]
        return [trade for trade in trades if trade is not None]

    def levels(self, symbol: str, side: int) -> list[tuple[int, list[OrderView]]]:
        """One side of a book, best level first: (price, resting orders in time priority)."""
        book = self.books[symbol]
        book_side = book.bids if side == BUY else book.asks
        return [
            (level.price_ticks, [order.view() for order in level.live_orders()])
            for level in book_side.levels_best_first()
        ]

    def book_snapshot(self, symbol: str, depth: int = 0) -> BookSnapshot:
        """A symbol's levels, best first (`depth` per side, 0: all), as of its sequences."""
        feed = self.market_feed()
        book = self.books.get(symbol)
        if book is None:
            raise UnknownSymbolError(symbol)
        return feed.book_snapshot(book, depth)

    def book_updates_from(
        self, symbol: str, from_sequence: int, limit: int | None = None
    ) -> list[BookUpdate]:
        """Retained book updates with sequence >= from_sequence, oldest first, at most
        `limit`; `MarketSequenceTooOldError` if the first is gone."""
        return self.market_feed().symbol_feed(symbol).updates_from(from_sequence, limit)

    def trades_from(
        self, symbol: str, from_sequence: int, limit: int | None = None
    ) -> list[PublicTrade]:
        """Retained trades with sequence >= from_sequence, oldest first, at most `limit`;
        `MarketSequenceTooOldError` if the first is gone."""
        return self.market_feed().symbol_feed(symbol).trades_from(from_sequence, limit)

    def market_feed(self) -> MarketFeed:
        feed = self.feed
        if feed is None:
            raise MarketFeedInactiveError(self.machine_version)
        return feed

    def state_hash(self) -> bytes:
        """Digest of the whole state in O(symbols + shards + kill-switched users)."""
        settings = self.settings
        digest = hashlib.blake2b(digest_size=16)
        digest.update(
            _HASH_HEADER.pack(
                self.digest_sum,
                self.last_trade_id,
                self.last_arrival,
                len(self.dedup.orders),
                len(self.dedup.finished),
                len(self.expiries),
            )
        )
        digest.update(
            _HASH_SETTINGS.pack(
                settings.dedup_horizon_ms,
                settings.retained_events_per_shard,
                settings.max_expiries_per_timer,
                settings.max_dedup_sweeps_per_timer,
                settings.max_commands_per_batch,
            )
        )
        for symbol, book in sorted(self.books.items()):
            config = book.settings
            digest.update(symbol.encode() + b"\x00")
            digest.update(
                f"{config.base_asset}\x00{config.quote_asset}\x00".encode()
                + _HASH_SYMBOL.pack(
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
        for oms_shard, stream in sorted(self.streams.items()):
            digest.update(oms_shard.encode() + b"\x00")
            digest.update(_HASH_STREAM.pack(stream.next_sequence, len(stream.retained)))
        for user_id in sorted(self.kill_switched):
            digest.update(_HASH_USER.pack(user_id))
        if self.machine_version > 1:
            # Only past version 1, so a build from before versions hashes alike.
            digest.update(_HASH_VERSION.pack(self.machine_version))
        feed = self.feed
        if feed is not None:
            digest.update(_HASH_RETAINED.pack(settings.retained_market_data_per_symbol))
            for symbol, symbol_feed in sorted(feed.symbols.items()):
                digest.update(symbol.encode() + b"\x00")
                digest.update(
                    _HASH_FEED.pack(
                        symbol_feed.book_sequence,
                        symbol_feed.trade_sequence,
                        len(symbol_feed.updates),
                        len(symbol_feed.trades),
                        symbol_feed.halted,
                    )
                    + symbol_feed.digest
                )
        return digest.digest()
