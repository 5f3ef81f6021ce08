"""The market feed at the edge: egress records and queries turned into `oms.v1` messages
(`MarketDataBatch`, `BookUpdate`, `PublicTrade`, `BookSnapshot`) say exactly what the
records say, live and on a resume alike, and survive the wire."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from protos.oms.v1 import common_pb2, matcher_pb2
from services.matcher.core import MarketFeedInactiveError, MarketSequenceTooOldError, codec
from services.matcher.core.market_feed import (
    HALTED,
    TRADING,
    BookLevel,
    BookSnapshot,
    BookUpdate,
    LevelChange,
    PublicTrade,
)
from tests.matcher.feed_support import SYMBOLS, FeedDriver, FeedStream
from tests.matcher.test_differential import RandomChooser


def update_fields(message: matcher_pb2.BookUpdate) -> BookUpdate:
    sides = ((common_pb2.SIDE_BUY, message.bids), (common_pb2.SIDE_SELL, message.asks))
    levels = [
        LevelChange(side, level.price_ticks, level.total_lots, level.order_count)
        for side, side_levels in sides
        for level in side_levels
    ]
    return BookUpdate(
        message.symbol,
        message.book_sequence,
        message.consensus_time_ms,
        message.status,
        tuple(levels),
    )


def trade_fields(message: matcher_pb2.PublicTrade) -> PublicTrade:
    return PublicTrade(
        message.symbol,
        message.trade_sequence,
        message.trade_id,
        message.price_ticks,
        message.quantity_lots,
        message.taker_side,
        message.consensus_time_ms,
    )


def levels_of(levels: Iterable[matcher_pb2.BookLevel]) -> tuple[BookLevel, ...]:
    return tuple(BookLevel(item.price_ticks, item.total_lots, item.order_count) for item in levels)


def snapshot_fields(message: matcher_pb2.BookSnapshot) -> BookSnapshot:
    return BookSnapshot(
        message.book_sequence,
        message.trade_sequence,
        message.status,
        levels_of(message.bids),
        levels_of(message.asks),
        message.last_trade_id,
        message.consensus_time_ms,
        message.last_price_ticks,
    )


def test_the_status_values_are_the_protos() -> None:
    assert (TRADING, HALTED) == (matcher_pb2.BOOK_STATUS_TRADING, matcher_pb2.BOOK_STATUS_HALTED)


def test_egress_and_queries_say_what_the_records_say_on_the_wire() -> None:
    driver = FeedDriver.create()
    stream = FeedStream(RandomChooser(random.Random(31)))
    published: list[object] = []
    batches = 0
    for entry in stream.entries(300):
        egress = driver.entry(entry)
        if egress is None or not egress.market:
            assert egress is None or egress.market_data_batch() is None
            continue
        batch = egress.market_data_batch()
        assert batch is not None
        wire = matcher_pb2.MarketDataBatch.FromString(batch.SerializeToString())
        assert [trade_fields(trade) for trade in wire.trades] == list(egress.trades())
        assert [update_fields(update) for update in wire.book_updates] == list(
            egress.book_updates()
        )
        published.extend(egress.market)
        batches += 1
    assert batches > 50
    machine = driver.machine
    for symbol in SYMBOLS:
        updates = [record for record in published if isinstance(record, BookUpdate)]
        trades = [record for record in published if isinstance(record, PublicTrade)]
        assert [update_fields(message) for message in machine.book_updates_from(symbol, 1)] == [
            update for update in updates if update.symbol == symbol
        ]
        assert [trade_fields(message) for message in machine.trades_from(symbol, 0, 5)] == [
            trade for trade in trades if trade.symbol == symbol
        ][:5]
        for depth in (0, 1, 3):
            message = machine.book_snapshot(symbol, depth)
            assert message.symbol == symbol
            assert snapshot_fields(message) == machine.engine.book_snapshot(symbol, depth)


def test_an_unchanged_level_count_of_zero_and_an_empty_snapshot_encode() -> None:
    gone = BookUpdate("AAA-USD", 7, 5, HALTED, (LevelChange(common_pb2.SIDE_SELL, 101, 0, 0),))
    message = codec.book_update_message(gone)
    assert update_fields(matcher_pb2.BookUpdate.FromString(message.SerializeToString())) == gone
    empty = codec.book_snapshot_message("AAA-USD", BookSnapshot(0, 0, TRADING, (), ()))
    assert (empty.book_sequence, empty.status, list(empty.bids)) == (0, TRADING, [])


def test_the_machines_queries_raise_the_feeds_errors() -> None:
    with pytest.raises(MarketFeedInactiveError):
        FeedDriver.create(version=1).machine.book_snapshot("AAA-USD")
    machine = FeedDriver.create(retained_market_data_per_symbol=1).machine
    driver = FeedDriver(machine)
    stream = FeedStream(RandomChooser(random.Random(2)))
    for entry in stream.entries(60):
        driver.entry(entry)
    with pytest.raises(MarketSequenceTooOldError):
        machine.book_updates_from("AAA-USD", 1)
