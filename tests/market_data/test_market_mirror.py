"""`MarketMirror.apply_batch`: matcher batches in, books, trades and days mirrored, and the
fan-out: one serialized message per (symbol, depth) view or per symbol's trades, offered
to every subscriber as the same bytes.

Trades are never taken twice (a repeated `trade_sequence` is skipped) and a jump in
`trade_sequence` ends the symbol's trade streams and counts the trades lost; a new
snapshot resynchronises the symbol's book streams; a gap marks the book UNKNOWN yet still
publishes what the batch applied before it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.market_data_client import LocalBook, book_levels
from protos.oms.v1 import market_data_pb2, matcher_pb2
from services.market_data.book_mirror import TRADING, UNKNOWN, FeedGapError
from services.market_data.market_mirror import BookStream, MarketMirror, PublishedDiff, TradeStream
from services.market_data.subscribers import Overflow, Subscriber
from tests.market_data.feed_messages import snapshot, trade, update

BTC, ETH = "BTC-USDT", "ETH-USDT"


def book_stream(limit: int = 100) -> BookStream:
    return Subscriber("peer", limit, Overflow.RESYNC)


def trade_stream(limit: int = 100) -> TradeStream:
    return Subscriber("peer", limit, Overflow.END)


def batch(
    *,
    snapshots: list[matcher_pb2.BookSnapshot] | None = None,
    trades: list[matcher_pb2.PublicTrade] | None = None,
    book_updates: list[matcher_pb2.BookUpdate] | None = None,
) -> matcher_pb2.MarketDataBatch:
    return matcher_pb2.MarketDataBatch(
        snapshots=snapshots or [], trades=trades or [], book_updates=book_updates or []
    )


def followed_mirror(retained_trades: int = 100) -> MarketMirror:
    """Both symbols snapshotted: BTC at book 5, trade 3 (trade id 1003); ETH empty."""
    mirror = MarketMirror([BTC, ETH], retained_trades)
    mirror.apply_batch(
        batch(
            snapshots=[
                snapshot(
                    BTC,
                    5,
                    bids=[(100, 5, 1), (99, 4, 2)],
                    asks=[(101, 3, 1), (102, 2, 1)],
                    trade_sequence=3,
                    last_trade_id=1_003,
                    last_price_ticks=100,
                    consensus_time_ms=5_000,
                ),
                snapshot(ETH, 0),
            ]
        )
    )
    return mirror


def trade_sequences(data: bytes) -> list[int]:
    return [trade.trade_sequence for trade in market_data_pb2.MarketTrades.FromString(data).trades]


def event(data: bytes | PublishedDiff) -> market_data_pb2.OrderBookEvent:
    """A book stream's message as a client reads it (a queued diff: as serialized)."""
    if isinstance(data, PublishedDiff):
        assert market_data_pb2.OrderBookEvent(diff=data.diff).SerializeToString() == data.data
        data = data.data
    return market_data_pb2.OrderBookEvent.FromString(data)


def test_a_first_snapshot_makes_the_book_known_and_marks_where_the_live_trades_start() -> None:
    mirror = MarketMirror([BTC], 10)
    assert not mirror.symbols[BTC].book.known
    mirror.apply_batch(
        batch(
            snapshots=[
                snapshot(
                    BTC,
                    5,
                    bids=[(100, 1, 1)],
                    trade_sequence=3,
                    last_trade_id=1_003,
                    consensus_time_ms=5_000,
                )
            ]
        )
    )
    market = mirror.symbols[BTC]
    assert market.book.known and market.book.status == TRADING
    assert (market.book.book_sequence, market.book.trade_sequence) == (5, 3)
    assert market.trade_id_at_start == 1_003
    assert mirror.as_of_ms[BTC] == 5_000
    assert mirror.statistics.snapshots == 1 and mirror.statistics.batches == 1
    # A later snapshot does not move where the live trades started.
    mirror.apply_batch(batch(snapshots=[snapshot(BTC, 9, trade_sequence=3, last_trade_id=1_003)]))
    assert market.trade_id_at_start == 1_003


def test_trades_append_in_sequence_update_the_day_and_are_never_taken_twice() -> None:
    mirror = followed_mirror()
    market = mirror.symbols[BTC]
    mirror.apply_batch(
        batch(
            trades=[
                trade(BTC, 4, price_ticks=101, quantity_lots=2, consensus_time_ms=60_000),
                trade(BTC, 5, price_ticks=103, quantity_lots=1, consensus_time_ms=61_000),
            ]
        )
    )
    # Sent again after a reconnect (4, 5), then the next one (6).
    mirror.apply_batch(
        batch(
            trades=[
                trade(BTC, 4, price_ticks=101, quantity_lots=2, consensus_time_ms=60_000),
                trade(BTC, 5, price_ticks=103, quantity_lots=1, consensus_time_ms=61_000),
                trade(BTC, 6, price_ticks=99, quantity_lots=4, consensus_time_ms=62_000),
            ]
        )
    )
    assert [held.trade_sequence for held in market.trades] == [4, 5, 6]
    assert mirror.statistics.trades == 3 and mirror.statistics.trades_lost == 0
    assert (market.book.trade_sequence, market.book.last_trade_id) == (6, 1_006)
    assert market.book.last_price_ticks == 99
    day = market.day.figures(62_000)
    assert (day.open_ticks, day.high_ticks, day.low_ticks) == (101, 103, 99)
    assert (day.volume_lots, day.trades) == (7, 3)
    assert day.quote_volume_ticks == 101 * 2 + 103 + 99 * 4
    assert mirror.as_of_ms[BTC] == 62_000
    public = market.trades[0]
    assert (public.symbol, public.trade_id, public.price_ticks, public.quantity_lots) == (
        BTC,
        1_004,
        101,
        2,
    )


def test_a_jump_in_trade_sequence_ends_the_trade_streams_and_counts_the_trades_lost() -> None:
    mirror = followed_mirror()
    market = mirror.symbols[BTC]
    market.day.seeded = True
    streams = [trade_stream(), trade_stream()]
    for stream in streams:
        assert mirror.join_trades(BTC, 0, stream) == []
    mirror.apply_batch(batch(trades=[trade(BTC, 4)]))
    assert all(not stream.ended and len(stream.queue) == 1 for stream in streams)
    mirror.apply_batch(batch(trades=[trade(BTC, 8), trade(BTC, 9)]))  # 5, 6, 7 never came
    assert mirror.statistics.trades_lost == 3
    for stream in streams:
        assert "trades 5..7" in stream.ended and not stream.queue
    assert not market.day.seeded  # the day misses them too
    assert [held.trade_sequence for held in market.trades] == [8, 9]
    assert market.book.trade_sequence == 9
    assert mirror.statistics.streams_ended_behind == 0  # they did not fall behind
    # A client resuming from before the jump cannot be served; from after it, it can.
    assert mirror.join_trades(BTC, 4, trade_stream()) is None
    backlog = mirror.join_trades(BTC, 8, trade_stream())
    assert backlog is not None and [held.trade_sequence for held in backlog] == [9]


def test_a_batch_of_trades_is_one_message_offered_to_every_trade_stream_as_the_same_bytes() -> None:
    mirror = followed_mirror()
    btc_streams = [trade_stream() for _ in range(3)]
    eth_stream = trade_stream()
    for stream in btc_streams:
        mirror.join_trades(BTC, 0, stream)
    mirror.join_trades(ETH, 0, eth_stream)
    serialized = mirror.statistics.messages_serialized
    mirror.apply_batch(batch(trades=[trade(BTC, 4), trade(BTC, 5), trade(ETH, 1, price_ticks=20)]))
    assert mirror.statistics.messages_serialized == serialized + 2
    first = btc_streams[0].queue[0]
    assert all(len(stream.queue) == 1 and stream.queue[0] is first for stream in btc_streams)
    assert trade_sequences(first) == [4, 5]
    assert market_data_pb2.MarketTrades.FromString(first).symbol == BTC
    assert trade_sequences(eth_stream.queue[0]) == [1]
    # A batch that repeats only trades already held publishes nothing.
    mirror.apply_batch(batch(trades=[trade(BTC, 5)]))
    assert all(len(stream.queue) == 1 for stream in btc_streams)


def test_a_trade_stream_that_falls_behind_ends_once() -> None:
    mirror = followed_mirror()
    slow = trade_stream(limit=2)
    mirror.join_trades(BTC, 0, slow)
    for sequence in range(4, 9):
        mirror.apply_batch(batch(trades=[trade(BTC, sequence)]))
    assert slow.ended and not slow.queue
    assert mirror.statistics.streams_ended_behind == 1


def test_trades_after_gives_the_held_backlog_or_none_when_too_old() -> None:
    mirror = followed_mirror(retained_trades=3)
    market = mirror.symbols[BTC]
    assert market.trades_after(3) == []  # nothing since
    assert market.trades_after(2) is None  # trade 3 came before the service: not held
    mirror.apply_batch(batch(trades=[trade(BTC, sequence) for sequence in range(4, 9)]))
    assert [held.trade_sequence for held in market.trades] == [6, 7, 8]
    assert market.trades_after(4) is None
    assert [held.trade_sequence for held in market.trades_after(5) or []] == [6, 7, 8]
    assert [held.trade_sequence for held in market.trades_after(7) or []] == [8]
    assert market.trades_after(8) == []
    stream = trade_stream()
    assert mirror.join_trades(BTC, 4, stream) is None
    assert stream not in market.trade_streams  # refused: nothing registered
    backlog = mirror.join_trades(BTC, 6, stream)
    assert [held.trade_sequence for held in backlog or []] == [7, 8]
    assert stream in market.trade_streams
    mirror.leave_trades(BTC, stream)
    assert stream not in market.trade_streams


def test_book_updates_make_one_diff_per_view_offered_to_its_streams_as_the_same_bytes() -> None:
    mirror = followed_mirror()
    top = [book_stream(), book_stream()]
    full = book_stream()
    firsts = [mirror.join_book(BTC, 1, stream) for stream in top]
    assert firsts[0] == firsts[1]
    first = event(firsts[0])
    assert first.WhichOneof("event") == "book" and first.book.book_sequence == 5
    assert book_levels(first.book) == ([(100, 5, 1)], [(101, 3, 1)])
    local_full = LocalBook(BTC)
    local_full.apply(event(mirror.join_book(BTC, 0, full)))
    serialized = mirror.statistics.messages_serialized
    mirror.apply_batch(
        batch(
            book_updates=[
                update(BTC, 6, bids=[(99, 0, 0)], consensus_time_ms=6_000),
                update(ETH, 1, asks=[(20, 1, 1)], consensus_time_ms=6_000),
            ]
        )
    )
    # Depth 1 saw nothing change; the full view did: one message, for its one stream.
    assert mirror.statistics.messages_serialized == serialized + 1
    assert not top[0].queue and not top[1].queue
    assert len(full.queue) == 1
    mirror.apply_batch(
        batch(
            book_updates=[
                update(BTC, 7, bids=[(100, 2, 1)], consensus_time_ms=7_000),
                update(BTC, 8, asks=[(101, 0, 0)], consensus_time_ms=7_000),
            ]
        )
    )
    # Updates 7 and 8 of one batch arrive as a single diff.
    assert mirror.statistics.messages_serialized == serialized + 3
    assert top[0].queue[0] is top[1].queue[0]
    diff = event(top[0].queue[0]).diff
    assert (diff.previous_book_sequence, diff.book_sequence) == (5, 8)
    assert [(row.price_ticks, row.total_lots) for row in diff.asks] == [(101, 0), (102, 2)]
    assert [(row.price_ticks, row.total_lots) for row in diff.bids] == [(100, 2)]
    for data in full.queue:
        local_full.apply(event(data))
    book = mirror.symbols[BTC].book
    assert local_full.levels() == (book.bids.best(0), book.asks.best(0))
    assert local_full.book_sequence == 8
    assert mirror.statistics.book_updates == 4


def test_a_new_snapshot_resynchronises_every_book_stream_of_the_symbol() -> None:
    mirror = followed_mirror()
    streams = {depth: book_stream() for depth in (0, 5)}
    other = book_stream()
    for depth, stream in streams.items():
        mirror.join_book(BTC, depth, stream)
    mirror.join_book(ETH, 5, other)
    mirror.apply_batch(batch(book_updates=[update(BTC, 6, bids=[(98, 1, 1)])]))
    assert all(len(stream.queue) == 1 for stream in streams.values())
    mirror.apply_batch(
        batch(
            snapshots=[snapshot(BTC, 20, bids=[(90, 1, 1)], trade_sequence=3)],
            book_updates=[update(BTC, 21, asks=[(91, 1, 1)])],
        )
    )
    for depth, stream in streams.items():
        assert stream.resync and not stream.queue and stream.wake.is_set()
        fresh = event(mirror.view_book(BTC, depth))
        assert fresh.book.book_sequence == 21
        assert book_levels(fresh.book) == ([(90, 1, 1)], [(91, 1, 1)])
    assert not other.resync
    assert mirror.statistics.resyncs == 2  # each stream once, whatever it missed since


def test_a_resnapshot_keeps_the_trades_held_when_the_batch_brings_the_rest() -> None:
    mirror = followed_mirror()
    stream = trade_stream()
    mirror.join_trades(BTC, 0, stream)
    # The group no longer held updates from 6: a snapshot, with trades from 4 still kept.
    mirror.apply_batch(
        batch(
            snapshots=[snapshot(BTC, 30, trade_sequence=5, last_trade_id=1_005)],
            trades=[trade(BTC, 4), trade(BTC, 5)],
        )
    )
    market = mirror.symbols[BTC]
    assert [held.trade_sequence for held in market.trades] == [4, 5]
    assert mirror.statistics.trades_lost == 0 and not stream.ended
    assert trade_sequences(stream.queue[0]) == [4, 5]


def test_a_gap_marks_the_book_unknown_and_still_publishes_what_was_applied() -> None:
    mirror = followed_mirror()
    btc, eth = book_stream(), book_stream()
    trades = trade_stream()
    mirror.join_book(BTC, 0, btc)
    mirror.join_book(ETH, 0, eth)
    mirror.join_trades(ETH, 0, trades)
    with pytest.raises(FeedGapError):
        mirror.apply_batch(
            batch(
                trades=[trade(ETH, 1)],
                book_updates=[
                    update(ETH, 1, asks=[(20, 1, 1)]),
                    update(BTC, 9, bids=[(98, 1, 1)]),  # 6 expected
                ],
            )
        )
    assert mirror.statistics.gaps == 1
    assert mirror.symbols[BTC].book.status == UNKNOWN
    assert mirror.symbols[BTC].book.bids.best(0) == [(100, 5, 1), (99, 4, 2)]
    assert not btc.queue  # nothing past the gap is shown
    assert len(eth.queue) == 1 and event(eth.queue[0]).diff.book_sequence == 1
    assert trade_sequences(trades.queue[0]) == [1]


def test_after_a_gap_the_snapshot_without_position_counts_the_trades_it_skipped() -> None:
    mirror = followed_mirror()
    market = mirror.symbols[BTC]
    market.day.seeded = True
    stream = trade_stream()
    mirror.join_trades(BTC, 0, stream)
    with pytest.raises(FeedGapError):
        mirror.apply_batch(batch(book_updates=[update(BTC, 7)]))
    # The follower asks again with no position for the forgotten book: the group sends a
    # snapshot and trades after the snapshot's; trades 4..6 will never come.
    mirror.apply_batch(
        batch(
            snapshots=[snapshot(BTC, 9, trade_sequence=6, last_trade_id=1_006)],
            trades=[trade(BTC, 7)],
        )
    )
    assert mirror.statistics.trades_lost == 3
    assert "trades 4..6" in stream.ended
    assert not market.day.seeded
    assert market.trade_id_at_start == 1_003  # the live trades started where they did
    assert [held.trade_sequence for held in market.trades] == [7]
    assert market.trades_after(3) is None


def test_a_book_stream_that_falls_behind_is_resynchronised_and_counted_once() -> None:
    mirror = followed_mirror()
    slow = book_stream(limit=1)
    mirror.join_book(BTC, 0, slow)
    for sequence in range(6, 10):
        mirror.apply_batch(batch(book_updates=[update(BTC, sequence, bids=[(90, sequence, 1)])]))
    assert slow.resync and not slow.queue
    assert mirror.statistics.resyncs == 1
    fresh = event(mirror.view_book(BTC, 0))
    assert fresh.book.book_sequence == 9


def test_leaving_drops_a_view_with_no_stream_left() -> None:
    mirror = followed_mirror()
    first, second = book_stream(), book_stream()
    mirror.join_book(BTC, 5, first)
    mirror.join_book(BTC, 5, second)
    mirror.join_trades(BTC, 0, trade_stream())
    assert mirror.subscribers() == 3
    mirror.leave_book(BTC, 5, first)
    assert 5 in mirror.symbols[BTC].views
    mirror.leave_book(BTC, 5, second)
    assert 5 not in mirror.symbols[BTC].views and 5 not in mirror.symbols[BTC].view_streams
    mirror.leave_book(BTC, 5, second)  # leaving twice is harmless
    assert mirror.subscribers() == 1


def test_a_crossed_book_is_counted() -> None:
    mirror = followed_mirror()
    mirror.apply_batch(batch(book_updates=[update(BTC, 6, bids=[(101, 1, 1)])]))
    assert mirror.statistics.crossed_books == 1


def test_after_a_gap_a_book_that_had_no_trade_yet_counts_the_trades_it_skipped() -> None:
    mirror = followed_mirror()
    with pytest.raises(FeedGapError):
        mirror.apply_batch(batch(book_updates=[update(ETH, 2)]))
    mirror.apply_batch(batch(snapshots=[snapshot(ETH, 4, trade_sequence=2, last_trade_id=7)]))
    assert mirror.statistics.trades_lost == 2
    assert mirror.symbols[ETH].trade_id_at_start == 0  # its live trades started before any
    # A first snapshot of a book never followed loses nothing: the trades before it are
    # the fills' (the day's seed).
    fresh = MarketMirror([BTC], 10)
    fresh.apply_batch(batch(snapshots=[snapshot(BTC, 4, trade_sequence=9, last_trade_id=9)]))
    assert fresh.statistics.trades_lost == 0


# (already-sent trades sent again, trades skipped, new trades) per batch: a reconnect
# resends what the service held; a jump skips what the matcher no longer held.
trade_batches = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 0, 1, 4]), st.integers(0, 4)),
    max_size=30,
)


@given(trade_batches)
def test_every_trade_reaches_a_stream_once_in_sequence_until_trades_are_lost(
    batches: list[tuple[int, int, int]],
) -> None:
    mirror = followed_mirror(retained_trades=8)
    market = mirror.symbols[BTC]
    stream = trade_stream(limit=1_000)
    mirror.join_trades(BTC, 0, stream)
    received: list[int] = []
    sent = 3  # the snapshot's trade_sequence
    lost = 0
    taken: list[int] = []  # every trade the mirror took, in order
    first_jump_at: int | None = None
    for resend, jump, new in batches:
        again = list(range(max(4, sent - resend + 1), sent + 1))
        fresh = list(range(sent + 1 + jump, sent + 1 + jump + new))
        if fresh:
            if jump:
                lost += jump
                if first_jump_at is None:
                    first_jump_at = fresh[0]
            sent = fresh[-1]
            taken.extend(fresh)
        mirror.apply_batch(batch(trades=[trade(BTC, sequence) for sequence in again + fresh]))
        while stream.queue:
            received.extend(trade_sequences(stream.queue.popleft()))
    assert mirror.statistics.trades_lost == lost
    assert mirror.statistics.trades == len(taken)
    assert market.book.trade_sequence == sent
    assert market.day.figures(1_000 * sent).trades == len(taken)
    # The stream got each trade once, in sequence, up to the first loss; then it ended.
    before_loss = [s for s in taken if first_jump_at is None or s < first_jump_at]
    assert received == before_loss
    assert bool(stream.ended) == (first_jump_at is not None)
    # The trades held are the newest since the last loss, consecutive.
    held = [held.trade_sequence for held in market.trades]
    assert held == list(range(sent - len(held) + 1, sent + 1))


def test_a_stream_behind_sends_the_diffs_waiting_as_one_merged_diff_shared_with_its_peers() -> None:
    mirror = followed_mirror()
    behind = [book_stream(), book_stream()]
    locals_ = [LocalBook(BTC), LocalBook(BTC)]
    for stream, local in zip(behind, locals_, strict=True):
        local.apply(event(mirror.join_book(BTC, 0, stream)))
    for sequence, bids, asks in [
        (6, [(99, 2, 1)], []),
        (7, [(99, 0, 0)], [(102, 4, 2)]),
        (8, [(100, 9, 3)], [(101, 0, 0)]),
    ]:
        mirror.apply_batch(batch(book_updates=[update(BTC, sequence, bids=bids, asks=asks)]))
    assert all(len(stream.queue) == 3 for stream in behind)
    serialized = mirror.statistics.messages_serialized
    sent = [mirror.coalesce_diffs(BTC, 0, stream.take_all()) for stream in behind]
    # Merged once, serialized once: both streams send the very same bytes.
    assert sent[0] is sent[1]
    assert mirror.statistics.diffs_merged == 1
    assert mirror.statistics.messages_coalesced == 4
    assert mirror.statistics.messages_serialized == serialized
    diff = event(sent[0]).diff
    assert (diff.previous_book_sequence, diff.book_sequence) == (5, 8)
    assert (diff.first_consensus_time_ms, diff.consensus_time_ms) == (6_000, 8_000)
    book = mirror.symbols[BTC].book
    for local in locals_:
        local.apply(event(sent[0]))
        assert local.levels() == (book.bids.best(0), book.asks.best(0))
        assert local.book_sequence == 8
    # One diff waiting is sent as it was offered.
    mirror.apply_batch(batch(book_updates=[update(BTC, 9, bids=[(98, 1, 1)])]))
    waiting = behind[0].take_all()
    assert mirror.coalesce_diffs(BTC, 0, waiting) is waiting[0].data


def test_a_trade_stream_behind_sends_the_trades_waiting_as_one_message() -> None:
    mirror = followed_mirror()
    stream = trade_stream()
    mirror.join_trades(BTC, 0, stream)
    for first in (4, 6, 8):
        mirror.apply_batch(batch(trades=[trade(BTC, s) for s in range(first, first + 2)]))
    messages = stream.take_all()
    assert len(messages) == 3
    joined = market_data_pb2.MarketTrades.FromString(mirror.coalesce_trades(messages))
    assert joined.symbol == BTC
    assert [held.trade_sequence for held in joined.trades] == [4, 5, 6, 7, 8, 9]
    assert mirror.statistics.messages_coalesced == 2
