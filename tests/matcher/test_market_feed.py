"""The market-data feed (state-machine version 2): a subscriber that applies the book updates
from a snapshot holds exactly the book a fresh snapshot shows, after every entry; sequences
run without a gap per symbol; each match is one public trade; a resume from any retained
sequence rebuilds the same book; the retained windows stay bounded; halts show as status."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.matcher.core.errors import (
    MarketFeedInactiveError,
    MarketSequenceTooOldError,
    UnknownSymbolError,
)
from services.matcher.core.market_feed import (
    HALTED,
    TRADING,
    BookLevel,
    BookUpdate,
    LevelChange,
    PublicTrade,
)
from tests.matcher.feed_support import SYMBOLS, FeedDriver, FeedStream, LocalBook, Subscriber
from tests.matcher.support import (
    BUY,
    GTD,
    IOC,
    SELL,
    cancel,
    halt,
    kill_switch,
    limit,
    market_buy,
    resume,
)
from tests.matcher.test_contract import random_commands
from tests.matcher.test_differential import DataChooser, RandomChooser

AAA = "AAA-USD"


def check_resumes(driver: FeedDriver, subscriber: Subscriber) -> None:
    """From every retained sequence (and from the one to come): the book held at the
    sequence before, plus the updates from there, is the book now; older: the error."""
    engine = driver.machine.engine
    for symbol in SYMBOLS:
        now = subscriber.books[symbol].view()
        feed = engine.market_feed().symbols[symbol]
        first = feed.book_sequence + 1 - len(feed.updates)
        for start in range(first, feed.book_sequence + 2):
            book = subscriber.history[symbol][start - 1].copy()
            limit = 1 + start % 3
            position = start
            while True:  # paged, as a subscriber catching up would
                page = engine.book_updates_from(symbol, position, limit)
                for update in page:
                    book.apply(update)
                if len(page) < limit:
                    break
                position += limit
            assert book.view()[0::2] == now[0::2]  # sequence, status, bids (trades aside)
            assert book.view()[3:] == now[3:]
        trades = subscriber.trades[symbol]
        first_trade = feed.trade_sequence + 1 - len(feed.trades)
        for start in range(first_trade, feed.trade_sequence + 2):
            assert engine.trades_from(symbol, start) == trades[start - 1 :]
        if first > 1:
            with pytest.raises(MarketSequenceTooOldError) as gone:
                engine.book_updates_from(symbol, first - 1)
            assert gone.value.first_retained_sequence == first
            with pytest.raises(MarketSequenceTooOldError):
                engine.book_updates_from(symbol, 0)
        if first_trade > 1:
            with pytest.raises(MarketSequenceTooOldError):
                engine.trades_from(symbol, first_trade - 1)


def run_feed(driver: FeedDriver, stream: FeedStream, steps: int) -> Subscriber:
    subscriber = Subscriber(driver.machine)
    for entry in stream.entries(steps):
        subscriber.take(driver.entry(entry))
        for symbol in SYMBOLS:
            feed = driver.machine.engine.market_feed().symbols[symbol]
            retained = driver.machine.settings.retained_market_data_per_symbol
            assert len(feed.updates) <= retained and len(feed.trades) <= retained
    check_resumes(driver, subscriber)
    return subscriber


@settings(max_examples=150, deadline=None)
@given(data=st.data(), retained=st.sampled_from((2, 5, 10_000)))
def test_a_book_rebuilt_from_the_feed_is_the_snapshot_after_every_entry(
    data: st.DataObject, retained: int
) -> None:
    driver = FeedDriver.create(dedup_horizon_ms=60, retained_market_data_per_symbol=retained)
    run_feed(driver, FeedStream(DataChooser(data)), data.draw(st.integers(1, 60)))


@pytest.mark.parametrize("seed", range(4))
def test_long_seeded_flows_rebuild_every_book_and_resume_from_every_retained_sequence(
    seed: int,
) -> None:
    driver = FeedDriver.create(
        dedup_horizon_ms=(50, 400)[seed % 2], retained_market_data_per_symbol=(40, 10_000)[seed % 2]
    )
    subscriber = run_feed(driver, FeedStream(RandomChooser(random.Random(seed))), 700)
    assert all(book.book_sequence > 50 for book in subscriber.books.values())
    assert sum(book.trade_sequence for book in subscriber.books.values()) > 50


def entry(driver: FeedDriver, commands: list[object], now: int) -> tuple[object, ...]:
    egress = driver.entry((now, commands))  # type: ignore[arg-type]
    assert egress is not None
    return egress.market


def test_one_update_per_entry_in_canonical_order_and_one_trade_per_match() -> None:
    driver = FeedDriver.create()
    first = entry(
        driver,
        [
            limit("s1:1:1", 1, SELL, 102, 4),
            limit("s1:2:1", 2, BUY, 98, 2),
            limit("s1:1:2", 1, SELL, 101, 5),
            limit("s1:2:2", 2, BUY, 99, 2),
            limit("s1:3:1", 3, SELL, 101, 1),
        ],
        1_000,
    )
    assert first == (
        BookUpdate(
            AAA,
            1,
            1_000,
            TRADING,
            (
                LevelChange(BUY, 99, 2, 1),
                LevelChange(BUY, 98, 2, 1),
                LevelChange(SELL, 101, 6, 2),
                LevelChange(SELL, 102, 4, 1),
            ),
        ),
    )
    # One taker through two makers at 101 and into 102: three trades, each once.
    second = entry(driver, [limit("s1:4:1", 4, BUY, 102, 8)], 1_001)
    assert second == (
        PublicTrade(AAA, 1, 1, 101, 5, BUY, 1_001),
        PublicTrade(AAA, 2, 2, 101, 1, BUY, 1_001),
        PublicTrade(AAA, 3, 3, 102, 2, BUY, 1_001),
        BookUpdate(
            AAA, 2, 1_001, TRADING, (LevelChange(SELL, 101, 0, 0), LevelChange(SELL, 102, 2, 1))
        ),
    )
    snapshot = driver.machine.engine.book_snapshot(AAA, 0)
    assert snapshot.book_sequence == 2 and snapshot.trade_sequence == 3
    assert snapshot.bids == (BookLevel(99, 2, 1), BookLevel(98, 2, 1))
    assert snapshot.asks == (BookLevel(102, 2, 1),)
    assert driver.machine.engine.book_snapshot(AAA, 1).bids == (BookLevel(99, 2, 1),)


def test_a_change_undone_within_the_entry_publishes_nothing() -> None:
    driver = FeedDriver.create()
    entry(driver, [limit("s1:1:1", 1, SELL, 101, 5)], 1_000)
    quiet = driver.entry(
        (
            1_001,
            [
                limit("s1:2:1", 2, BUY, 99, 3),  # rests ...
                cancel("s1:2:1", 2),  # ... and goes
                limit("s1:2:2", 2, BUY, 100, 3, tif=IOC),  # crosses nothing, rests nowhere
                limit("s1:2:3", 2, BUY, 100, 3, symbol="NOPE"),  # rejected
                halt(AAA),
                resume(AAA),  # the status back as it was
            ],
        )
    )
    assert quiet is not None and quiet.market == ()
    assert driver.machine.engine.book_snapshot(AAA).book_sequence == 1
    # The same level twice in one entry: one change, its final value.
    assert entry(
        driver, [limit("s1:2:4", 2, SELL, 101, 2), limit("s1:3:1", 3, BUY, 101, 1)], 1_002
    ) == (
        PublicTrade(AAA, 1, 1, 101, 1, BUY, 1_002),
        BookUpdate(AAA, 2, 1_002, TRADING, (LevelChange(SELL, 101, 6, 2),)),
    )


def test_a_halted_book_keeps_its_orders_and_says_halted() -> None:
    driver = FeedDriver.create()
    entry(driver, [limit("s1:1:1", 1, SELL, 101, 5), limit("s1:2:1", 2, BUY, 99, 3)], 1_000)
    assert entry(driver, [halt(AAA)], 1_001) == (BookUpdate(AAA, 2, 1_001, HALTED, ()),)
    snapshot = driver.machine.engine.book_snapshot(AAA)
    assert snapshot.status == HALTED
    assert snapshot.bids == (BookLevel(99, 3, 1),) and snapshot.asks == (BookLevel(101, 5, 1),)
    assert driver.entry((1_002, [halt(AAA)])).market == ()  # type: ignore[union-attr]
    # Cancels change a halted book's levels; new orders are refused and change nothing.
    assert entry(driver, [cancel("s1:2:1", 2), limit("s1:3:1", 3, BUY, 100, 1)], 1_003) == (
        BookUpdate(AAA, 3, 1_003, HALTED, (LevelChange(BUY, 99, 0, 0),)),
    )
    assert entry(driver, [resume(AAA)], 1_004) == (BookUpdate(AAA, 4, 1_004, TRADING, ()),)
    # Halted with its resting orders cancelled: one update, the status and the levels gone.
    entry(driver, [limit("s1:2:2", 2, BUY, 98, 2)], 1_005)
    assert entry(driver, [halt(AAA, cancel_resting=True)], 1_006) == (
        BookUpdate(
            AAA, 6, 1_006, HALTED, (LevelChange(BUY, 98, 0, 0), LevelChange(SELL, 101, 0, 0))
        ),
    )


def test_a_kill_switch_shows_as_the_levels_its_cancels_change() -> None:
    driver = FeedDriver.create()
    entry(
        driver,
        [
            limit("s1:1:1", 1, SELL, 101, 5),
            limit("s1:2:1", 2, SELL, 101, 2),
            limit("s1:1:2", 1, BUY, 49, 1, symbol="BBB-USD"),
        ],
        1_000,
    )
    assert entry(driver, [kill_switch(1, True)], 1_001) == (
        BookUpdate(AAA, 2, 1_001, TRADING, (LevelChange(SELL, 101, 2, 1),)),
        BookUpdate("BBB-USD", 2, 1_001, TRADING, (LevelChange(BUY, 49, 0, 0),)),
    )


def test_expiries_and_market_orders_publish_from_their_entries() -> None:
    driver = FeedDriver.create()
    entry(
        driver,
        [
            limit("s1:1:1", 1, SELL, 101, 5, tif=GTD, expire_at_ms=1_050),
            limit("s1:1:2", 1, SELL, 102, 5),
        ],
        1_000,
    )
    assert entry(driver, [market_buy("s1:2:1", 2, 3 * 101 * 2 + 2)], 1_010) == (
        PublicTrade(AAA, 1, 1, 101, 2, BUY, 1_010),
        BookUpdate(AAA, 2, 1_010, TRADING, (LevelChange(SELL, 101, 3, 1),)),
    )
    assert driver.entry((1_049, None)) is None
    expired = driver.entry((1_050, None))
    assert expired is not None
    assert expired.market == (BookUpdate(AAA, 3, 1_050, TRADING, (LevelChange(SELL, 101, 0, 0),)),)


def test_the_feed_starts_at_the_activation_with_sequence_1() -> None:
    driver = FeedDriver.create(version=1)
    for item in random_commands(seed=5, batches=150):
        egress = driver.entry(item)
        assert egress is None or egress.market == ()
    engine = driver.machine.engine
    assert engine.feed is None
    with pytest.raises(MarketFeedInactiveError):
        engine.book_snapshot(AAA)
    driver.machine.activate_version(2)
    subscriber = Subscriber(driver.machine)
    assert any(book.bids or book.asks for book in subscriber.books.values())
    for symbol in SYMBOLS:
        assert subscriber.books[symbol].book_sequence == 0
        assert engine.book_updates_from(symbol, 1) == []
    firsts: dict[str, int] = {}
    for item in random_commands(seed=6, batches=150, start_ms=3_000):
        egress = driver.entry(item)
        subscriber.take(egress)
        for update in egress.book_updates() if egress is not None else ():
            firsts.setdefault(update.symbol, update.book_sequence)
    assert firsts == dict.fromkeys(SYMBOLS, 1)


def test_a_resume_from_before_the_window_is_refused_and_the_window_is_bounded() -> None:
    driver = FeedDriver.create(retained_market_data_per_symbol=3)
    for index in range(1, 8):
        entry(driver, [limit(f"s1:1:{index}", 1, SELL, 100 + index % 3, index)], 1_000 + index)
        entry(driver, [limit(f"s1:2:{index}", 2, BUY, 102, 1)], 1_000 + index)
    engine = driver.machine.engine
    feed = engine.market_feed().symbols[AAA]
    assert (feed.book_sequence, len(feed.updates), feed.trade_sequence, len(feed.trades)) == (
        14,
        3,
        7,
        3,
    )
    assert [update.book_sequence for update in engine.book_updates_from(AAA, 12)] == [12, 13, 14]
    assert [update.book_sequence for update in engine.book_updates_from(AAA, 13, 1)] == [13]
    assert engine.book_updates_from(AAA, 15) == []
    assert [trade.trade_sequence for trade in engine.trades_from(AAA, 5)] == [5, 6, 7]
    with pytest.raises(MarketSequenceTooOldError, match="oldest retained is 12") as gone:
        engine.book_updates_from(AAA, 11)
    assert (gone.value.symbol, gone.value.from_sequence) == (AAA, 11)
    with pytest.raises(MarketSequenceTooOldError, match="trades"):
        engine.trades_from(AAA, 4)


def test_an_unknown_symbol_is_its_own_error() -> None:
    engine = FeedDriver.create().machine.engine
    for query in (
        lambda: engine.book_snapshot("NOPE", 0),
        lambda: engine.book_updates_from("NOPE", 1),
        lambda: engine.trades_from("NOPE", 1),
    ):
        with pytest.raises(UnknownSymbolError, match="NOPE"):
            query()


def test_a_version_1_engine_publishes_nothing() -> None:
    driver = FeedDriver.create(version=1)
    for item in random_commands(seed=8, batches=120):
        egress = driver.entry(item)
        assert egress is None or egress.market == ()
    assert driver.machine.engine.feed is None


def test_local_book_refuses_a_gap() -> None:
    """The subscriber's own check bites: an update out of sequence is caught."""
    book = LocalBook(3, 0, TRADING, {}, {})
    with pytest.raises(AssertionError):
        book.apply(BookUpdate(AAA, 5, 0, TRADING, (LevelChange(BUY, 99, 1, 1),)))
