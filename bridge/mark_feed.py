"""Last trade prices from every matcher group into the shard's risk, as mark prices.

Each group's `StreamLastPrices` is followed on its own connection; the newest
price of each symbol waits in `pending` (a newer one replaces it), and one
`UserShard/PublishMarks` stream carries whatever is pending as one `MarkPrices`
message at most every `interval_ms` (the matchers conflate to that cadence too).
The shard conflates again and logs marks at its own cadence, so a lost tick
costs nothing that the next one does not repair.

Each stream reconnects on its own with the bridge's backoff: a matcher that is
down stops only its symbols' marks, and a shard that is down stops none of the
order flow. A new PublishMarks stream starts with the newest known price of
every symbol, so a tick lost in a broken stream is sent again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import grpc
import structlog

from bridge.backoff import Backoff
from bridge.statistics import BridgeStatistics
from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc, shard_pb2, shard_pb2_grpc
from services.clients.channels import group_channel
from services.coordination.addresses import AddressSource
from services.coordination.writer_tokens import WriterCredential

log = structlog.get_logger(__name__)
CONNECT_TIMEOUT_S = 5.0


class MarkFeed:
    def __init__(
        self,
        shard: AddressSource,
        matchers: Mapping[str, AddressSource],
        statistics: BridgeStatistics,
        credential: WriterCredential,
        *,
        interval_ms: int,
        backoff_initial_ms: int,
        backoff_max_ms: int,
    ) -> None:
        self.shard = shard
        self.matchers = dict(matchers)
        self.statistics = statistics
        self.credential = credential  # its token goes with PublishMarks
        self.interval_ms = interval_ms
        self.backoff_initial_ms = backoff_initial_ms
        self.backoff_max_ms = backoff_max_ms
        self.known: dict[str, int] = {}  # symbol -> newest price read (ticks)
        self.pending: dict[str, int] = {}  # symbol -> newest price not yet published
        self.arrived = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            for group, source in sorted(self.matchers.items()):
                tasks.create_task(self._follow(group, source))
            tasks.create_task(self._publish())

    def offer(self, symbol: str, price_ticks: int) -> None:
        if price_ticks <= 0:
            return
        self.known[symbol] = price_ticks
        self.pending[symbol] = price_ticks
        self.arrived.set()

    def take(self) -> shard_pb2.MarkPrices:
        """Everything pending as one message; pending is empty afterwards."""
        marks = shard_pb2.MarkPrices()
        for symbol, price in self.pending.items():
            marks.prices.add(symbol=symbol, price_ticks=price)
        self.pending = {}
        self.arrived.clear()
        return marks

    async def _follow(self, group: str, source: AddressSource) -> None:
        counters = self.statistics.counters
        backoff = Backoff(self.backoff_initial_ms, self.backoff_max_ms)
        while True:
            try:
                async with group_channel(source) as channel:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await channel.channel_ready()
                    call = matcher_pb2_grpc.MatcherStub(channel).StreamLastPrices(
                        matcher_pb2.LastPriceRequest(min_interval_ms=self.interval_ms)
                    )
                    try:
                        async for price in call:
                            backoff.reset()
                            counters.marks_received += 1
                            self.offer(price.symbol, price.price_ticks)
                    finally:
                        call.cancel()
                raise ConnectionError(f"matcher {group} ended StreamLastPrices")
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as error:
                log.info("bridge.last_prices_lost", group=group, error=repr(error))
            await backoff.wait()

    async def _publish(self) -> None:
        backoff = Backoff(self.backoff_initial_ms, self.backoff_max_ms)
        while True:
            try:
                async with group_channel(self.shard) as channel:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await channel.channel_ready()
                    stub = shard_pb2_grpc.UserShardStub(channel)
                    # Ends only with an error: the request stream never ends by itself.
                    await stub.PublishMarks(
                        self._messages(backoff), metadata=self.credential.metadata() or None
                    )
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as error:
                log.info("bridge.publish_marks_lost", error=repr(error))
            await backoff.wait()

    async def _messages(self, backoff: Backoff) -> AsyncIterator[shard_pb2.MarkPrices]:
        counters = self.statistics.counters
        self.pending.update(self.known)
        while True:
            if not self.pending:
                await self.arrived.wait()
            marks = self.take()
            yield marks
            backoff.reset()
            counters.marks_published += len(marks.prices)
            if self.interval_ms:
                await asyncio.sleep(self.interval_ms / 1000)  # the next ones conflate meanwhile
