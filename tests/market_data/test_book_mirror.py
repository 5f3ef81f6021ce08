"""`MirroredBook`: a snapshot then updates in sequence give the book's levels, best first
per side; an update out of sequence is a gap that changes nothing; a crossed book is seen.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protos.oms.v1 import market_data_pb2, matcher_pb2
from services.market_data.book_mirror import (
    HALTED,
    TRADING,
    UNKNOWN,
    BookSideMirror,
    FeedGapError,
    MirroredBook,
)
from tests.market_data.feed_messages import snapshot, update

SYMBOL = "BTC-USDT"


def test_the_matchers_book_status_maps_onto_market_status_by_number() -> None:
    # MirroredBook takes the matcher's status number as it is (book_mirror.py says so).
    assert int(matcher_pb2.BOOK_STATUS_TRADING) == market_data_pb2.MARKET_STATUS_TRADING == TRADING
    assert int(matcher_pb2.BOOK_STATUS_HALTED) == market_data_pb2.MARKET_STATUS_HALTED == HALTED
    assert int(UNKNOWN) not in matcher_pb2.BookStatus.values()


def test_a_book_is_unknown_until_its_first_snapshot_and_takes_no_update_before() -> None:
    book = MirroredBook(SYMBOL)
    assert not book.known and book.status == UNKNOWN
    with pytest.raises(FeedGapError):
        book.apply(update(SYMBOL, 1, bids=[(100, 1, 1)]))
    assert book.bids.levels == {} and book.book_sequence == 0


def test_a_snapshot_then_updates_in_sequence_give_the_levels() -> None:
    book = MirroredBook(SYMBOL)
    book.reset(
        snapshot(
            SYMBOL,
            7,
            bids=[(100, 5, 2), (99, 3, 1)],
            asks=[(101, 4, 1), (103, 2, 2)],
            trade_sequence=4,
            last_trade_id=40,
            last_price_ticks=100,
            consensus_time_ms=7_000,
        )
    )
    assert book.known and book.status == TRADING
    assert (book.book_sequence, book.trade_sequence, book.last_trade_id) == (7, 4, 40)
    assert (book.last_price_ticks, book.consensus_time_ms) == (100, 7_000)

    book.apply(update(SYMBOL, 8, bids=[(100, 0, 0), (98, 6, 3)], asks=[(102, 1, 1)]))
    book.apply(update(SYMBOL, 9, asks=[(101, 9, 2)], status=matcher_pb2.BOOK_STATUS_HALTED))
    assert book.bids.best(0) == [(99, 3, 1), (98, 6, 3)]
    assert book.asks.best(0) == [(101, 9, 2), (102, 1, 1), (103, 2, 2)]
    assert (book.book_sequence, book.status, book.consensus_time_ms) == (9, HALTED, 9_000)
    # Trades are not the book's business: the update leaves them as they were.
    assert (book.trade_sequence, book.last_trade_id) == (4, 40)

    shown = book.order_book(2)
    assert shown.symbol == SYMBOL and shown.book_sequence == 9 and shown.trade_sequence == 4
    assert shown.status == market_data_pb2.MARKET_STATUS_HALTED
    assert [(level.price_ticks, level.total_lots) for level in shown.bids] == [(99, 3), (98, 6)]
    assert [level.price_ticks for level in shown.asks] == [101, 102]


@pytest.mark.parametrize("sequence", [5, 6, 8, 100])
def test_an_update_out_of_sequence_is_a_gap_and_changes_nothing(sequence: int) -> None:
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, 6, bids=[(100, 5, 2)], asks=[(101, 4, 1)], consensus_time_ms=60))
    before = book.order_book(0).SerializeToString()
    with pytest.raises(FeedGapError, match=f"update {sequence} after 6"):
        book.apply(
            update(
                SYMBOL,
                sequence,
                bids=[(100, 0, 0), (99, 1, 1)],
                asks=[(101, 7, 7)],
                status=matcher_pb2.BOOK_STATUS_HALTED,
            )
        )
    assert book.order_book(0).SerializeToString() == before
    assert book.bids.prices == [100] and book.asks.prices == [101]
    # The next update in sequence still applies.
    book.apply(update(SYMBOL, 7, bids=[(99, 1, 1)]))
    assert book.bids.best(0) == [(100, 5, 2), (99, 1, 1)]


def test_best_gives_bids_highest_first_and_asks_lowest_first_to_any_depth() -> None:
    book = MirroredBook(SYMBOL)
    book.reset(
        snapshot(
            SYMBOL,
            1,
            # A snapshot lists best first; the mirror must not rely on it.
            bids=[(97, 1, 1), (100, 2, 1), (98, 3, 1)],
            asks=[(105, 1, 1), (101, 2, 1), (103, 3, 1)],
        )
    )
    assert [row[0] for row in book.bids.best(0)] == [100, 98, 97]
    assert [row[0] for row in book.bids.best(1)] == [100]
    assert [row[0] for row in book.bids.best(2)] == [100, 98]
    assert [row[0] for row in book.bids.best(3)] == [100, 98, 97]
    assert [row[0] for row in book.bids.best(50)] == [100, 98, 97]
    assert [row[0] for row in book.asks.best(0)] == [101, 103, 105]
    assert [row[0] for row in book.asks.best(1)] == [101]
    assert [row[0] for row in book.asks.best(2)] == [101, 103]
    assert [row[0] for row in book.asks.best(50)] == [101, 103, 105]
    assert book.bids.top() == (100, 2, 1) and book.asks.top() == (101, 2, 1)
    empty = MirroredBook(SYMBOL)
    assert empty.bids.best(5) == [] and empty.bids.top() is None and empty.asks.top() is None


@pytest.mark.parametrize(
    ("bids", "asks", "crossed"),
    [
        ([(100, 1, 1)], [(101, 1, 1)], False),
        ([(101, 1, 1)], [(101, 1, 1)], True),  # locked counts as crossed
        ([(102, 1, 1), (90, 1, 1)], [(101, 1, 1), (110, 1, 1)], True),
        ([(100, 1, 1)], [], False),
        ([], [(100, 1, 1)], False),
        ([], [], False),
    ],
)
def test_crossed_compares_the_best_bid_with_the_best_ask(
    bids: list[tuple[int, int, int]], asks: list[tuple[int, int, int]], crossed: bool
) -> None:
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, 1, bids=bids, asks=asks))
    assert book.crossed() is crossed


def test_crossed_follows_updates() -> None:
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, 1, bids=[(100, 1, 1)], asks=[(102, 1, 1)]))
    book.apply(update(SYMBOL, 2, bids=[(102, 1, 1)]))
    assert book.crossed()
    book.apply(update(SYMBOL, 3, asks=[(102, 0, 0)]))
    assert not book.crossed()


def test_a_snapshot_replaces_the_whole_book() -> None:
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, 3, bids=[(100, 1, 1), (99, 1, 1)], asks=[(101, 1, 1)]))
    book.reset(snapshot(SYMBOL, 10, bids=[(95, 2, 2)], status=matcher_pb2.BOOK_STATUS_HALTED))
    assert book.bids.best(0) == [(95, 2, 2)] and book.asks.best(0) == []
    assert (book.book_sequence, book.status) == (10, HALTED)
    book.apply(update(SYMBOL, 11, asks=[(96, 1, 1)]))
    assert book.asks.best(0) == [(96, 1, 1)]


# Side operations: (price, lots, count); lots 0 removes the level.
operations = st.lists(
    st.tuples(st.integers(1, 30), st.integers(0, 4), st.integers(1, 3)), max_size=60
)


@given(operations, st.booleans(), st.integers(0, 35))
def test_a_side_keeps_its_levels_sorted_whatever_the_order_of_changes(
    changes: list[tuple[int, int, int]], descending: bool, depth: int
) -> None:
    side = BookSideMirror(descending=descending)
    model: dict[int, tuple[int, int]] = {}
    for price, lots, count in changes:
        side.set(price, lots, count if lots else 0)
        if lots:
            model[price] = (lots, count)
        else:
            model.pop(price, None)
    assert side.prices == sorted(model)
    expected = [(price, *model[price]) for price in sorted(model, reverse=descending)]
    assert side.best(depth) == (expected[:depth] if depth else expected)
    assert side.top() == (expected[0] if expected else None)
