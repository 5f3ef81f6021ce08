"""`DepthView`: what a client keeps from a book stream equals the book, to the stream's depth.

The heart of `StreamOrderBook`: for random runs of matcher `BookUpdate` batches (levels
set and removed, the status changed), resnapshots and views created midway, a client's
`LocalBook` (gateway/market_data_client.py) that starts from its view's `order_book()` and
applies the view's diffs (one per batch at most, chained by `previous_book_sequence`)
always shows the mirrored book's best `depth` levels and its status, for every stream
depth. A diff lists only levels that change what the client holds, best first.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import cycle
from typing import TypeAlias

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.market_data_client import LocalBook, book_levels
from protos.oms.v1 import market_data_pb2, matcher_pb2
from services.market_data.book_mirror import HALTED, TRADING, UNKNOWN, MirroredBook
from services.market_data.depth_view import STREAM_DEPTHS, DepthView, merge_diffs
from tests.market_data.feed_messages import Row, snapshot, update

SYMBOL = "ETH-USDT"
DEPTHS = sorted(STREAM_DEPTHS)


@dataclass
class Follower:
    """One (symbol, depth) view and a client that follows it from its first book."""

    view: DepthView
    local: LocalBook

    @classmethod
    def join(cls, book: MirroredBook, depth: int) -> Follower:
        view = DepthView(book, depth)
        local = LocalBook(book.symbol)
        local.apply(wire(market_data_pb2.OrderBookEvent(book=view.order_book())))
        return cls(view, local)


def wire(event: market_data_pb2.OrderBookEvent) -> market_data_pb2.OrderBookEvent:
    """The event as a client receives it: serialized and parsed."""
    return market_data_pb2.OrderBookEvent.FromString(event.SerializeToString())


def assert_shows_the_book(follower: Follower, book: MirroredBook) -> None:
    depth = follower.view.depth
    local = follower.local
    assert local.levels() == (book.bids.best(depth), book.asks.best(depth)), depth
    assert local.status == book.status, depth
    assert local.book_sequence <= book.book_sequence
    # A subscriber joining now is given exactly what the others hold.
    first = follower.view.order_book()
    assert book_levels(first) == local.levels()
    assert (first.book_sequence, first.status) == (local.book_sequence, local.status)


def assert_rows_change_the_client(
    rows: list[market_data_pb2.PriceLevel], held: dict[int, tuple[int, int]], descending: bool
) -> None:
    prices = [row.price_ticks for row in rows]
    assert prices == sorted(set(prices), reverse=descending)  # best first, each once
    for row in rows:
        if row.total_lots == 0:
            assert row.order_count == 0 and row.price_ticks in held
        else:
            assert held.get(row.price_ticks) != (row.total_lots, row.order_count)


def advance(follower: Follower, book: MirroredBook, bids: set[int], asks: set[int]) -> bool:
    """The view's diff for the batch, applied by the client; True if there was one."""
    local = follower.local
    diff = follower.view.advance(bids, asks, 0)
    if diff is None:
        return False
    assert diff.symbol == book.symbol
    assert diff.previous_book_sequence == local.book_sequence
    assert diff.book_sequence == book.book_sequence
    assert diff.consensus_time_ms == book.consensus_time_ms
    assert list(diff.bids) or list(diff.asks) or diff.status != local.status
    assert_rows_change_the_client(list(diff.bids), local.bids, descending=True)
    assert_rows_change_the_client(list(diff.asks), local.asks, descending=False)
    local.apply(wire(market_data_pb2.OrderBookEvent(diff=diff)))
    return True


# --- random feeds ------------------------------------------------------------------------

# A level's new value in an update: (0, 0) removes it. Few prices, so a depth of 1 or 5
# sees levels fall out of it and rise into it.
Levels: TypeAlias = dict[int, tuple[int, int]]  # price -> (total_lots, order_count)
BookStatus: TypeAlias = matcher_pb2.BookStatus.ValueType


@dataclass(frozen=True)
class Batch:
    """Updates that arrive together: (bid changes, ask changes, status after) each."""

    updates: list[tuple[Levels, Levels, BookStatus]]


@dataclass(frozen=True)
class Resnapshot:
    """The book replaced by a snapshot `jump` sequences on; every view rebased."""

    bids: Levels
    asks: Levels
    status: BookStatus
    jump: int


@dataclass(frozen=True)
class Join:
    """A view of every depth made now, beside the ones already there."""


level_values = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, 5), st.integers(1, 3)))
bid_changes = st.dictionaries(st.integers(90, 104), level_values, max_size=4)
ask_changes = st.dictionaries(st.integers(96, 110), level_values, max_size=4)
statuses = st.sampled_from([matcher_pb2.BOOK_STATUS_TRADING] * 4 + [matcher_pb2.BOOK_STATUS_HALTED])
updates = st.tuples(bid_changes, ask_changes, statuses)
book_rows = st.dictionaries(
    st.integers(90, 110), st.tuples(st.integers(1, 5), st.integers(1, 3)), max_size=12
)
steps: st.SearchStrategy[Batch | Resnapshot | Join] = st.one_of(
    st.builds(Batch, st.lists(updates, min_size=1, max_size=4)),
    st.builds(Batch, st.lists(updates, min_size=1, max_size=1)),
    st.builds(Resnapshot, book_rows, book_rows, statuses, st.integers(0, 5)),
    st.just(Join()),
)


def rows_of(levels: Levels) -> list[Row]:
    return [(price, lots, count) for price, (lots, count) in levels.items()]


@settings(max_examples=80)
@given(book_rows, book_rows, st.integers(0, 50), st.lists(steps, max_size=25))
def test_a_client_following_any_depth_always_shows_the_books_best_levels(
    first_bids: Levels,
    first_asks: Levels,
    first_sequence: int,
    run: list[Batch | Resnapshot | Join],
) -> None:
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, first_sequence, rows_of(first_bids), rows_of(first_asks)))
    followers = [Follower.join(book, depth) for depth in DEPTHS]
    for follower in followers:
        assert follower.local.book_sequence == first_sequence
        assert_shows_the_book(follower, book)
    for step in run:
        if isinstance(step, Batch):
            touched_bids: set[int] = set()
            touched_asks: set[int] = set()
            for bids, asks, status in step.updates:
                book.apply(
                    update(
                        SYMBOL,
                        book.book_sequence + 1,
                        bids=rows_of(bids),
                        asks=rows_of(asks),
                        status=status,
                    )
                )
                touched_bids.update(bids)
                touched_asks.update(asks)
            for follower in followers:
                advance(follower, book, touched_bids, touched_asks)
                assert_shows_the_book(follower, book)
        elif isinstance(step, Resnapshot):
            book.reset(
                snapshot(
                    SYMBOL,
                    book.book_sequence + step.jump,
                    rows_of(step.bids),
                    rows_of(step.asks),
                    status=step.status,
                )
            )
            for follower in followers:
                resyncs = follower.local.resyncs
                follower.view.rebase()
                follower.local.apply(
                    wire(market_data_pb2.OrderBookEvent(book=follower.view.order_book()))
                )
                assert follower.local.resyncs == resyncs + 1
                assert follower.local.book_sequence == book.book_sequence
                assert_shows_the_book(follower, book)
        else:  # views made midway: they start from the book as it is now
            joined = [Follower.join(book, depth) for depth in DEPTHS]
            for follower in joined:
                assert follower.local.book_sequence == book.book_sequence
                assert_shows_the_book(follower, book)
            followers.extend(joined)


@settings(max_examples=80)
@given(
    book_rows,
    book_rows,
    st.lists(st.lists(updates, min_size=1, max_size=3), min_size=1, max_size=20),
    st.lists(st.integers(1, 6), min_size=1, max_size=20),
)
def test_a_stream_behind_that_gets_its_waiting_diffs_merged_shows_the_same_book(
    first_bids: Levels,
    first_asks: Levels,
    batches: list[list[tuple[Levels, Levels, BookStatus]]],
    catch_up_every: list[int],
) -> None:
    """A stream behind sends the diffs waiting in its queue as one (`merge_diffs`): a
    client applying merged runs of any length holds, after each, exactly what a client
    applying every diff holds; a merged diff lists each price once, best first, and
    spans from the run's first update to its last."""
    book = MirroredBook(SYMBOL)
    book.reset(snapshot(SYMBOL, 7, rows_of(first_bids), rows_of(first_asks)))
    for depth in DEPTHS:
        every, lagging = Follower.join(book, depth), Follower.join(book, depth)
        lagging.view = every.view  # one view: the lagging client reads the same diffs
        waiting: list[market_data_pb2.OrderBookDiff] = []
        runs = cycle(catch_up_every)
        run_length = next(runs)
        for number, batch in enumerate(batches):
            touched_bids: set[int] = set()
            touched_asks: set[int] = set()
            for bids, asks, status in batch:
                book.apply(
                    update(
                        SYMBOL,
                        book.book_sequence + 1,
                        bids=rows_of(bids),
                        asks=rows_of(asks),
                        status=status,
                        consensus_time_ms=1_000 + book.book_sequence,
                    )
                )
                touched_bids.update(bids)
                touched_asks.update(asks)
            diff = every.view.advance(touched_bids, touched_asks, 1_000 + number)
            if diff is None:
                continue
            every.local.apply(wire(market_data_pb2.OrderBookEvent(diff=diff)))
            waiting.append(diff)
            if len(waiting) >= run_length or number == len(batches) - 1:
                merged = merge_diffs(waiting)
                assert merged.previous_book_sequence == waiting[0].previous_book_sequence
                assert merged.book_sequence == waiting[-1].book_sequence
                assert merged.first_consensus_time_ms == waiting[0].first_consensus_time_ms
                assert merged.consensus_time_ms == waiting[-1].consensus_time_ms
                for rows, descending in ((merged.bids, True), (merged.asks, False)):
                    prices = [row.price_ticks for row in rows]
                    assert prices == sorted(set(prices), reverse=descending)
                lagging.local.apply(wire(market_data_pb2.OrderBookEvent(diff=merged)))
                assert lagging.local.levels() == every.local.levels(), depth
                assert lagging.local.status == every.local.status
                assert lagging.local.book_sequence == every.local.book_sequence
                waiting.clear()
                run_length = next(runs)
        if not waiting:
            assert_shows_the_book(lagging, book)
        book.reset(snapshot(SYMBOL, 7, rows_of(first_bids), rows_of(first_asks)))


def test_merging_diffs_that_do_not_chain_is_refused() -> None:
    first = market_data_pb2.OrderBookDiff(symbol=SYMBOL, previous_book_sequence=3, book_sequence=5)
    gap = market_data_pb2.OrderBookDiff(symbol=SYMBOL, previous_book_sequence=6, book_sequence=7)
    with pytest.raises(ValueError, match="does not follow 5"):
        merge_diffs([first, gap])


# --- by example --------------------------------------------------------------------------


def traded_book() -> MirroredBook:
    book = MirroredBook(SYMBOL)
    book.reset(
        snapshot(
            SYMBOL,
            10,
            bids=[(100, 5, 1), (99, 4, 1), (98, 3, 1)],
            asks=[(101, 5, 1), (102, 4, 1), (103, 3, 1)],
            consensus_time_ms=10_000,
        )
    )
    return book


def test_a_level_leaving_the_depth_is_sent_removed_and_one_entering_it_whole() -> None:
    book = traded_book()
    top = Follower.join(book, 1)
    book.apply(update(SYMBOL, 11, bids=[(100, 0, 0)]))  # the best bid is taken
    diff = top.view.advance({100}, set(), 0)
    assert diff is not None
    assert [(row.price_ticks, row.total_lots, row.order_count) for row in diff.bids] == [
        (100, 0, 0),
        (99, 4, 1),
    ]
    assert list(diff.asks) == []
    assert (diff.previous_book_sequence, diff.book_sequence) == (10, 11)
    book.apply(update(SYMBOL, 12, bids=[(101, 2, 1)]))  # a better bid rises into the top
    diff = top.view.advance({101}, set(), 0)
    assert diff is not None
    assert [(row.price_ticks, row.total_lots) for row in diff.bids] == [(101, 2), (99, 0)]
    assert diff.previous_book_sequence == 11


def test_an_update_outside_the_depth_makes_no_diff_and_the_next_one_chains_over_it() -> None:
    book = traded_book()
    top = Follower.join(book, 1)
    book.apply(update(SYMBOL, 11, bids=[(98, 7, 2)], asks=[(103, 0, 0)]))
    assert top.view.advance({98}, {103}, 0) is None
    book.apply(update(SYMBOL, 12, asks=[(101, 1, 1)]))
    diff = top.view.advance(set(), {101}, 0)
    assert diff is not None
    # Chained from what the stream last got (10), not from the skipped 11.
    assert (diff.previous_book_sequence, diff.book_sequence) == (10, 12)
    top.local.apply(market_data_pb2.OrderBookEvent(diff=diff))
    assert top.local.levels() == ([(100, 5, 1)], [(101, 1, 1)])


def test_several_updates_of_one_batch_make_one_diff_of_their_net_change() -> None:
    book = traded_book()
    full, top5 = Follower.join(book, 0), Follower.join(book, 5)
    touched_bids: set[int] = set()
    touched_asks: set[int] = set()
    for sequence, bids, asks in [
        (11, [(97, 1, 1)], [(101, 0, 0)]),  # added, then removed again below
        (12, [(97, 0, 0), (100, 6, 2)], []),
        (13, [], [(101, 5, 1), (104, 2, 1)]),  # 101 back as it was
    ]:
        book.apply(update(SYMBOL, sequence, bids=bids, asks=asks, consensus_time_ms=sequence))
        touched_bids.update(row[0] for row in bids)
        touched_asks.update(row[0] for row in asks)
    for follower in (full, top5):
        diff = follower.view.advance(touched_bids, touched_asks, 0)
        assert diff is not None
        assert (diff.previous_book_sequence, diff.book_sequence) == (10, 13)
        assert diff.consensus_time_ms == 13
        assert [(row.price_ticks, row.total_lots, row.order_count) for row in diff.bids] == [
            (100, 6, 2)
        ]
        assert [(row.price_ticks, row.total_lots, row.order_count) for row in diff.asks] == [
            (104, 2, 1)
        ]
        follower.local.apply(market_data_pb2.OrderBookEvent(diff=diff))
        assert_shows_the_book(follower, book)


def test_a_status_change_alone_is_a_diff_without_levels() -> None:
    book = traded_book()
    follower = Follower.join(book, 5)
    book.apply(update(SYMBOL, 11, status=matcher_pb2.BOOK_STATUS_HALTED))
    diff = follower.view.advance(set(), set(), 0)
    assert diff is not None and diff.status == HALTED
    assert list(diff.bids) == [] and list(diff.asks) == []
    book.apply(update(SYMBOL, 12, status=matcher_pb2.BOOK_STATUS_HALTED))
    assert follower.view.advance(set(), set(), 0) is None


def test_a_view_made_before_the_first_snapshot_starts_over_from_it_on_rebase() -> None:
    book = MirroredBook(SYMBOL)
    follower = Follower.join(book, 5)
    assert follower.local.status == UNKNOWN and follower.local.book_sequence == 0
    book.reset(snapshot(SYMBOL, 42, bids=[(100, 1, 1)], asks=[(101, 1, 1)]))
    follower.view.rebase()
    first = follower.view.order_book()
    assert first.book_sequence == 42 and first.status == TRADING
    follower.local.apply(market_data_pb2.OrderBookEvent(book=first))
    assert_shows_the_book(follower, book)
    book.apply(update(SYMBOL, 43, bids=[(99, 2, 1)]))
    assert advance(follower, book, {99}, set())
    assert_shows_the_book(follower, book)


def test_a_rebase_after_a_resnapshot_publishes_the_new_book_and_diffs_chain_from_it() -> None:
    book = traded_book()
    follower = Follower.join(book, 1)
    book.reset(snapshot(SYMBOL, 50, bids=[(90, 9, 9)], asks=[(95, 1, 1), (96, 1, 1)]))
    follower.view.rebase()
    first = follower.view.order_book()
    assert first.book_sequence == 50
    assert book_levels(first) == ([(90, 9, 9)], [(95, 1, 1)])
    follower.local.apply(market_data_pb2.OrderBookEvent(book=first))
    assert follower.local.resyncs == 1
    book.apply(update(SYMBOL, 51, asks=[(95, 0, 0)]))
    diff = follower.view.advance(set(), {95}, 0)
    assert diff is not None and diff.previous_book_sequence == 50
    follower.local.apply(market_data_pb2.OrderBookEvent(diff=diff))
    assert follower.local.levels() == ([(90, 9, 9)], [(96, 1, 1)])
