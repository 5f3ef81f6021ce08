"""The matcher's market data for the market-data service: `StreamMarketData`, `GetBookSnapshot`.

Both serve durable state only, like `Subscribe`: book updates and trades are read from
the feed's retained windows (`core/market_feed.py`) up to the per-symbol sequences the
egress feed reports durable (`DurableView`), and a snapshot is taken once every
applied entry is durable (`RuntimeHost.settled`), so it never shows an entry a crash
could take back. A stream sends, per symbol, a snapshot first where the caller gave no
position, or where its position is older than the retained window, then every update
and trade in sequence; everything that became durable together goes out as one
`MarketDataBatch`, so a busy group costs its one follower (the market-data service)
one message per wake, not one per entry. The number of market-data clients never
reaches a matcher: the service fans out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from protos.oms.v1 import matcher_pb2
from services.matcher.core.errors import (
    MarketFeedInactiveError,
    MarketSequenceTooOldError,
    UnknownSymbolError,
)
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.runtime.hosting import RuntimeHost

if TYPE_CHECKING:
    from services.matcher.service import DurableView

# Updates, and as many trades, per symbol in one batch: a resume far behind goes out in
# bounded messages (one update lists at most the levels one entry changed).
ROWS_PER_BATCH = 1_000


class MarketDataServing:
    def __init__(
        self, host: RuntimeHost[MatcherEgress], machine: MatcherMachine, view: DurableView
    ) -> None:
        self.host = host
        self.machine = machine
        self.view = view

    async def stream_market_data(
        self, request: matcher_pb2.MarketDataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[matcher_pb2.MarketDataBatch]:
        machine = self.machine
        feed = machine.engine.feed
        if feed is None:
            error = MarketFeedInactiveError(machine.version)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
            raise AssertionError("abort() raises")
        symbols = list(dict.fromkeys(request.symbols)) or sorted(feed.symbols)
        unknown = [symbol for symbol in symbols if symbol not in feed.symbols]
        if unknown:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, str(UnknownSymbolError(unknown[0]))
            )
        # Per symbol: the next book update and the next trade to send; 0: a snapshot first.
        next_books: dict[str, int] = dict.fromkeys(symbols, 0)
        next_trades: dict[str, int] = dict.fromkeys(symbols, 0)
        for position in request.positions:
            if position.symbol in next_books:
                next_books[position.symbol] = position.book_sequence + 1
                next_trades[position.symbol] = position.trade_sequence + 1
        view = self.view
        while True:
            batch = matcher_pb2.MarketDataBatch()
            for symbol in symbols:
                if next_books[symbol] == 0:
                    await self._snapshot_into(batch, symbol, next_books, next_trades)
                durable = view.book_sequences.get(symbol, 0)
                wanted = next_books[symbol]
                if wanted <= durable:
                    try:
                        updates = machine.book_updates_from(
                            symbol, wanted, min(ROWS_PER_BATCH, durable - wanted + 1)
                        )
                    except MarketSequenceTooOldError:
                        await self._snapshot_into(batch, symbol, next_books, next_trades)
                        updates = []
                    if updates:
                        batch.book_updates.extend(updates)
                        next_books[symbol] = updates[-1].book_sequence + 1
                durable = view.trade_sequences.get(symbol, 0)
                wanted = next_trades[symbol]
                if wanted <= durable:
                    try:
                        trades = machine.trades_from(
                            symbol, wanted, min(ROWS_PER_BATCH, durable - wanted + 1)
                        )
                    except MarketSequenceTooOldError as error:
                        # Trades cannot be rebuilt from a snapshot: go on from the oldest
                        # retained one; the follower sees the jump in trade_sequence and
                        # tells its own clients the trades between are lost to it.
                        wanted = error.first_retained_sequence
                        trades = machine.trades_from(
                            symbol, wanted, min(ROWS_PER_BATCH, durable - wanted + 1)
                        )
                    if trades:
                        batch.trades.extend(trades)
                        next_trades[symbol] = trades[-1].trade_sequence + 1
            if batch.trades or batch.book_updates or batch.snapshots:
                yield batch
                continue
            await view.wait_change()

    async def _snapshot_into(
        self,
        batch: matcher_pb2.MarketDataBatch,
        symbol: str,
        next_books: dict[str, int],
        next_trades: dict[str, int],
    ) -> None:
        await self.host.settled()
        snapshot = self.machine.book_snapshot(symbol)
        batch.snapshots.append(snapshot)
        next_books[symbol] = snapshot.book_sequence + 1
        if next_trades[symbol] == 0:
            next_trades[symbol] = snapshot.trade_sequence + 1

    async def get_book_snapshot(
        self, request: matcher_pb2.BookSnapshotQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> matcher_pb2.BookSnapshot:
        await self.host.settled()
        try:
            return self.machine.book_snapshot(request.symbol, request.depth)
        except MarketFeedInactiveError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except UnknownSymbolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        raise AssertionError("abort() raises")

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "StreamMarketData": grpc.unary_stream_rpc_method_handler(
                self.stream_market_data,
                request_deserializer=matcher_pb2.MarketDataRequest.FromString,
                response_serializer=matcher_pb2.MarketDataBatch.SerializeToString,
            ),
            "GetBookSnapshot": grpc.unary_unary_rpc_method_handler(
                self.get_book_snapshot,
                request_deserializer=matcher_pb2.BookSnapshotQuery.FromString,
                response_serializer=matcher_pb2.BookSnapshot.SerializeToString,
            ),
        }
