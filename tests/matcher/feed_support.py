"""What the market-data tests share: a machine driven entry by entry with its egress kept as
records, a random order flow with halts and kill switches, and a subscriber's copy of a
book built from the feed alone, checking every update as it applies it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from protos.oms.v1 import matcher_pb2
from services.matcher.core import MatcherEgress, MatcherMachine
from services.matcher.core.event_log import FillEvent
from services.matcher.core.market_feed import HALTED, TRADING, BookSnapshot, BookUpdate, PublicTrade
from services.runtime.core.state_machine import ApplyContext
from tests.matcher import support
from tests.matcher.support import BUY
from tests.matcher.test_differential import USERS, Chooser, StreamBuilder

SYMBOLS = (support.AAA.symbol, support.BBB.symbol)
MIDS = {support.AAA.symbol: 100, support.BBB.symbol: 50}

Entry = tuple[int, list[matcher_pb2.MatcherCommand] | None]  # None: a timer tick
Level = tuple[int, int, int]  # price_ticks, total_lots, order_count


@dataclass
class FeedStream:
    """The differential tests' order flow (every order type, cancels, GTD, duplicates,
    malformed orders) with halts, resumes and kill switches far more often."""

    choose: Chooser
    builder: StreamBuilder = field(init=False)

    def __post_init__(self) -> None:
        self.builder = StreamBuilder(self.choose, lambda symbol: MIDS.get(symbol, 100))

    def command(self, now: int) -> matcher_pb2.MatcherCommand:
        draw = self.choose.integer(0, 39)
        symbol = SYMBOLS[self.choose.integer(0, 1)]
        user = USERS[self.choose.integer(0, len(USERS) - 1)]
        if draw == 0:
            return support.halt(symbol, cancel_resting=bool(self.choose.integer(0, 1)))
        if draw <= 2:
            return support.resume(symbol)
        if draw == 3:
            return support.kill_switch(user, True)
        if draw <= 5:
            return support.kill_switch(user, False)
        return self.builder.command(now)

    def entries(self, count: int, now: int = 1_000) -> list[Entry]:
        entries: list[Entry] = []
        for _ in range(count):
            now += self.choose.integer(0, 3) * self.choose.integer(0, 12)
            if self.choose.integer(0, 5) == 0:
                entries.append((now, None))
            else:
                commands = [self.command(now) for _ in range(self.choose.integer(1, 5))]
                entries.append((now, commands))
        return entries


@dataclass
class FeedDriver:
    """A machine fed entry by entry; each entry's egress kept as records (None: nothing)."""

    machine: MatcherMachine
    position: int = 0

    @classmethod
    def create(cls, *, version: int = 2, **overrides: int) -> FeedDriver:
        driver = cls(MatcherMachine(support.settings(**overrides)))
        if version >= 2:
            driver.machine.activate_version(version)
        return driver

    def entry(self, entry: Entry) -> MatcherEgress | None:
        now, commands = entry
        self.position += 1
        context = ApplyContext(self.position, now)
        if commands is None:
            outputs = self.machine.on_timer(context)
            return outputs[0] if outputs else None
        (egress,) = self.machine.apply(support.batch_bytes(commands), context)
        assert egress.refused is None, egress.refused
        return egress


def expected_trades(egress: MatcherEgress) -> list[tuple[object, ...]]:
    """The public trades the fill events call for, each trade once, grouped as published
    (by symbol, then in trade order); checks every trade has one maker and one taker fill."""
    fills = [event for event in egress.events if isinstance(event, FillEvent)]
    roles = Counter((fill.trade_id, fill.maker) for fill in fills)
    assert all(count == 1 for count in roles.values()), roles
    makers = {fill.trade_id: fill for fill in fills if fill.maker}
    trades = []
    for fill in fills:
        if fill.maker:
            continue
        maker = makers[fill.trade_id]
        assert (maker.price_ticks, maker.quantity_lots) == (fill.price_ticks, fill.quantity_lots)
        assert maker.spec.symbol == fill.spec.symbol and maker.spec.side != fill.spec.side
        trades.append(
            (
                fill.spec.symbol,
                fill.trade_id,
                fill.price_ticks,
                fill.quantity_lots,
                fill.spec.side,
                fill.consensus_time_ms,
            )
        )
    assert set(makers) == {trade[1] for trade in trades}
    return sorted(trades, key=lambda trade: (trade[0], trade[1]))


def trade_fields(trade: PublicTrade) -> tuple[object, ...]:
    return (
        trade.symbol,
        trade.trade_id,
        trade.price_ticks,
        trade.quantity_lots,
        trade.taker_side,
        trade.consensus_time_ms,
    )


@dataclass
class LocalBook:
    """A subscriber's copy of one symbol's book, from a snapshot and the updates after it."""

    book_sequence: int
    trade_sequence: int
    status: int
    bids: dict[int, tuple[int, int]]
    asks: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, snapshot: BookSnapshot) -> LocalBook:
        return cls(
            snapshot.book_sequence,
            snapshot.trade_sequence,
            snapshot.status,
            {level.price_ticks: (level.total_lots, level.order_count) for level in snapshot.bids},
            {level.price_ticks: (level.total_lots, level.order_count) for level in snapshot.asks},
        )

    def copy(self) -> LocalBook:
        return LocalBook(
            self.book_sequence, self.trade_sequence, self.status, dict(self.bids), dict(self.asks)
        )

    def apply(self, update: BookUpdate) -> None:
        assert update.book_sequence == self.book_sequence + 1, (self.book_sequence, update)
        assert update.status in (TRADING, HALTED)
        keys = [(0, -price) if side == BUY else (1, price) for side, price, _, _ in update.levels]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), update  # canonical order
        assert update.levels or update.status != self.status, update  # an update changes
        for side, price, total, count in update.levels:
            levels = self.bids if side == BUY else self.asks
            if total == 0:
                assert count == 0 and price in levels, update  # only a level there goes
                del levels[price]
            else:
                assert total > 0 and count > 0, update
                assert levels.get(price) != (total, count), update  # only changes are sent
                levels[price] = (total, count)
        self.book_sequence = update.book_sequence
        self.status = update.status

    def add_trade(self, trade: PublicTrade) -> None:
        assert trade.trade_sequence == self.trade_sequence + 1, (self.trade_sequence, trade)
        self.trade_sequence = trade.trade_sequence

    def view(self) -> tuple[int, int, int, list[Level], list[Level]]:
        bids = [(price, *self.bids[price]) for price in sorted(self.bids, reverse=True)]
        asks = [(price, *self.asks[price]) for price in sorted(self.asks)]
        return self.book_sequence, self.trade_sequence, self.status, bids, asks

    def assert_not_crossed(self) -> None:
        if self.bids and self.asks:
            assert max(self.bids) < min(self.asks), self.view()


def snapshot_view(snapshot: BookSnapshot) -> tuple[int, int, int, list[Level], list[Level]]:
    return (
        snapshot.book_sequence,
        snapshot.trade_sequence,
        snapshot.status,
        [tuple(level) for level in snapshot.bids],  # type: ignore[misc]
        [tuple(level) for level in snapshot.asks],  # type: ignore[misc]
    )


@dataclass
class Subscriber:
    """Every symbol's book as the feed tells it, checked against the engine after each
    entry; every book state kept by sequence, every trade kept, for resumes."""

    machine: MatcherMachine
    books: dict[str, LocalBook] = field(default_factory=dict)
    history: dict[str, dict[int, LocalBook]] = field(default_factory=dict)
    trades: dict[str, list[PublicTrade]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for symbol in SYMBOLS:
            book = LocalBook.of(self.machine.engine.book_snapshot(symbol, 0))
            self.books[symbol] = book
            self.history[symbol] = {book.book_sequence: book.copy()}
            self.trades[symbol] = []

    def take(self, egress: MatcherEgress | None) -> None:
        if egress is not None:
            assert [trade_fields(trade) for trade in egress.trades()] == expected_trades(egress)
            published = [record.symbol for record in egress.market]
            assert published == sorted(published)  # per symbol, in symbol order
            updates = Counter(update.symbol for update in egress.book_updates())
            assert all(count == 1 for count in updates.values())  # one update per entry
            for record in egress.market:
                book = self.books[record.symbol]
                if isinstance(record, PublicTrade):
                    book.add_trade(record)
                    self.trades[record.symbol].append(record)
                else:
                    book.apply(record)
                    self.history[record.symbol][record.book_sequence] = book.copy()
        self.check()

    def check(self) -> None:
        engine = self.machine.engine
        for symbol, book in self.books.items():
            assert book.view() == snapshot_view(engine.book_snapshot(symbol, 0)), symbol
            book.assert_not_crossed()
