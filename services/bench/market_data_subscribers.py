"""The subscribers of `oms bench marketdata`: one process following many market-data streams.

The bench starts a few of these processes (one Python process cannot read a thousand
streams fast enough), each as

    python -m services.bench.market_data_subscribers SPEC

where SPEC is a JSON object: `address` (the market-data service), `state_dir` and `tls`
(the mesh's transport, as `oms up` wrote it), `subscriptions` (one `[symbol, depth]` per
subscriber: a `StreamOrderBook` at that depth and a `StreamTrades` of that symbol) and
`streams_per_channel` (the streams one connection carries, below the service's limit
per connection).

It speaks a line protocol with the bench:

- it prints `ready` once every book stream has its first book and every trade stream
  is started (or `failed: WHY` and exits 1);
- on `start` (stdin) it counts what arrives; on `stop` it prints one JSON line
  (`Tally.as_json`) and exits.

The delay of each message is the subscriber's wall clock at receipt minus the
message's `consensus_time_ms` (the matcher leader's wall clock at the log entry: the
same machine, the same clock), in 0.1 ms bins. `consensus_time_ms` is whole
milliseconds, truncated, so each figure is up to 1 ms longer than the true delay.
A diff is timed by the first update it covers (`first_consensus_time_ms`: a diff that
a stream behind sent merged is as late as its oldest update); a `MarketTrades` message
is timed by its first (oldest) trade. A trade stream the service ends (RESOURCE_EXHAUSTED:
the subscriber fell behind) is resumed from its last trade, and a stream that finds the
service unreachable (UNAVAILABLE: connections still opening; see REOPENED) is opened
again, as a client would; both are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import uvloop

from gateway.market_data_client import MarketDataClient
from gateway.signed_channel import GatewayCallError
from services.clients.channels import MAX_MESSAGE_BYTES
from services.transport.development import adopt_mesh_transports
from services.transport.tls import client_transport

BIN_MS = 0.1  # the delays' resolution
RETRY_S = 0.1  # before opening a stream again that could not be (re)opened
# Streams opened again when they end so: UNAVAILABLE (not connected), and CANCELLED, which
# a few streams of hundreds opened at once over TLS on a busy machine get within their
# first second without reaching the service (its calls count them not; undiagnosed).
REOPENED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
# A public client's channel: its own connection (not one shared by every channel of the
# process), without the mesh's 100 ms reconnect backoff, which is also gRPC's shortest
# connection attempt: a TLS handshake among hundreds at once on two busy cores takes
# longer ("connection attempt timed out before receiving SETTINGS frame").
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
READY = "ready"
START = "start"
STOP = "stop"


@dataclass
class Tally:
    """What one process's subscribers received while counting (between start and stop)."""

    counting: bool = False
    diffs: int = 0  # OrderBookDiff messages
    book_updates: int = 0  # the matcher's book updates those diffs carried (sequences)
    trade_messages: int = 0  # MarketTrades messages
    trades: int = 0  # trades in them
    resync_books: int = 0  # whole books after a stream's first: the service resynchronised
    ended: int = 0  # trade streams the service ended (then resumed)
    broken_chains: int = 0  # a diff not chained to the book before it (never expected)
    stream_errors: Counter[str] = field(default_factory=Counter)  # by status code
    delays: Counter[int] = field(default_factory=Counter)  # in BIN_MS bins

    def delay(self, received_ns: int, consensus_time_ms: int) -> None:
        self.delays[round((received_ns / 1e6 - consensus_time_ms) / BIN_MS)] += 1

    @property
    def updates(self) -> int:
        """The matcher's updates delivered: book updates (a diff may carry several, and a
        depth skips those below it) and trades."""
        return self.book_updates + self.trades

    @property
    def delivered(self) -> int:
        """Every message the subscribers counted: the service sent each of them."""
        return self.diffs + self.trade_messages + self.resync_books

    def add(self, other: Tally) -> None:
        """Add another process's tally to this one."""
        self.diffs += other.diffs
        self.book_updates += other.book_updates
        self.trade_messages += other.trade_messages
        self.trades += other.trades
        self.resync_books += other.resync_books
        self.ended += other.ended
        self.broken_chains += other.broken_chains
        self.stream_errors.update(other.stream_errors)
        self.delays.update(other.delays)

    @classmethod
    def from_json(cls, text: str) -> Tally:
        fields = json.loads(text)
        return cls(
            diffs=int(fields["diffs"]),
            book_updates=int(fields.get("book_updates", 0)),
            trade_messages=int(fields["trade_messages"]),
            trades=int(fields["trades"]),
            resync_books=int(fields["resync_books"]),
            ended=int(fields["ended"]),
            broken_chains=int(fields["broken_chains"]),
            stream_errors=Counter(fields["stream_errors"]),
            delays=Counter({int(key): int(count) for key, count in fields["delays"].items()}),
        )

    def as_json(self) -> str:
        return json.dumps(
            {
                "diffs": self.diffs,
                "book_updates": self.book_updates,
                "trade_messages": self.trade_messages,
                "trades": self.trades,
                "resync_books": self.resync_books,
                "ended": self.ended,
                "broken_chains": self.broken_chains,
                "stream_errors": dict(self.stream_errors),
                "delays": {str(key): count for key, count in self.delays.items()},
            }
        )


class Subscriber:
    """One subscriber: a symbol's book at one depth and the symbol's trades, through the
    project's own client (`MarketDataClient`)."""

    def __init__(self, market: MarketDataClient, symbol: str, depth: int, tally: Tally) -> None:
        self.market = market
        self.symbol = symbol
        self.depth = depth
        self.tally = tally
        self.book_started = asyncio.Event()
        self.trades_started = asyncio.Event()

    async def follow_book(self) -> None:
        tally = self.tally
        while True:
            sequence = 0
            first = True  # a stream's first book is no resynchronisation
            try:
                async for event in self.market.book_events(self.symbol, self.depth):
                    received_ns = time.time_ns()
                    if event.HasField("diff"):
                        diff = event.diff
                        if diff.previous_book_sequence != sequence:
                            tally.broken_chains += 1
                        sequence = diff.book_sequence
                        if tally.counting:
                            tally.diffs += 1
                            tally.book_updates += diff.book_sequence - diff.previous_book_sequence
                            tally.delay(
                                received_ns,
                                diff.first_consensus_time_ms or diff.consensus_time_ms,
                            )
                        continue
                    sequence = event.book.book_sequence
                    if first:
                        first = False
                        self.book_started.set()
                    elif tally.counting:
                        tally.resync_books += 1
                return  # the service never ends a book stream by itself
            except GatewayCallError as error:
                if error.code in REOPENED:
                    # Not connected (yet: a thousand streams opening on a busy machine):
                    # again, as a client would.
                    tally.stream_errors[f"book {error.code.name} (opened again)"] += 1
                    await asyncio.sleep(RETRY_S)
                    continue
                tally.stream_errors[f"book {error.code.name}: {error.detail}"] += 1
                raise

    async def follow_trades(self) -> None:
        tally = self.tally
        last = 0  # the last trade received: where a resumed stream starts
        while True:
            # No first message to wait for on a trade stream that starts from now: the
            # bench counts the service's streams before it starts counting.
            self.trades_started.set()
            try:
                async for message in self.market.trades(self.symbol, from_trade_sequence=last):
                    received_ns = time.time_ns()
                    if not message.trades:
                        continue
                    last = message.trades[-1].trade_sequence
                    if tally.counting:
                        tally.trade_messages += 1
                        tally.trades += len(message.trades)
                        tally.delay(received_ns, message.trades[0].consensus_time_ms)
                return  # the service never ends a trade stream by itself
            except GatewayCallError as error:
                if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "behind" in error.detail:
                    tally.ended += 1  # fell behind: resumed from its last trade (0: from now)
                    continue
                if error.code in REOPENED:
                    tally.stream_errors[f"trades {error.code.name} (opened again)"] += 1
                    await asyncio.sleep(RETRY_S)
                    continue
                if error.code == grpc.StatusCode.OUT_OF_RANGE:
                    tally.stream_errors["trades OUT_OF_RANGE (resumed from now)"] += 1
                    last = 0
                    await asyncio.sleep(RETRY_S)
                    continue
                tally.stream_errors[f"trades {error.code.name}: {error.detail}"] += 1
                raise


async def _lines() -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def follow(spec: dict[str, Any]) -> int:
    adopt_mesh_transports(Path(spec["state_dir"]), tls=bool(spec["tls"]))
    subscriptions = [(str(symbol), int(depth)) for symbol, depth in spec["subscriptions"]]
    # Two streams per subscriber.
    per_channel = max(1, int(spec["streams_per_channel"]) // 2)
    tally = Tally()
    # A client of its own per connection: the service limits the streams of each.
    address = spec["address"]
    markets = [
        MarketDataClient(address, channel=client_transport().channel(address, CHANNEL_OPTIONS))
        for _ in range(0, len(subscriptions), per_channel)
    ]
    subscribers = [
        Subscriber(markets[index // per_channel], symbol, depth, tally)
        for index, (symbol, depth) in enumerate(subscriptions)
    ]
    tasks = [
        asyncio.create_task(follow_stream())
        for subscriber in subscribers
        for follow_stream in (subscriber.follow_book, subscriber.follow_trades)
    ]
    commands = await _lines()
    started = asyncio.create_task(_all_started(subscribers))
    try:
        done, _ = await asyncio.wait({started, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        if started not in done:  # a stream ended before every one had started
            _say(f"failed: {dict(tally.stream_errors) or 'a stream ended'}")
            return 1
        _say(READY)
        while (line := await commands.readline()) and line.strip() != STOP.encode():
            if line.strip() == START.encode():
                tally.counting = True
        if not line:
            return 1  # the bench went away
        tally.counting = False
        _say(tally.as_json())
        return 0
    finally:
        for task in (started, *tasks):
            task.cancel()
        await asyncio.gather(started, *tasks, return_exceptions=True)
        for market in markets:
            with contextlib.suppress(Exception):
                await market.channel.close()  # its own channel: the client leaves it open


async def _all_started(subscribers: list[Subscriber]) -> None:
    for subscriber in subscribers:
        await subscriber.book_started.wait()
        await subscriber.trades_started.wait()


def main() -> int:
    spec = json.loads(sys.argv[1])
    return uvloop.run(follow(spec))


if __name__ == "__main__":
    sys.exit(main())
