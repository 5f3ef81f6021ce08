"""A client of the market-data service (`oms.v1.MarketData`), and a book kept from its stream.

    async with MarketDataClient(address) as market:               # public market data
    # a mesh whose market data needs a READ key: MarketDataClient(address, api_key=...,
    #     api_secret=...) (or private_key= for an Ed25519 key)
        instruments = await market.instruments()
        book = await market.order_book("BTC-USDT", depth=10)
        async for book in market.follow_book("BTC-USDT", depth=20):   # a LocalBook, kept
            print(book.best_bid(), book.best_ask())
        async for trades in market.trades("BTC-USDT", from_trade_sequence=0):
            ...

`LocalBook` applies the stream's messages as the contract says (market_data.proto,
"Keeping a book") and refuses a diff that does not chain (`BookOutOfSyncError`);
`follow_book` yields it after every message. A refusal raises `GatewayCallError`
(status code, reason, detail), as the gateway's client does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message

from gateway.signed_channel import DEFAULT_TIMEOUT_S, GatewayCallError, wall_clock_ms
from gateway.signing import Ed25519Signer, HmacSigner, Signer, signed_metadata
from protos.oms.v1 import market_data_pb2
from services.clients.channels import gateway_channel

SERVICE = "/oms.v1.MarketData/"
M = market_data_pb2
Level = tuple[int, int]  # (total_lots, order_count)
LevelRow = tuple[int, int, int]  # (price_ticks, total_lots, order_count)


class BookOutOfSyncError(RuntimeError):
    """A diff that does not follow the book's sequence (never expected on one stream)."""


@dataclass
class LocalBook:
    """A book kept from `StreamOrderBook`: levels by price, per side."""

    symbol: str
    book_sequence: int = 0
    status: int = 0
    bids: dict[int, Level] = field(default_factory=dict)  # price -> (lots, count)
    asks: dict[int, Level] = field(default_factory=dict)
    consensus_time_ms: int = 0
    resyncs: int = 0  # whole books received after the first

    def apply(self, event: market_data_pb2.OrderBookEvent) -> None:
        if event.HasField("book"):
            if self.book_sequence or self.bids or self.asks or self.status:
                self.resyncs += 1
            book = event.book
            self.book_sequence = book.book_sequence
            self.status = book.status
            self.consensus_time_ms = book.consensus_time_ms
            self.bids = {
                level.price_ticks: (level.total_lots, level.order_count) for level in book.bids
            }
            self.asks = {
                level.price_ticks: (level.total_lots, level.order_count) for level in book.asks
            }
            return
        diff = event.diff
        if diff.previous_book_sequence != self.book_sequence:
            raise BookOutOfSyncError(
                f"{self.symbol}: a diff from {diff.previous_book_sequence} to a book at"
                f" {self.book_sequence}"
            )
        _set_levels(self.bids, diff.bids)
        _set_levels(self.asks, diff.asks)
        self.book_sequence = diff.book_sequence
        self.status = diff.status
        self.consensus_time_ms = diff.consensus_time_ms

    def best_bid(self) -> tuple[int, int] | None:
        """(price_ticks, total_lots) of the best bid, or None."""
        if not self.bids:
            return None
        price = max(self.bids)
        return price, self.bids[price][0]

    def best_ask(self) -> tuple[int, int] | None:
        if not self.asks:
            return None
        price = min(self.asks)
        return price, self.asks[price][0]

    def crossed(self) -> bool:
        bid, ask = self.best_bid(), self.best_ask()
        return bid is not None and ask is not None and bid[0] >= ask[0]

    def levels(
        self, depth: int = 0
    ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """(bids best first, asks best first) as (price, lots, count), `depth` each (0: all)."""
        bids = [(p, *self.bids[p]) for p in sorted(self.bids, reverse=True)]
        asks = [(p, *self.asks[p]) for p in sorted(self.asks)]
        if depth:
            return bids[:depth], asks[:depth]
        return bids, asks


def book_levels(book: market_data_pb2.OrderBook) -> tuple[list[LevelRow], list[LevelRow]]:
    """An `OrderBook`'s levels as `LocalBook.levels` gives them, to compare."""
    return (
        [(level.price_ticks, level.total_lots, level.order_count) for level in book.bids],
        [(level.price_ticks, level.total_lots, level.order_count) for level in book.asks],
    )


def _set_levels(
    side: dict[int, tuple[int, int]], levels: Iterable[market_data_pb2.PriceLevel]
) -> None:
    for level in levels:
        if level.total_lots == 0:
            side.pop(level.price_ticks, None)
        else:
            side[level.price_ticks] = (level.total_lots, level.order_count)


class MarketDataClient:
    """The market-data API; signed when given a key (a mesh whose market data is not public)."""

    def __init__(
        self,
        address: str,
        *,
        api_key: str = "",
        api_secret: str = "",
        private_key: Ed25519PrivateKey | None = None,
        channel: grpc.aio.Channel | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.address = address
        self.api_key = api_key
        self.signer: Signer | None = None
        if private_key is not None:
            self.signer = Ed25519Signer(private_key)
        elif api_secret:
            self.signer = HmacSigner(api_secret)
        if api_key and self.signer is None:
            raise ValueError("a key needs its api_secret or its private_key")
        self.clock_ms = clock_ms
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self.channel = channel if channel is not None else gateway_channel(address)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_channel:
            await self.channel.close()

    def _metadata(self, method: str, request: Message) -> tuple[tuple[str, str], ...] | None:
        if self.signer is None:
            return None
        return signed_metadata(self.api_key, self.signer, method, request, self.clock_ms())

    async def _unary(self, name: str, request: Message, answer: type[Any]) -> Any:
        method = SERVICE + name
        call = self.channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=answer.FromString,
        )
        try:
            return await call(
                request, metadata=self._metadata(method, request), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error

    async def _stream(self, name: str, request: Message, answer: type[Any]) -> AsyncIterator[Any]:
        method = SERVICE + name
        call = self.channel.unary_stream(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=answer.FromString,
        )(request, metadata=self._metadata(method, request))
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error
        finally:
            call.cancel()

    # --- calls ----------------------------------------------------------------------------

    async def instruments(self) -> list[market_data_pb2.Instrument]:
        answer: market_data_pb2.InstrumentList = await self._unary(
            "ListInstruments", M.ListInstrumentsRequest(), M.InstrumentList
        )
        return list(answer.instruments)

    async def order_book(self, symbol: str, depth: int = 0) -> market_data_pb2.OrderBook:
        book: market_data_pb2.OrderBook = await self._unary(
            "GetOrderBook", M.OrderBookRequest(symbol=symbol, depth=depth), M.OrderBook
        )
        return book

    def book_events(
        self, symbol: str, depth: int = 0
    ) -> AsyncIterator[market_data_pb2.OrderBookEvent]:
        """`StreamOrderBook`'s messages as they come."""
        return self._stream(
            "StreamOrderBook", M.OrderBookRequest(symbol=symbol, depth=depth), M.OrderBookEvent
        )

    async def follow_book(self, symbol: str, depth: int = 0) -> AsyncIterator[LocalBook]:
        """The book kept from `StreamOrderBook`, yielded after every message."""
        book = LocalBook(symbol)
        async for event in self.book_events(symbol, depth):
            book.apply(event)
            yield book

    def trades(
        self, symbol: str, from_trade_sequence: int = 0, *, recent: int = 0
    ) -> AsyncIterator[market_data_pb2.MarketTrades]:
        """`StreamTrades`: the held trades after `from_trade_sequence` (or, with 0, the
        newest `recent` held), then the live ones."""
        return self._stream(
            "StreamTrades",
            M.StreamTradesRequest(
                symbol=symbol, from_trade_sequence=from_trade_sequence, recent=recent
            ),
            M.MarketTrades,
        )

    async def tickers(self, symbols: Iterable[str] = ()) -> list[market_data_pb2.Ticker]:
        answer: market_data_pb2.Tickers = await self._unary(
            "GetTicker", M.GetTickerRequest(symbols=list(symbols)), M.Tickers
        )
        return list(answer.tickers)

    async def candles(
        self,
        symbol: str,
        interval: int = M.CANDLE_INTERVAL_1M,
        *,
        from_ms: int = 0,
        to_ms: int = 0,
        limit: int = 0,
    ) -> market_data_pb2.Candles:
        candles: market_data_pb2.Candles = await self._unary(
            "GetCandles",
            M.GetCandlesRequest(
                symbol=symbol,
                interval=interval,  # type: ignore[arg-type]
                from_ms=from_ms,
                to_ms=to_ms,
                limit=limit,
            ),
            M.Candles,
        )
        return candles
