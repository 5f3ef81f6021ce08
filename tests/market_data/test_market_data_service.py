"""`oms marketdata` on real processes: a mesh (shard, matchers g1 and g2, bridge,
persister, reconciler, gateway, PostgreSQL), one replica per group, and the service
following its matchers.

What a client of the service sees is compared with the truth: the matcher's own book
(`GetBookSnapshot`, durable state) at the same book sequence, and the taker fills the
persister wrote to PostgreSQL. Orders go in through the gateway as a user's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import pytest
import pytest_asyncio
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from gateway.client import AdminClient, GatewayCallError, LocalBook, MarketDataClient, OmsClient
from gateway.market_data_client import book_levels
from protos.oms.v1 import market_data_pb2, matcher_pb2
from services.markets.catalog import load_catalog
from tests.gateway.accounts import Account
from tests.market_data.conftest import MarketMesh
from tests.market_data.market_data_process import MarketDataProcess
from tests.market_data.market_flow import (
    BTC,
    BTC_PRICE,
    ETH,
    GROUP_OF,
    SOL,
    BookWatch,
    C,
    Fill,
    FlowOrder,
    TradeWatch,
    all_taker_fills,
    closing,
    matcher_book,
    next_message,
    open_traders,
    place_flow,
    service_counters,
    settle,
    snapshot_levels,
    status_name,
    taker_fills,
    until,
    wait_streams,
)

M = market_data_pb2
TRADING = M.MARKET_STATUS_TRADING
HALTED = M.MARKET_STATUS_HALTED
ETH_PRICE = 350_000  # ETH-USDT's reference price; 3 lots clear its minimum notional
# A channel that reads ahead at most ~1 KiB per stream (no BDP growth): a stream the test
# stops reading stalls the service's writes after a few dozen small messages, as a slow
# client on a slow link would.
SLOW_READER_OPTIONS = (("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0))
tags = itertools.count(1)

# The longest a slow stream's read-back may take (a bound instead of a hang).
STREAM_WAIT_S = 120.0


def next_tag(prefix: str) -> str:
    return f"{prefix}{next(tags)}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def traders(market_mesh: MarketMesh) -> list[Account]:
    """Three users funded in every asset, shared by the module's order flows."""
    async with market_mesh.mesh.admin() as admin:
        return await open_traders(admin, 3)


@contextlib.asynccontextmanager
async def trader_clients(
    market_mesh: MarketMesh, traders: Sequence[Account]
) -> AsyncIterator[list[OmsClient]]:
    clients = [trader.client(market_mesh.mesh.gateway.address) for trader in traders]
    try:
        yield clients
    finally:
        for client in clients:
            await client.close()


def matcher_address(market_mesh: MarketMesh, symbol: str) -> str:
    return market_mesh.mesh.matchers[GROUP_OF[symbol]].address


def crossing_pairs(count: int, quantity_lots: int = 1) -> list[FlowOrder]:
    """`count` trades for sure: a resting sell, then a market buy that takes it."""
    flow: list[FlowOrder] = []
    for index in range(count):
        flow.append(FlowOrder(index % 3, C.SIDE_SELL, False, index % 5, quantity_lots))
        flow.append(FlowOrder((index + 1) % 3, C.SIDE_BUY, True, 0, quantity_lots))
    return flow


async def book_equals_matcher(
    market: MarketDataClient, watches: Sequence[BookWatch], matcher: str, symbol: str
) -> matcher_pb2.BookSnapshot:
    """Every watch, GetOrderBook at each watch's depth and the instrument's status equal
    the matcher's book, at the matcher's sequence; the snapshot compared with."""
    snapshot = await matcher_book(matcher, symbol)
    for watch in watches:
        book = await watch.at_sequence(snapshot.book_sequence)
        truth = await matcher_book(matcher, symbol, watch.depth)
        assert truth.book_sequence == snapshot.book_sequence  # nothing else trades meanwhile
        assert book.levels(watch.depth) == snapshot_levels(truth), f"depth {watch.depth}"
        assert book.levels() == book.levels(watch.depth)  # it keeps no level past its depth
        assert book.status == int(snapshot.status), status_name(book.status)
        served = await served_book(market, symbol, watch.depth, snapshot.book_sequence)
        assert book_levels(served) == snapshot_levels(truth)
        assert (int(served.status), served.trade_sequence) == (
            int(snapshot.status),
            snapshot.trade_sequence,
        )
    (instrument,) = [i for i in await market.instruments() if i.symbol == symbol]
    assert instrument.status == int(snapshot.status)
    return snapshot


async def served_book(
    market: MarketDataClient, symbol: str, depth: int, sequence: int
) -> market_data_pb2.OrderBook:
    """GetOrderBook once the service's book stands at `sequence`."""

    async def probe() -> market_data_pb2.OrderBook:
        return await market.order_book(symbol, depth)

    return await until(
        probe,
        lambda answer: answer.book_sequence == sequence,
        f"GetOrderBook at sequence {sequence}",
    )


async def halt_and_resume_mark(
    admin: AdminClient,
    market: MarketDataClient,
    watches: Sequence[BookWatch],
    matcher: str,
    symbol: str,
) -> None:
    """Halt then resume `symbol`: a change of status reaches every depth's stream, so each
    then stands exactly at the matcher's sequence (a depth-limited stream skips updates
    that change nothing within its depth). Each state is compared with the matcher's."""
    for command, status in ((admin.halt_symbol, HALTED), (admin.resume_symbol, TRADING)):
        ack = await command(symbol)
        assert ack.accepted, ack  # durable in the matcher's log
        snapshot = await book_equals_matcher(market, watches, matcher, symbol)
        assert int(snapshot.status) == status, status_name(snapshot.status)


async def test_instruments_list_the_catalog(market_mesh: MarketMesh) -> None:
    catalog = load_catalog(None).by_symbol()
    async with MarketDataClient(market_mesh.market_data.address) as market:
        instruments = await until(
            market.instruments,
            lambda listed: all(i.status == TRADING for i in listed),
            "every instrument read from its matcher group",
        )
    assert [i.symbol for i in instruments] == sorted(catalog)
    for instrument in instruments:
        rules = catalog[instrument.symbol]
        assert (
            instrument.base_asset,
            instrument.quote_asset,
            instrument.lot_size,
            instrument.tick_size,
            instrument.min_notional,
            instrument.price_band_bps,
            instrument.reference_price_ticks,
            instrument.maker_fee_ppm,
            instrument.taker_fee_ppm,
        ) == (
            rules.base_asset,
            rules.quote_asset,
            rules.lot_size,
            rules.tick_size,
            rules.min_notional,
            rules.price_band_bps,
            rules.reference_price_ticks,
            rules.maker_fee_ppm,
            rules.taker_fee_ppm,
        )


async def refusal_of(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(GatewayCallError) as refused:
        await call
    return refused.value.code, refused.value.detail


async def test_bad_requests_are_refused(market_mesh: MarketMesh) -> None:
    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    async with MarketDataClient(market_mesh.market_data.address) as market:
        refusals: dict[str, tuple[Callable[[], Awaitable[object]], grpc.StatusCode]] = {
            "book of an unknown symbol": (lambda: market.order_book("DOGE-USDT"), not_found),
            "book too deep": (lambda: market.order_book(BTC, 5_001), invalid),
            "stream of an unknown symbol": (
                lambda: next_message(market.book_events("DOGE-USDT", 0)),
                not_found,
            ),
            "stream depth not offered": (
                lambda: next_message(market.book_events(BTC, 3)),
                invalid,
            ),
            "trades of an unknown symbol": (
                lambda: next_message(market.trades("DOGE-USDT", 0)),
                not_found,
            ),
            "ticker of an unknown symbol": (
                lambda: market.tickers([BTC, "DOGE-USDT"]),
                not_found,
            ),
            "candles without interval": (lambda: market.candles(BTC, 0), invalid),
            "too many candles": (lambda: market.candles(BTC, limit=1_001), invalid),
            "candles ending before they start": (
                lambda: market.candles(BTC, from_ms=2_000, to_ms=1_000),
                invalid,
            ),
        }
        for what, (call, code) in refusals.items():
            refused, detail = await refusal_of(call())
            assert refused == code, f"{what}: {refused.name} {detail}"


flow_orders = st.builds(
    FlowOrder,
    trader=st.integers(0, 2),
    side=st.sampled_from([C.SIDE_BUY, C.SIDE_SELL]),
    market=st.sampled_from([False, False, False, True]),  # mostly limits: a book to take
    # Thirteen prices: the book outgrows depth 5 (its resting orders stay between examples).
    price_offset=st.integers(-6, 6).map(lambda step: step * 5),
    quantity_lots=st.integers(1, 4),
)


# No shrinking: each example costs seconds of real processes; the failing one is printed.
@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(flow=st.lists(flow_orders, min_size=3, max_size=24))
async def test_streamed_books_and_trades_equal_the_matcher_and_the_fills(
    market_mesh: MarketMesh, traders: list[Account], flow: list[FlowOrder]
) -> None:
    """Random order flow: books kept from StreamOrderBook at depths 0 and 5 equal the
    matcher's book at its sequence (never crossed, never out of sync); the trades on
    StreamTrades are the taker fills in PostgreSQL, one for one, with no gap."""
    mesh = market_mesh.mesh
    address = market_mesh.market_data.address
    matcher = matcher_address(market_mesh, BTC)
    before = await matcher_book(matcher, BTC)
    async with (
        MarketDataClient(address) as market,
        mesh.admin() as admin,
        trader_clients(market_mesh, traders) as clients,
    ):
        watches = [BookWatch(BTC, 0).start(market), BookWatch(BTC, 5).start(market)]
        trades = TradeWatch(BTC, from_trade_sequence=0).start(market)
        try:
            await wait_streams(address, 3)  # all three registered before the first order
            placed = await place_flow(
                clients, flow, symbol=BTC, base_price=BTC_PRICE, tag=next_tag("flow")
            )
            await settle(placed)
            settled = await matcher_book(matcher, BTC)
            await halt_and_resume_mark(admin, market, watches, matcher, BTC)

            await trades.through(settled.trade_sequence, after=before.trade_sequence)
            sequences = [trade.trade_sequence for trade in trades.trades]
            assert sequences == list(range(before.trade_sequence + 1, settled.trade_sequence + 1))
            event("the flow traded" if sequences else "the flow did not trade")
            seen = [(t.trade_id, t.price_ticks, t.quantity_lots) for t in trades.trades]
            fills = await until(
                lambda: taker_fills(mesh.database_url, BTC, before.last_trade_id),
                lambda rows: len(rows) >= len(seen),
                "the persister writing the flow's fills",
            )
            assert fills == seen
            for watch in watches:
                watch.healthy()
        finally:
            for watch in watches:
                await watch.close()
            await trades.close()


async def test_halt_and_resume_show_on_the_stream_and_in_the_instruments(
    market_mesh: MarketMesh, admin: AdminClient
) -> None:
    matcher = matcher_address(market_mesh, SOL)
    async with MarketDataClient(market_mesh.market_data.address) as market:
        watch = BookWatch(SOL, 0).start(market)
        try:
            ack = await admin.halt_symbol(SOL)
            assert ack.accepted, ack
            halted = await book_equals_matcher(market, [watch], matcher, SOL)
            assert int(halted.status) == HALTED
            (ticker,) = await market.tickers([SOL])
            assert ticker.status == HALTED
            ack = await admin.resume_symbol(SOL)
            assert ack.accepted, ack
            resumed = await book_equals_matcher(market, [watch], matcher, SOL)
            assert int(resumed.status) == TRADING
            assert resumed.book_sequence == halted.book_sequence + 1
            watch.healthy()
        finally:
            await watch.close()


async def test_a_slow_book_stream_resyncs_and_a_slow_trade_stream_ends_then_resumes(
    market_mesh: MarketMesh,
    traders: list[Account],
    market_data_factory: Callable[..., MarketDataProcess],
) -> None:
    """With a queue of 5 messages: a book stream not read while orders flow is later sent
    a fresh book, then diffs that chain; a trade stream not read ends RESOURCE_EXHAUSTED,
    and resuming from the last trade it gave brings the rest, with no gap."""
    slow = market_data_factory("slow", OMS_MARKETDATA_QUEUE_MESSAGES="5")
    matcher = matcher_address(market_mesh, BTC)
    before = await matcher_book(matcher, BTC)
    channel = grpc.aio.insecure_channel(slow.address, options=SLOW_READER_OPTIONS)
    async with (
        MarketDataClient(slow.address, channel=channel) as market,
        trader_clients(market_mesh, traders) as clients,
        closing(market.book_events(BTC, 0)) as book_events,
        closing(market.trades(BTC, from_trade_sequence=0)) as trade_messages,
    ):
        book = LocalBook(BTC)
        book.apply(await next_message(book_events))  # the first book, then nothing read
        # One message of trades is read (by a task: none comes before the flow), then none.
        first_trades = asyncio.create_task(next_message(trade_messages))
        try:
            await wait_streams(slow.address, 2)
            # Trades in rounds until both streams fell behind: how many messages that
            # takes depends on how the bridge batches orders into matcher entries (one
            # message per entry), which a busy machine changes.
            pairs = 0
            while True:
                placed = await place_flow(
                    clients,
                    crossing_pairs(20),
                    symbol=BTC,
                    base_price=BTC_PRICE,
                    tag=next_tag("slow"),
                )
                await settle(placed)
                pairs += 20
                counters = await service_counters(slow.address)
                if counters["feed_resyncs"] >= 1 and counters["feed_streams_ended_behind"] >= 1:
                    break
                assert pairs < 400, f"no stream fell behind after {pairs} trades: {counters}"
            received = list((await first_trades).trades)
        finally:
            first_trades.cancel()
        settled = await matcher_book(matcher, BTC)
        assert counters["feed_gaps"] == 0

        # The book: the diffs sent before it fell behind, a fresh book, then diffs.
        async with asyncio.timeout(STREAM_WAIT_S):
            async for event in book_events:
                book.apply(event)  # BookOutOfSyncError if a diff did not chain
                assert not book.crossed(), book
                if book.book_sequence >= settled.book_sequence:
                    break
        assert book.resyncs >= 1
        assert (book.levels(), book.status) == (snapshot_levels(settled), settled.status)
        more = await place_flow(
            clients, crossing_pairs(2), symbol=BTC, base_price=BTC_PRICE, tag=next_tag("more")
        )
        await settle(more)
        after = await matcher_book(matcher, BTC)
        resyncs = book.resyncs
        async with asyncio.timeout(STREAM_WAIT_S):
            async for event in book_events:
                assert event.HasField("diff"), "a diff after the fresh book, not another book"
                book.apply(event)
                if book.book_sequence >= after.book_sequence:
                    break
        assert book.resyncs == resyncs
        assert book.levels() == snapshot_levels(after)

        # The trades: those sent before it fell behind, then RESOURCE_EXHAUSTED.
        with pytest.raises(GatewayCallError) as ended:
            async with asyncio.timeout(STREAM_WAIT_S):
                async for message in trade_messages:
                    received.extend(message.trades)
        assert ended.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value
        last = received[-1].trade_sequence
        assert last < settled.trade_sequence  # it did fall behind
        async with closing(market.trades(BTC, from_trade_sequence=last)) as resumed:
            async with asyncio.timeout(STREAM_WAIT_S):
                async for message in resumed:
                    received.extend(message.trades)
                    if received[-1].trade_sequence >= after.trade_sequence:
                        break
    sequences = [trade.trade_sequence for trade in received]
    assert sequences == list(range(before.trade_sequence + 1, after.trade_sequence + 1))
    fills = await until(
        lambda: taker_fills(market_mesh.mesh.database_url, BTC, before.last_trade_id),
        lambda rows: len(rows) >= len(received),
        "the persister writing the fills",
    )
    assert fills == [(t.trade_id, t.price_ticks, t.quantity_lots) for t in received]


async def test_streams_per_connection_are_limited(
    market_mesh: MarketMesh, market_data_factory: Callable[..., MarketDataProcess]
) -> None:
    limited = market_data_factory("limited", OMS_MARKETDATA_STREAMS_PER_PEER="2")
    async with (
        MarketDataClient(limited.address) as one,
        MarketDataClient(limited.address) as other,  # its own channel: its own connection
    ):
        async with (
            closing(one.book_events(BTC, 0)) as first,
            closing(one.book_events(ETH, 5)) as second,
        ):
            assert (await next_message(first)).HasField("book")
            assert (await next_message(second)).HasField("book")
            for third in (one.book_events(SOL, 0), one.trades(BTC, 0)):
                with pytest.raises(GatewayCallError) as refused:
                    await next_message(third)
                assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            async with closing(other.book_events(SOL, 0)) as elsewhere:
                assert (await next_message(elsewhere)).HasField("book")
        # Once the connection's streams ended, it may open new ones.
        await wait_streams(limited.address, 0)
        async with closing(one.book_events(BTC, 1)) as again:
            assert (await next_message(again)).HasField("book")
    counters = await service_counters(limited.address)
    assert counters["refused.StreamOrderBook"] == 1
    assert counters["refused.StreamTrades"] == 1


def ticker_figures(fills: Sequence[Fill]) -> tuple[int, ...]:
    """(volume, quote volume, high, low, open, trades) of a day of these fills."""
    return (
        sum(fill.quantity_lots for fill in fills),
        sum(fill.price_ticks * fill.quantity_lots for fill in fills),
        max(fill.price_ticks for fill in fills),
        min(fill.price_ticks for fill in fills),
        fills[0].price_ticks,
        len(fills),
    )


def minute_candles(fills: Sequence[Fill]) -> list[tuple[int, ...]]:
    """The 1-minute candles these fills (in time, trade id order) make."""
    minutes: dict[int, list[Fill]] = {}
    for fill in fills:
        minutes.setdefault(fill.consensus_time_ms // 60_000 * 60_000, []).append(fill)
    return [
        (
            open_time,
            group[0].price_ticks,
            max(fill.price_ticks for fill in group),
            min(fill.price_ticks for fill in group),
            group[-1].price_ticks,
            sum(fill.quantity_lots for fill in group),
            sum(fill.price_ticks * fill.quantity_lots for fill in group),
            len(group),
        )
        for open_time, group in sorted(minutes.items())
    ]


async def day_fills(database_url: str, symbol: str, trades: int) -> list[Fill]:
    """The symbol's taker fills, once the persister wrote all `trades` of them."""
    return await until(
        lambda: all_taker_fills(database_url, symbol),
        lambda fills: len(fills) == trades,
        f"the persister writing the {trades} trades of {symbol}",
    )


def ticker_summary(ticker: market_data_pb2.Ticker) -> tuple[int, ...]:
    return (
        ticker.volume_24h_lots,
        ticker.quote_volume_24h_ticks,
        ticker.high_24h_ticks,
        ticker.low_24h_ticks,
        ticker.open_24h_ticks,
        ticker.trades_24h,
    )


async def ticker_at(
    market: MarketDataClient, symbol: str, snapshot: matcher_pb2.BookSnapshot
) -> market_data_pb2.Ticker:
    """The symbol's ticker once the service stands at the matcher's book and trades and
    the day is complete. The trade sequence is read from the service's book first: an
    entry whose trade left the levels as they were (an order rested and taken at once)
    publishes a trade and no book update, so the book sequence alone can be reached
    before that trade is in."""

    async def probe() -> tuple[market_data_pb2.OrderBook, market_data_pb2.Ticker]:
        book = await market.order_book(symbol, 1)
        (ticker,) = await market.tickers([symbol])  # after the book: at least as new
        return book, ticker

    _, ticker = await until(
        probe,
        lambda answer: (
            (answer[0].book_sequence, answer[0].trade_sequence)
            == (snapshot.book_sequence, snapshot.trade_sequence)
            and answer[1].book_sequence == snapshot.book_sequence
            and answer[1].complete_24h
        ),
        f"the {symbol} ticker at book sequence {snapshot.book_sequence} and trade sequence"
        f" {snapshot.trade_sequence}, its day complete",
    )
    return ticker


def assert_ticker_is_the_book_and_the_fills(
    ticker: market_data_pb2.Ticker, snapshot: matcher_pb2.BookSnapshot, fills: Sequence[Fill]
) -> None:
    assert ticker.status == int(snapshot.status)
    assert ticker.last_price_ticks == snapshot.last_price_ticks
    assert ticker.last_price_ticks == max(fills, key=lambda fill: fill.trade_id).price_ticks
    bids, asks = snapshot_levels(snapshot)
    assert (ticker.best_bid_ticks, ticker.best_bid_lots) == (bids[0][:2] if bids else (0, 0))
    assert (ticker.best_ask_ticks, ticker.best_ask_lots) == (asks[0][:2] if asks else (0, 0))
    assert ticker_summary(ticker) == ticker_figures(fills)


async def test_ticker_and_candles_are_what_the_trades_make(
    market_mesh: MarketMesh, traders: list[Account]
) -> None:
    mesh = market_mesh.mesh
    address = market_mesh.market_data.address
    matcher = matcher_address(market_mesh, ETH)
    flow = [
        FlowOrder(0, C.SIDE_BUY, False, -10, 3),  # stays: the best bid
        FlowOrder(1, C.SIDE_SELL, False, 30, 4),  # stays: the best ask
        *(
            order
            for index in range(6)
            for order in (
                FlowOrder(index % 3, C.SIDE_SELL, False, index % 4, 3 + index % 2),
                FlowOrder((index + 1) % 3, C.SIDE_BUY, True, 0, 3 + index % 2),
            )
        ),
    ]
    before = await matcher_book(matcher, ETH)
    async with (
        MarketDataClient(address) as market,
        trader_clients(market_mesh, traders) as clients,
    ):
        trades = TradeWatch(ETH).start(market)
        try:
            await wait_streams(address, 1)
            placed = await place_flow(
                clients, flow, symbol=ETH, base_price=ETH_PRICE, tag=next_tag("day")
            )
            await settle(placed)
            settled = await matcher_book(matcher, ETH)
            assert settled.trade_sequence >= before.trade_sequence + 6
            await trades.through(settled.trade_sequence, after=before.trade_sequence)
        finally:
            await trades.close()
        fills = await day_fills(mesh.database_url, ETH, settled.trade_sequence)
        later = [fill for fill in fills if fill.trade_id > before.last_trade_id]
        assert [(f.trade_id, f.price_ticks, f.quantity_lots) for f in later] == [
            (t.trade_id, t.price_ticks, t.quantity_lots) for t in trades.trades
        ]
        ticker = await ticker_at(market, ETH, settled)
        assert_ticker_is_the_book_and_the_fills(ticker, settled, fills)
        # The window ends at the matcher's time (the fills carry the shard's, a little later).
        assert ticker.as_of_ms >= trades.trades[-1].consensus_time_ms
        top = await market.order_book(ETH, 1)
        assert (ticker.best_bid_ticks, ticker.best_ask_ticks) == (
            top.bids[0].price_ticks,
            top.asks[0].price_ticks,
        )

        candles = await market.candles(ETH, M.CANDLE_INTERVAL_1M)
        assert [
            (
                c.open_time_ms,
                c.open_ticks,
                c.high_ticks,
                c.low_ticks,
                c.close_ticks,
                c.volume_lots,
                c.quote_volume_ticks,
                c.trades,
            )
            for c in candles.candles
        ] == minute_candles(fills)
        assert not candles.more
        (day,) = (await market.candles(ETH, M.CANDLE_INTERVAL_1D)).candles
        assert (day.volume_lots, day.trades) == ticker_figures(fills)[::5]
        assert (await market.candles(SOL, M.CANDLE_INTERVAL_1M)).candles == []


async def test_a_tickers_day_ends_at_its_groups_newest_time(
    market_mesh: MarketMesh, traders: list[Account]
) -> None:
    """A symbol's 24 hours end at the newest consensus time of its matcher group, not its
    own last update: a quiet symbol beside a busy one does not keep showing trades older
    than a day. ETH-USDT, quiet here, shares g1 with BTC-USDT, whose book changes."""
    address = market_mesh.market_data.address
    matcher = matcher_address(market_mesh, BTC)
    async with (
        MarketDataClient(address) as market,
        trader_clients(market_mesh, traders) as clients,
    ):
        # A bid far below the book: it rests, g1's newest event, a book update, no trade.
        placed = await place_flow(
            clients,
            [FlowOrder(0, C.SIDE_BUY, False, -500, 1)],
            symbol=BTC,
            base_price=BTC_PRICE,
            tag=next_tag("group"),
        )
        await settle(placed)
        snapshot = await matcher_book(matcher, BTC)
        btc = await ticker_at(market, BTC, snapshot)
        assert btc.as_of_ms == snapshot.consensus_time_ms
        eth_book = await market.order_book(ETH)
        assert eth_book.consensus_time_ms < btc.as_of_ms  # ETH-USDT is quiet since
        btc_again, eth, sol = await market.tickers([BTC, ETH, SOL])
        assert eth.as_of_ms == btc_again.as_of_ms == btc.as_of_ms
        # g2 (SOL-USDT alone, never traded here): its own group's time, its last update's.
        sol_book = await market.order_book(SOL)
        assert sol.as_of_ms == sol_book.consensus_time_ms


async def served_when_known(market: MarketDataClient, symbol: str) -> market_data_pb2.OrderBook:
    """GetOrderBook once the (restarted) service has read the symbol's book."""

    async def probe() -> market_data_pb2.OrderBook | None:
        try:
            return await market.order_book(symbol)
        except GatewayCallError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    served = await until(probe, lambda book: book is not None, f"the book of {symbol} read")
    assert served is not None
    return served


async def test_a_restarted_service_shows_the_same_books_and_its_day_from_the_fills(
    market_mesh: MarketMesh, traders: list[Account]
) -> None:
    """SIGKILLed and restarted, the service shows each book at the matcher's sequence and
    its tickers count the day's trades from before its start (read from the fills)."""
    mesh = market_mesh.mesh
    process = market_mesh.market_data
    async with trader_clients(market_mesh, traders) as clients:
        placed = await place_flow(
            clients, crossing_pairs(3), symbol=BTC, base_price=BTC_PRICE, tag=next_tag("pre")
        )
        await settle(placed)
        process.kill()
        process.start_serving()
        async with MarketDataClient(process.address) as market:
            for symbol in (BTC, ETH, SOL):
                snapshot = await matcher_book(matcher_address(market_mesh, symbol), symbol)
                served = await served_when_known(market, symbol)
                assert (served.book_sequence, served.trade_sequence) == (
                    snapshot.book_sequence,
                    snapshot.trade_sequence,
                )
                assert book_levels(served) == snapshot_levels(snapshot)
                watch = BookWatch(symbol, 0).start(market)
                try:
                    book = await watch.at_sequence(snapshot.book_sequence)
                    assert book.levels() == snapshot_levels(snapshot)
                finally:
                    await watch.close()
                ticker = await ticker_at(market, symbol, snapshot)
                if snapshot.trade_sequence == 0:
                    assert ticker_summary(ticker) == (0, 0, 0, 0, 0, 0)
                    continue
                fills = await day_fills(mesh.database_url, symbol, snapshot.trade_sequence)
                assert_ticker_is_the_book_and_the_fills(ticker, snapshot, fills)

            # Trades before the start are not held: a resume from before them is refused
            # (they are read from the fills), one from the newest goes on.
            btc = await matcher_book(matcher_address(market_mesh, BTC), BTC)
            assert btc.trade_sequence >= 2
            refused, detail = await refusal_of(next_message(market.trades(BTC, 1)))
            assert refused == grpc.StatusCode.OUT_OF_RANGE, detail
            assert f"the oldest held is {btc.trade_sequence + 1}" in detail
            resumed = TradeWatch(BTC, from_trade_sequence=btc.trade_sequence).start(market)

            # A trade after the start adds to the day read from the fills, counted once.
            placed = await place_flow(
                clients, crossing_pairs(1), symbol=BTC, base_price=BTC_PRICE, tag=next_tag("post")
            )
            await settle(placed)
            snapshot = await matcher_book(matcher_address(market_mesh, BTC), BTC)
            fills = await day_fills(mesh.database_url, BTC, snapshot.trade_sequence)
            ticker = await ticker_at(market, BTC, snapshot)
            assert_ticker_is_the_book_and_the_fills(ticker, snapshot, fills)
            try:
                await resumed.through(snapshot.trade_sequence, after=btc.trade_sequence)
                assert [trade.trade_sequence for trade in resumed.trades] == list(
                    range(btc.trade_sequence + 1, snapshot.trade_sequence + 1)
                )
            finally:
                await resumed.close()
