"""`oms.v1.MarketData`: the books, trades, tickers, candles and instruments, for any client.

The service follows every matcher group once (`MatcherFollower`) into one
`MarketMirror` and serves everything from it, so clients never reach a matcher.
Streams take their messages from a bounded queue filled by the fan-out with bytes
serialized once for all (`subscribers.py`). Each connection may hold
`streams_per_peer` streams and the service `max_streams`; past them a stream is
refused RESOURCE_EXHAUSTED. When market data is not public every call is signed
as at the gateway and needs a key with the READ scope (or the admin key).
Candles, and the tickers' day before the service started, come from the fills in
PostgreSQL through a persister.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from bridge.backoff import Backoff
from gateway.authentication import Authenticator
from gateway.core.refusals import GatewayError
from gateway.credentials import READ, CredentialDirectory
from gateway.persister_client import PersisterClient
from gateway.signing import REASON_TRAILER
from protos.oms.v1 import gateway_pb2, market_data_pb2, persister_pb2
from services.clients.matcher_directory import MatcherDirectory
from services.coordination.addresses import address_source
from services.market_data.book_mirror import UNKNOWN
from services.market_data.depth_view import STREAM_DEPTHS
from services.market_data.market_mirror import BookStream, MarketMirror, TradeStream
from services.market_data.matcher_follower import MatcherFollower
from services.market_data.settings import MarketDataSettings
from services.market_data.subscribers import Overflow, Subscriber
from services.market_data.ticker import DAY_MINUTES, MINUTE_MS, MinuteBucket
from services.markets.catalog import MarketCatalog
from services.serving.service_host import ServicePlan

log = structlog.get_logger(__name__)
SERVICE_NAME = "oms.v1.MarketData"
MAX_BOOK_DEPTH = 5_000
TRADES_PER_MESSAGE = 1_000
# A trade stream that fell behind sends what waits as one message up to this size (a
# book stream's merged diff is never larger than its view).
WRITE_BUDGET_BYTES = 256 * 1024
DEFAULT_CANDLES = 500
MAX_CANDLES = 1_000
SEED_RETRY_S = 1.0
CANDLE_WIDTHS_MS = {
    market_data_pb2.CANDLE_INTERVAL_1M: 60_000,
    market_data_pb2.CANDLE_INTERVAL_5M: 300_000,
    market_data_pb2.CANDLE_INTERVAL_15M: 900_000,
    market_data_pb2.CANDLE_INTERVAL_1H: 3_600_000,
    market_data_pb2.CANDLE_INTERVAL_4H: 14_400_000,
    market_data_pb2.CANDLE_INTERVAL_1D: 86_400_000,
}
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
RequestT = TypeVar("RequestT", bound=Message)


class Refusal(Exception):
    """A call refused with a status code (and, for access refusals, a reason)."""

    def __init__(self, code: grpc.StatusCode, detail: str, reason: str = "") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.reason = reason


class MarketDataService:
    def __init__(self, settings: MarketDataSettings, catalog: MarketCatalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self.markets = catalog.by_symbol()
        # A symbol's 24 hours end at its matcher group's newest consensus time (the
        # ticker's contract), not at its own last update: a quiet symbol beside a busy
        # one must not keep showing trades older than a day.
        self.group_symbols = {
            symbol: tuple(other.symbol for other in catalog.group(market.matcher_group))
            for symbol, market in self.markets.items()
        }
        self.mirror = MarketMirror(sorted(self.markets), settings.retained_trades)
        directory = MatcherDirectory.parse(settings.matchers, catalog)
        sources = directory.sources(settings.etcd_endpoints, settings.mesh_id)
        self.followers = [
            MatcherFollower(
                group,
                sorted(market.symbol for market in catalog.group(group)),
                source,
                self.mirror,
                Backoff(settings.backoff_initial_ms, settings.backoff_max_ms),
            )
            for group, source in sources.items()
        ]
        self.persister = PersisterClient(
            address_source(
                settings.persister,
                kind="persister",
                name=settings.persister_shard,
                etcd_endpoints=settings.etcd_endpoints,
                mesh_id=settings.mesh_id,
            ),
            timeout_s=settings.persister_timeout_ms / 1000,
        )
        self.authenticator: Authenticator | None = None
        if not settings.public:
            self.authenticator = Authenticator(
                CredentialDirectory(
                    self.persister, admin=None, capacity=10_000, ttl_s=10.0, unknown_ttl_s=1.0
                ),
                timestamp_window_ms=settings.timestamp_window_ms,
            )
        self.streams_by_peer: dict[str, int] = {}
        self.streams = 0
        self.refused: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    # --- access and limits ------------------------------------------------------------

    async def _admit(self, method: str, context: Context, request: Message) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.authenticator is None:
            return
        try:
            holder = await self.authenticator.authenticate(
                f"/{SERVICE_NAME}/{method}", context.invocation_metadata() or (), request
            )
        except GatewayError as error:
            raise Refusal(grpc.StatusCode[error.status], error.detail, error.reason_name) from error
        if not holder.admin and READ not in holder.scopes:
            raise Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"api key {holder.api_key} lacks the READ scope market data needs",
                gateway_pb2.GatewayErrorReason.Name(
                    gateway_pb2.GATEWAY_ERROR_REASON_SCOPE_REQUIRED
                ),
            )

    @contextlib.contextmanager
    def _stream_slot(self, peer: str) -> Any:
        settings = self.settings
        if self.streams >= settings.max_streams:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the service holds {self.streams} streams, its limit",
            )
        held = self.streams_by_peer.get(peer, 0)
        if held >= settings.streams_per_peer:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this connection holds {held} streams, the limit per connection",
            )
        self.streams += 1
        self.streams_by_peer[peer] = held + 1
        try:
            yield
        finally:
            self.streams -= 1
            left = self.streams_by_peer[peer] - 1
            if left:
                self.streams_by_peer[peer] = left
            else:
                del self.streams_by_peer[peer]

    def _symbol(self, symbol: str) -> None:
        if symbol not in self.markets:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"no instrument {symbol!r}")

    def _known_book(self, symbol: str) -> None:
        self._symbol(symbol)
        if not self.mirror.symbols[symbol].book.known:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE,
                f"the book of {symbol} is not read from its matcher group yet",
            )

    def _as_of(self, symbol: str) -> int:
        """The newest consensus time seen from the symbol's matcher group (0: none yet)."""
        seen = self.mirror.as_of_ms
        return max(seen.get(other, 0) for other in self.group_symbols[symbol])

    def _count_refusal(self, method: str) -> None:
        self.refused[method] = self.refused.get(method, 0) + 1

    # --- calls ------------------------------------------------------------------------

    async def list_instruments(
        self, request: market_data_pb2.ListInstrumentsRequest, context: Context
    ) -> market_data_pb2.InstrumentList:
        answer = market_data_pb2.InstrumentList()
        for symbol, market in sorted(self.markets.items()):
            answer.instruments.add(
                symbol=symbol,
                base_asset=market.base_asset,
                quote_asset=market.quote_asset,
                lot_size=market.lot_size,
                tick_size=market.tick_size,
                min_notional=market.min_notional,
                price_band_bps=market.price_band_bps,
                reference_price_ticks=market.reference_price_ticks,
                maker_fee_ppm=market.maker_fee_ppm,
                taker_fee_ppm=market.taker_fee_ppm,
                status=self.mirror.symbols[symbol].book.status,
            )
        return answer

    async def get_order_book(
        self, request: market_data_pb2.OrderBookRequest, context: Context
    ) -> market_data_pb2.OrderBook:
        if request.depth > MAX_BOOK_DEPTH:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"depth must be 0..{MAX_BOOK_DEPTH}")
        self._known_book(request.symbol)
        return self.mirror.symbols[request.symbol].book.order_book(request.depth)

    async def stream_order_book(
        self, request: market_data_pb2.OrderBookRequest, context: Context
    ) -> AsyncIterator[bytes]:
        symbol, depth = request.symbol, request.depth
        if depth not in STREAM_DEPTHS:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"depth must be one of {', '.join(map(str, sorted(STREAM_DEPTHS)))}",
            )
        self._known_book(symbol)
        mirror = self.mirror
        subscriber: BookStream = Subscriber(
            context.peer(), self.settings.queue_messages, Overflow.RESYNC
        )
        with self._stream_slot(subscriber.peer):
            first = mirror.join_book(symbol, depth, subscriber)
            try:
                yield first
                while True:
                    await subscriber.next_ready()
                    if subscriber.resync:
                        subscriber.resync = False
                        subscriber.queue.clear()
                        yield mirror.view_book(symbol, depth)
                        continue
                    # Everything waiting, as one diff: one write, however far behind.
                    waiting = subscriber.take_all()
                    yield mirror.coalesce_diffs(symbol, depth, waiting)
            finally:
                mirror.leave_book(symbol, depth, subscriber)

    async def stream_trades(
        self, request: market_data_pb2.StreamTradesRequest, context: Context
    ) -> AsyncIterator[bytes]:
        symbol = request.symbol
        self._known_book(symbol)
        mirror = self.mirror
        subscriber: TradeStream = Subscriber(
            context.peer(), self.settings.queue_messages, Overflow.END
        )
        with self._stream_slot(subscriber.peer):
            backlog = mirror.join_trades(
                symbol, request.from_trade_sequence, subscriber, request.recent
            )
            if backlog is None:
                held = mirror.symbols[symbol].trades
                oldest = (
                    held[0].trade_sequence
                    if held
                    else mirror.symbols[symbol].book.trade_sequence + 1
                )
                raise Refusal(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"trades of {symbol} after {request.from_trade_sequence} are no longer"
                    f" held; the oldest held is {oldest}: read older ones from the fills",
                )
            try:
                for start in range(0, len(backlog), TRADES_PER_MESSAGE):
                    chunk = backlog[start : start + TRADES_PER_MESSAGE]
                    yield market_data_pb2.MarketTrades(
                        symbol=symbol, trades=chunk
                    ).SerializeToString()
                while True:
                    await subscriber.next_ready()
                    while subscriber.queue:
                        waiting = subscriber.take(WRITE_BUDGET_BYTES, len)
                        yield mirror.coalesce_trades(waiting)
                    if subscriber.ended:
                        raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, subscriber.ended)
            finally:
                mirror.leave_trades(symbol, subscriber)

    async def get_ticker(
        self, request: market_data_pb2.GetTickerRequest, context: Context
    ) -> market_data_pb2.Tickers:
        symbols = list(request.symbols) or sorted(self.markets)
        for symbol in symbols:
            self._symbol(symbol)
        answer = market_data_pb2.Tickers()
        for symbol in symbols:
            market = self.mirror.symbols[symbol]
            book = market.book
            ticker = answer.tickers.add(symbol=symbol, status=book.status)
            if book.status == UNKNOWN:
                continue
            as_of = self._as_of(symbol)
            day = market.day.figures(as_of)
            bid, ask = book.bids.top(), book.asks.top()
            ticker.last_price_ticks = book.last_price_ticks
            if bid is not None:
                ticker.best_bid_ticks, ticker.best_bid_lots = bid[0], bid[1]
            if ask is not None:
                ticker.best_ask_ticks, ticker.best_ask_lots = ask[0], ask[1]
            ticker.volume_24h_lots = day.volume_lots
            ticker.quote_volume_24h_ticks = day.quote_volume_ticks
            ticker.high_24h_ticks = day.high_ticks
            ticker.low_24h_ticks = day.low_ticks
            ticker.open_24h_ticks = day.open_ticks
            ticker.trades_24h = day.trades
            ticker.as_of_ms = as_of
            ticker.book_sequence = book.book_sequence
            ticker.complete_24h = market.day.seeded
        return answer

    async def get_candles(
        self, request: market_data_pb2.GetCandlesRequest, context: Context
    ) -> market_data_pb2.Candles:
        self._symbol(request.symbol)
        width = CANDLE_WIDTHS_MS.get(request.interval)
        if width is None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "interval is required")
        limit = request.limit or DEFAULT_CANDLES
        if limit > MAX_CANDLES:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be 1..{MAX_CANDLES}")
        if request.to_ms and request.to_ms <= request.from_ms:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "to_ms must be after from_ms")
        start = -(-request.from_ms // width) * width  # the first open time at or after
        query = persister_pb2.CandleQuery(
            symbol=request.symbol,
            interval_ms=width,
            from_ms=start,
            to_ms=request.to_ms,
            limit=limit,
        )
        try:
            page = await self.persister.candles(query)
        except GatewayError as error:
            raise Refusal(grpc.StatusCode[error.status], error.detail) from error
        return market_data_pb2.Candles(
            symbol=request.symbol,
            interval=request.interval,
            candles=page.candles,
            more=page.more,
        )

    # --- the tickers' day before the start ----------------------------------------------

    async def seed_days(self) -> None:
        """Once a symbol's first book is read, its day's earlier trades come from the
        fills: those up to the book's last trade id, once the persister holds them."""
        pending = set(self.markets)
        first_trade_ids: dict[str, int] = {}
        while pending:
            for symbol in sorted(pending):
                market = self.mirror.symbols[symbol]
                if not market.book.known:
                    continue
                first = first_trade_ids.setdefault(symbol, market.trade_id_at_start)
                if first == 0:
                    market.day.seeded = True
                    pending.discard(symbol)
                    continue
                as_of = self._as_of(symbol)
                query = persister_pb2.CandleQuery(
                    symbol=symbol,
                    interval_ms=MINUTE_MS,
                    from_ms=max(0, (as_of // MINUTE_MS - (DAY_MINUTES - 1)) * MINUTE_MS),
                    limit=DAY_MINUTES + 1,
                    max_trade_id=first,
                )
                try:
                    page = await self.persister.candles(query)
                except GatewayError as error:
                    log.info("marketdata.day_unread", symbol=symbol, error=error.detail)
                    continue
                if page.stored_max_trade_id < first or page.stored_trades < market.trades_at_start:
                    continue  # the persisters have not written them all yet
                market.day.seed(
                    [
                        (
                            candle.open_time_ms,
                            MinuteBucket(
                                candle.open_ticks,
                                candle.high_ticks,
                                candle.low_ticks,
                                candle.close_ticks,
                                candle.volume_lots,
                                candle.quote_volume_ticks,
                                candle.trades,
                            ),
                        )
                        for candle in page.candles
                    ]
                )
                pending.discard(symbol)
            if pending:
                await asyncio.sleep(SEED_RETRY_S)  # polls the persister while it writes
        await asyncio.Event().wait()  # done: a service's loops run until it stops

    # --- wiring -----------------------------------------------------------------------

    def _unary(
        self, method: str, inner: Callable[[RequestT, Context], Awaitable[Message]]
    ) -> Callable[[RequestT, Context], Awaitable[Message]]:
        async def behaviour(request: RequestT, context: Context) -> Message:
            try:
                await self._admit(method, context, request)
                return await inner(request, context)
            except Refusal as refusal:
                self._count_refusal(method)
                await _abort(context, refusal)
                raise AssertionError("abort raises") from refusal

        return behaviour

    def _streaming(
        self, method: str, inner: Callable[[RequestT, Context], AsyncIterator[bytes]]
    ) -> Callable[[RequestT, Context], AsyncIterator[bytes]]:
        async def behaviour(request: RequestT, context: Context) -> AsyncIterator[bytes]:
            try:
                await self._admit(method, context, request)
                async for message in inner(request, context):
                    yield message
            except Refusal as refusal:
                self._count_refusal(method)
                await _abort(context, refusal)

        return behaviour

    def register(self, server: grpc.aio.Server) -> None:
        M = market_data_pb2
        unary = grpc.unary_unary_rpc_method_handler
        handlers = {
            "ListInstruments": unary(
                self._unary("ListInstruments", self.list_instruments),
                request_deserializer=M.ListInstrumentsRequest.FromString,
                response_serializer=M.InstrumentList.SerializeToString,
            ),
            "GetOrderBook": unary(
                self._unary("GetOrderBook", self.get_order_book),
                request_deserializer=M.OrderBookRequest.FromString,
                response_serializer=M.OrderBook.SerializeToString,
            ),
            "StreamOrderBook": grpc.unary_stream_rpc_method_handler(
                self._streaming("StreamOrderBook", self.stream_order_book),
                request_deserializer=M.OrderBookRequest.FromString,
                response_serializer=None,  # serialized once, by the fan-out
            ),
            "StreamTrades": grpc.unary_stream_rpc_method_handler(
                self._streaming("StreamTrades", self.stream_trades),
                request_deserializer=M.StreamTradesRequest.FromString,
                response_serializer=None,
            ),
            "GetTicker": unary(
                self._unary("GetTicker", self.get_ticker),
                request_deserializer=M.GetTickerRequest.FromString,
                response_serializer=M.Tickers.SerializeToString,
            ),
            "GetCandles": unary(
                self._unary("GetCandles", self.get_candles),
                request_deserializer=M.GetCandlesRequest.FromString,
                response_serializer=M.Candles.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )

    def status(self) -> tuple[dict[str, int], dict[str, str]]:
        """Status numbers: `feed_<name>` (`FeedStatistics`), the streams and queues, and
        per matcher group and per call keyed families (metrics: one per family, `key`)."""
        numbers = {f"feed_{name}": value for name, value in asdict(self.mirror.statistics).items()}
        numbers["streams"] = self.streams  # book and trade streams open now
        numbers["connections_with_streams"] = len(self.streams_by_peer)  # peers streaming
        numbers["symbols"] = len(self.mirror.symbols)  # every instrument of the catalog
        # Symbols whose book the service holds (the others are UNKNOWN to clients).
        numbers["symbols_known"] = sum(market.book.known for market in self.mirror.symbols.values())
        # Messages waiting in every stream's queue, all streams together.
        numbers["queued_messages"] = sum(
            sum(len(stream.queue) for streams in market.view_streams.values() for stream in streams)
            + sum(len(stream.queue) for stream in market.trade_streams)
            for market in self.mirror.symbols.values()
        )
        for follower in self.followers:
            numbers[f"matcher_connected.{follower.group}"] = int(follower.connected)
            numbers[f"matcher_breaks.{follower.group}"] = follower.breaks
        for method, count in self.calls.items():
            numbers[f"calls.{method}"] = count
        for method, count in self.refused.items():
            numbers[f"refused.{method}"] = count
        info = {
            f"matcher_error.{follower.group}": follower.last_error
            for follower in self.followers
            if follower.last_error
        }
        info["access"] = "public" if self.authenticator is None else "READ-scope key"
        return numbers, info

    def plan(self) -> ServicePlan:
        return ServicePlan(
            name="marketdata",
            service_names=(SERVICE_NAME,),
            register=self.register,
            status=self.status,
            loops=[*(follower.run for follower in self.followers), self.seed_days],
        )

    async def close(self) -> None:
        await self.persister.close()


async def _abort(context: Context, refusal: Refusal) -> None:
    trailer = ((REASON_TRAILER, refusal.reason),) if refusal.reason else ()
    await context.abort(refusal.code, refusal.detail, trailing_metadata=trailer)
