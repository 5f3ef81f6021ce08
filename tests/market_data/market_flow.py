"""Helpers for the market-data tests on real processes: traders, order flow, what the
matcher says, and streams read in the background.

The truth a stream is compared with is the matcher's own book (`GetBookSnapshot` on
the group's address, durable state only) and the fills the persister wrote to
PostgreSQL. Every wait polls against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import grpc

from gateway.client import AdminClient, GatewayCallError, LocalBook, MarketDataClient, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2, market_data_pb2, matcher_pb2, matcher_pb2_grpc
from tests.bridge.bridge_process import service_status
from tests.gateway.accounts import Account, open_account
from tests.service_process import aio_channel

T = TypeVar("T")
WAIT_S = 45.0  # generous: two cores shared with other work
POLL_S = 0.02
BTC = "BTC-USDT"
ETH = "ETH-USDT"
SOL = "SOL-USDT"
GROUP_OF = {BTC: "g1", ETH: "g1", SOL: "g2"}
# BTC-USDT: one lot is 10,000 sats, a tick 1 micro-USDT per lot; 6,500,000 ticks is the
# reference price, so prices a few ticks either side are well inside its price band.
BTC_PRICE = 6_500_000
USDT_FUNDS = 1_000_000_000_000  # 1,000,000 USDT in micro-USDT
BTC_FUNDS = 10_000_000_000  # 100 BTC in sats: 1,000,000 lots
ETH_FUNDS = 10_000_000_000
SOL_FUNDS = 1_000_000_000_000  # 1,000 SOL in lamports
DEPOSITS = {"USDT": USDT_FUNDS, "BTC": BTC_FUNDS, "ETH": ETH_FUNDS, "SOL": SOL_FUNDS}
MAX_FEE_PPM = 2_000
C = common_pb2
# Refusals a client retries with the same request (gateway.proto: UNAVAILABLE, TIMEOUT).
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


async def until(
    probe: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    what: str,
    *,
    timeout_s: float = WAIT_S,
) -> T:
    """Await `probe()` until `check` holds of its value; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s; last: {value!r}")
        await asyncio.sleep(POLL_S)


async def open_traders(admin: AdminClient, count: int) -> list[Account]:
    """`count` users funded in every asset, so any order of the flow can be paid."""
    return [await open_account(admin, DEPOSITS) for _ in range(count)]


# --- order flow -------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowOrder:
    """One order of a flow: who, what, and how far from the reference price."""

    trader: int
    side: int  # SIDE_BUY or SIDE_SELL
    market: bool
    price_offset: int  # ticks from BTC_PRICE (limit orders)
    quantity_lots: int


def order_request(
    client: OmsClient, client_order_id: str, symbol: str, base_price: int, order: FlowOrder
) -> Any:
    if not order.market:
        return client.place_request(
            client_order_id,
            symbol,
            order.side,
            price_ticks=base_price + order.price_offset,
            quantity_lots=order.quantity_lots,
        )
    if order.side == C.SIDE_SELL:
        return client.place_request(
            client_order_id,
            symbol,
            C.SIDE_SELL,
            order_type=C.ORDER_TYPE_MARKET,
            time_in_force=C.TIME_IN_FORCE_IOC,
            quantity_lots=order.quantity_lots,
        )
    # A market buy is sized by what it may spend: about its lots at a price above the
    # flow's highest ask, fee included.
    spend = (base_price + 50) * order.quantity_lots
    return client.place_request(
        client_order_id,
        symbol,
        C.SIDE_BUY,
        order_type=C.ORDER_TYPE_MARKET,
        time_in_force=C.TIME_IN_FORCE_IOC,
        quote_amount=spend + spend * MAX_FEE_PPM // 1_000_000,
    )


@dataclass
class PlacedOrder:
    client: OmsClient
    order_id: str


async def place_flow(
    clients: Sequence[OmsClient],
    flow: Sequence[FlowOrder],
    *,
    symbol: str,
    base_price: int,
    tag: str,
) -> list[PlacedOrder]:
    """Place `flow` in order through the gateway; the orders the shard accepted."""
    placed: list[PlacedOrder] = []
    for index, order in enumerate(flow):
        client = clients[order.trader % len(clients)]
        request = order_request(client, f"{tag}-{index}", symbol, base_price, order)
        ack = await place_retrying(client, request)
        if ack.accepted:
            placed.append(PlacedOrder(client, ack.order_id))
    return placed


async def place_retrying(
    client: OmsClient, request: gateway_pb2.PlaceOrderRequest, timeout_s: float = WAIT_S
) -> gateway_pb2.OrderAck:
    """PlaceOrder, resent with the same client order id while the gateway is UNAVAILABLE
    or slow, as the contract says a client does (a loaded machine can starve it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await client.place_order(request)
        except GatewayCallError as error:
            if error.code not in RETRYABLE or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(POLL_S)


async def settle(placed: Sequence[PlacedOrder], timeout_s: float = WAIT_S) -> None:
    """Until the shard has the matcher's answer for every order (none is PENDING): the
    matcher's book then holds all of them."""
    deadline = time.monotonic() + timeout_s
    pending = list(placed)
    while pending:
        still: list[PlacedOrder] = []
        for order in pending:
            try:
                view = await order.client.get_order(order_id=order.order_id)
            except GatewayCallError as error:
                # A closed order is read from the persister's row, written a moment later;
                # a starved gateway answers later.
                if error.code != grpc.StatusCode.NOT_FOUND and error.code not in RETRYABLE:
                    raise
                still.append(order)
                continue
            if view.status == C.ORDER_STATUS_PENDING:
                still.append(order)
        pending = still
        if pending and time.monotonic() >= deadline:
            raise AssertionError(
                f"orders still pending after {timeout_s:g} s: {[o.order_id for o in pending]}"
            )
        if pending:
            await asyncio.sleep(POLL_S)


# --- the matcher's truth ------------------------------------------------------------------


async def matcher_book(address: str, symbol: str, depth: int = 0) -> matcher_pb2.BookSnapshot:
    """The matcher's own book (durable state), from the group's address (plaintext)."""
    async with aio_channel(address) as channel:
        snapshot: matcher_pb2.BookSnapshot = await matcher_pb2_grpc.MatcherStub(
            channel
        ).GetBookSnapshot(matcher_pb2.BookSnapshotQuery(symbol=symbol, depth=depth), timeout=10)
    return snapshot


LevelRows = tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]


def snapshot_levels(snapshot: matcher_pb2.BookSnapshot) -> LevelRows:
    return (
        [(level.price_ticks, level.total_lots, level.order_count) for level in snapshot.bids],
        [(level.price_ticks, level.total_lots, level.order_count) for level in snapshot.asks],
    )


async def taker_fills(
    database_url: str, symbol: str, after_trade_id: int
) -> list[tuple[int, int, int]]:
    """(trade_id, price_ticks, quantity_lots) of the symbol's taker fills in PostgreSQL."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT trade_id, price_ticks, quantity_lots FROM fills"
            " WHERE symbol = $1 AND NOT maker AND trade_id > $2 ORDER BY trade_id",
            symbol,
            after_trade_id,
        )
    finally:
        await connection.close()
    return [(row["trade_id"], row["price_ticks"], row["quantity_lots"]) for row in rows]


@dataclass(frozen=True)
class Fill:
    """A taker fill in PostgreSQL: one per trade."""

    trade_id: int
    price_ticks: int
    quantity_lots: int
    consensus_time_ms: int


async def all_taker_fills(database_url: str, symbol: str) -> list[Fill]:
    """Every taker fill of the symbol, by (consensus time, trade id) as candles order them."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT trade_id, price_ticks, quantity_lots, consensus_time_ms FROM fills"
            " WHERE symbol = $1 AND NOT maker ORDER BY consensus_time_ms, trade_id",
            symbol,
        )
    finally:
        await connection.close()
    return [Fill(**dict(row)) for row in rows]


async def service_counters(address: str) -> dict[str, int]:
    """The market-data process's status numbers (streams held, feed statistics...)."""
    return dict((await service_status(address)).counters)


async def wait_streams(address: str, count: int) -> None:
    """Until the service holds exactly `count` streams (opened ones registered, closed
    ones released)."""
    await until(
        lambda: service_counters(address),
        lambda numbers: numbers.get("streams", 0) == count,
        f"the service holding {count} streams",
    )


# --- streams read in the background ---------------------------------------------------------


@dataclass
class BookWatch:
    """A `LocalBook` kept from `StreamOrderBook` by a task; what went wrong, kept."""

    symbol: str
    depth: int
    book: LocalBook = field(init=False)
    messages: int = 0
    crossed: list[int] = field(default_factory=list)  # sequences where it was crossed
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.book = LocalBook(self.symbol)

    def start(self, market: MarketDataClient) -> BookWatch:
        self.task = asyncio.create_task(self._follow(market))
        return self

    async def _follow(self, market: MarketDataClient) -> None:
        async for event in market.book_events(self.symbol, self.depth):
            self.book.apply(event)  # BookOutOfSyncError ends the task with it
            self.messages += 1
            if self.book.crossed():
                self.crossed.append(self.book.book_sequence)

    def healthy(self) -> None:
        """Fails if the stream ended (an error, a broken chain) or ever showed a crossed book."""
        assert self.task is not None
        if self.task.done():
            error = self.task.exception()
            raise AssertionError(f"the depth {self.depth} book stream ended: {error!r}")
        assert not self.crossed, f"crossed book on the stream at sequences {self.crossed}"

    async def at_sequence(self, sequence: int, timeout_s: float = WAIT_S) -> LocalBook:
        async def probe() -> LocalBook:
            self.healthy()
            return self.book

        return await until(
            probe,
            lambda book: book.book_sequence == sequence,
            f"the depth {self.depth} book stream at sequence {sequence}",
            timeout_s=timeout_s,
        )

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@dataclass
class TradeWatch:
    """`StreamTrades` read by a task: every trade received, in order."""

    symbol: str
    from_trade_sequence: int = 0
    trades: list[market_data_pb2.MarketTrade] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def start(self, market: MarketDataClient) -> TradeWatch:
        self.task = asyncio.create_task(self._follow(market))
        return self

    async def _follow(self, market: MarketDataClient) -> None:
        async for message in market.trades(self.symbol, self.from_trade_sequence):
            assert message.symbol == self.symbol
            self.trades.extend(message.trades)

    def healthy(self) -> None:
        assert self.task is not None
        if self.task.done():
            raise AssertionError(f"the trade stream ended: {self.task.exception()!r}")

    async def through(self, sequence: int, *, after: int, timeout_s: float = WAIT_S) -> None:
        """Until the trade with `sequence` (or a later one) was received; `after`: the
        symbol's last trade when the stream opened (nothing to wait for if no trade since)."""

        async def probe() -> int:
            self.healthy()
            return self.trades[-1].trade_sequence if self.trades else after

        await until(
            probe,
            lambda last: last >= sequence,
            f"the trade stream through trade {sequence}",
            timeout_s=timeout_s,
        )

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """A client's stream (an async generator), ended (its call cancelled) on exit."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def next_message(stream: AsyncIterator[T], timeout_s: float = WAIT_S) -> T:
    """The stream's next message, within a deadline."""
    async with asyncio.timeout(timeout_s):
        return await anext(stream)


def status_name(status: int) -> str:
    return str(market_data_pb2.MarketStatus.Name(status))  # type: ignore[arg-type]
