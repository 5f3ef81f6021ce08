"""Following one matcher group's `StreamMarketData` into the `MarketMirror`.

One stream per group, for all its symbols. A (re)connection sends the sequences the
mirror holds for each symbol it knows, so a matcher failover or a broken connection
goes on with no gap and no repeat: the new leader has the same feed (it is decided in
the log). A symbol the mirror does not know yet, or whose updates the group no longer
retains, comes as a snapshot, and every stream of its book is sent a fresh book
(`MarketMirror._resynchronise`). An update that does not follow (`FeedGapError`) ends
the connection and the next one resumes from what was applied: nothing past a gap is
ever shown. Reconnects back off; a group that runs state-machine version 1 (no feed)
is retried at the same pace, and its symbols stay UNKNOWN.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from bridge.backoff import Backoff
from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from services.clients.channels import group_channel
from services.coordination.addresses import AddressSource
from services.coordination.errors import CoordinationUnavailable
from services.market_data.book_mirror import FeedGapError
from services.market_data.market_mirror import MarketMirror

log = structlog.get_logger(__name__)
CONNECT_TIMEOUT_S = 5.0


class MatcherFollower:
    def __init__(
        self,
        group: str,
        symbols: list[str],
        source: AddressSource,
        mirror: MarketMirror,
        backoff: Backoff,
    ) -> None:
        self.group = group
        self.symbols = symbols
        self.source = source
        self.mirror = mirror
        self.backoff = backoff
        self.connected = False
        self.connections = 0
        self.breaks = 0
        self.last_error = ""
        self.arrived = asyncio.Event()  # set on every batch (the tickers' seeding waits)

    def request(self) -> matcher_pb2.MarketDataRequest:
        request = matcher_pb2.MarketDataRequest(symbols=self.symbols)
        for symbol in self.symbols:
            book = self.mirror.symbols[symbol].book
            if book.known:
                request.positions.add(
                    symbol=symbol,
                    book_sequence=book.book_sequence,
                    trade_sequence=book.trade_sequence,
                )
        return request

    async def run(self) -> None:
        while True:
            try:
                await self._follow_once()
            except (
                grpc.aio.AioRpcError,
                FeedGapError,
                CoordinationUnavailable,
                TimeoutError,
                ConnectionError,
            ) as error:
                self.last_error = _describe(error)
                log.info("marketdata.matcher_lost", group=self.group, error=self.last_error)
            self.connected = False
            self.breaks += 1
            await self.backoff.wait()

    async def _follow_once(self) -> None:
        async with group_channel(self.source) as channel:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await channel.channel_ready()
            call = matcher_pb2_grpc.MatcherStub(channel).StreamMarketData(self.request())
            try:
                async for batch in call:
                    if not self.connected:
                        self.connected = True
                        self.connections += 1
                        self.last_error = ""
                        log.info("marketdata.matcher_followed", group=self.group)
                    self.backoff.reset()
                    self.mirror.apply_batch(batch)
                    self.arrived.set()
            finally:
                call.cancel()
        raise ConnectionError(f"matcher group {self.group} ended StreamMarketData")


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__
