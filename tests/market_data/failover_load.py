"""What the market-data failover test runs beside a replicated mesh: an order flow that
both trades and rests at several prices, the public streams it watches (a trade tape
and kept books), and the readings it compares them with (a matcher's own book and
trades, the service's status).

The flow is `tests/e2e/stream_load.py`'s Trade-stream load with other orders: every
other order of a user is one lot at the reference price, where buyers and sellers meet
(it trades), the others one lot one to five price steps behind it on the user's own
side (they rest, so the book keeps levels at several prices, and never fill). Bids stay
at or below the reference price and asks at or above it, so the book is never crossed.

The watchers keep everything a client would see: the tape resumes an explicitly ended
`StreamTrades` from its last trade (as the contract says a client does) and counts
those ends; a book watcher keeps a `LocalBook` (which raises `BookOutOfSyncError` on a
broken chain) and counts the whole books received after the first (resyncs) and any
moment it was crossed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gateway.client import GatewayCallError
from gateway.market_data_client import LocalBook, MarketDataClient
from protos.oms.v1 import (
    common_pb2,
    gateway_pb2,
    market_data_pb2,
    matcher_pb2,
    matcher_pb2_grpc,
    status_pb2,
    status_pb2_grpc,
)
from services.clients.channels import mesh_channel
from tests.e2e.stream_load import LoadUser, StreamLoad
from tests.gateway.accounts import BTC, PRICE, Account

PRICE_STEP = 500  # ticks between the resting levels (0.0077 %: far inside the 10 % band)
RESTING_LEVELS = 5  # per side, behind the reference price
POLL_S = 0.02
CALL_TIMEOUT_S = 5.0
LevelRows = tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]


@dataclass
class TradingAndRestingUser(LoadUser):
    """Every other order at the reference price (it trades), the others resting behind it."""

    def new_orders(self, count: int) -> None:
        behind = -PRICE_STEP if self.side == common_pb2.SIDE_BUY else PRICE_STEP
        for _ in range(count):
            self.sequence += 1
            client_order_id = f"{self.account.user_id}-{self.sequence}"
            # Odd orders trade; even ones rest, taking the levels behind in turn.
            level = 0 if self.sequence % 2 else 1 + self.sequence // 2 % RESTING_LEVELS
            self.orders[client_order_id] = gateway_pb2.PlaceOrderRequest(
                user_id=self.account.user_id,
                client_order_id=client_order_id,
                symbol=BTC,
                side=self.side,  # type: ignore[arg-type]
                order_type=common_pb2.ORDER_TYPE_LIMIT,
                time_in_force=common_pb2.TIME_IN_FORCE_GTC,
                price_ticks=PRICE + level * behind,
                quantity_lots=1,
            )
            self.to_send.append(client_order_id)


def trading_and_resting_load(
    gateway: str, accounts: Sequence[Account], *, deadline_s: float, batch: int
) -> StreamLoad:
    """Half the users buy, half sell; each sends `batch` orders every 0.1 s."""
    sides = (common_pb2.SIDE_BUY, common_pb2.SIDE_SELL)
    users = [TradingAndRestingUser(account, sides[n % 2]) for n, account in enumerate(accounts)]
    return StreamLoad(gateway, users, deadline_s=deadline_s, batch=batch)


def expected_book(users: Sequence[LoadUser]) -> tuple[int, LevelRows]:
    """The trades and the book the accepted orders must make: one-lot orders meet only
    at the reference price (each pair one trade), and every other order rests, one
    order per lot. (trades, (bids, asks)) with levels as `LocalBook.levels` gives them."""
    resting: dict[int, Counter[int]] = {
        common_pb2.SIDE_BUY: Counter(),
        common_pb2.SIDE_SELL: Counter(),
    }
    for user in users:
        for order in user.orders.values():
            resting[order.side][order.price_ticks] += order.quantity_lots
    bought, sold = resting[common_pb2.SIDE_BUY][PRICE], resting[common_pb2.SIDE_SELL][PRICE]
    trades = min(bought, sold)
    resting[common_pb2.SIDE_BUY][PRICE] -= trades
    resting[common_pb2.SIDE_SELL][PRICE] -= trades
    bids, asks = (
        sorted(
            ((price, lots, lots) for price, lots in resting[side].items() if lots),
            reverse=side == common_pb2.SIDE_BUY,
        )
        for side in (common_pb2.SIDE_BUY, common_pb2.SIDE_SELL)
    )
    return trades, (bids, asks)


# --- what a client sees -------------------------------------------------------------------


@dataclass
class TradeTape:
    """`StreamTrades` of one symbol from its start, every trade as it arrived."""

    client: MarketDataClient
    symbol: str
    trades: list[market_data_pb2.MarketTrade] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)  # wall clock (s), per trade
    ends: list[str] = field(default_factory=list)  # explicit ends the tape resumed after
    task: asyncio.Task[None] | None = None

    @property
    def last_sequence(self) -> int:
        return self.trades[-1].trade_sequence if self.trades else 0

    def start(self) -> None:
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                async for message in self.client.trades(self.symbol, self.last_sequence):
                    now = time.time()  # beside the trades' consensus times (ms)
                    self.trades.extend(message.trades)
                    self.arrived_at.extend(now for _ in message.trades)
                # A server's stream never ends without a status: that is a failure.
                raise AssertionError(f"StreamTrades of {self.symbol} ended with no status")
            except GatewayCallError as error:
                # The contract's explicit end (the client fell behind, or trades were
                # lost to the service): a client resumes from its last trade.
                self.ends.append(f"{error.code.name}: {error.detail}")
                if len(self.ends) > 20:
                    raise

    def first_after(self, sequence: int) -> tuple[market_data_pb2.MarketTrade, float] | None:
        """The first trade after `sequence` and when it arrived (wall clock), if it has."""
        for trade, moment in zip(self.trades, self.arrived_at, strict=True):
            if trade.trade_sequence > sequence:
                return trade, moment
        return None

    async def wait_past(self, sequence: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.last_sequence <= sequence:
            self.raise_failure()
            assert time.monotonic() < deadline, (
                f"no trade after {sequence} on the tape in {timeout_s:g} s"
                f" (last {self.last_sequence}; ends {self.ends})"
            )
            await asyncio.sleep(POLL_S)

    def raise_failure(self) -> None:
        if self.task is not None and self.task.done():
            self.task.result()
            raise AssertionError("the trade tape stopped")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


@dataclass
class BookWatch:
    """`StreamOrderBook` of one symbol at one depth, kept in a `LocalBook`."""

    client: MarketDataClient
    symbol: str
    depth: int
    book: LocalBook = field(init=False)
    events: int = 0
    crossed: list[tuple[int, object, object]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.book = LocalBook(self.symbol)

    def start(self) -> None:
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for event in self.client.book_events(self.symbol, self.depth):
            self.book.apply(event)  # BookOutOfSyncError on a broken chain ends the watch
            self.events += 1
            if self.book.crossed():
                book = self.book
                self.crossed.append((book.book_sequence, book.best_bid(), book.best_ask()))
        raise AssertionError(f"StreamOrderBook of {self.symbol} ended with no status")

    def raise_failure(self) -> None:
        """A watch never ends while the service runs: its end is the failure."""
        if self.task is not None and self.task.done():
            self.task.result()
            raise AssertionError(f"the depth {self.depth} book watch stopped")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def wait_book_known(client: MarketDataClient, symbol: str, timeout_s: float) -> None:
    """Until the service has read the symbol's book from its group (UNAVAILABLE before)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.order_book(symbol)
            return
        except GatewayCallError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.1)


# --- the readings to compare with ---------------------------------------------------------


async def matcher_book(address: str, symbol: str, depth: int = 0) -> matcher_pb2.BookSnapshot:
    """A matcher replica's durable book (`GetBookSnapshot`)."""
    async with mesh_channel(address) as channel:
        snapshot: matcher_pb2.BookSnapshot = await matcher_pb2_grpc.MatcherStub(
            channel
        ).GetBookSnapshot(
            matcher_pb2.BookSnapshotQuery(symbol=symbol, depth=depth), timeout=CALL_TIMEOUT_S
        )
    return snapshot


async def matcher_trades(
    address: str, symbol: str, after: int, through: int, timeout_s: float = 30.0
) -> list[matcher_pb2.PublicTrade]:
    """The trades `after`+1 .. `through` a matcher still retains, from its own
    `StreamMarketData` (a position at its current book, so no snapshot comes first)."""
    found: list[matcher_pb2.PublicTrade] = []
    async with mesh_channel(address) as channel:
        book = await matcher_pb2_grpc.MatcherStub(channel).GetBookSnapshot(
            matcher_pb2.BookSnapshotQuery(symbol=symbol, depth=1), timeout=CALL_TIMEOUT_S
        )
        request = matcher_pb2.MarketDataRequest(symbols=[symbol])
        request.positions.add(symbol=symbol, book_sequence=book.book_sequence, trade_sequence=after)
        call = matcher_pb2_grpc.MatcherStub(channel).StreamMarketData(request)
        try:
            async with asyncio.timeout(timeout_s):
                async for batch in call:
                    found.extend(trade for trade in batch.trades if trade.symbol == symbol)
                    if found and found[-1].trade_sequence >= through:
                        break
        finally:
            call.cancel()
    return [trade for trade in found if trade.trade_sequence <= through]


def snapshot_levels(snapshot: matcher_pb2.BookSnapshot) -> LevelRows:
    """A matcher snapshot's levels as `LocalBook.levels` gives them."""
    return (
        [(level.price_ticks, level.total_lots, level.order_count) for level in snapshot.bids],
        [(level.price_ticks, level.total_lots, level.order_count) for level in snapshot.asks],
    )


def status_counters(address: str) -> tuple[dict[str, int], dict[str, str]]:
    """A service's `oms.v1.Status` report (plaintext): its counters and its info."""
    with grpc.insecure_channel(address) as channel:
        report = status_pb2_grpc.StatusStub(channel).GetStatus(
            status_pb2.StatusRequest(), timeout=CALL_TIMEOUT_S
        )
    return dict(report.counters), dict(report.info)


# --- the fault ----------------------------------------------------------------------------


def kill_child_listening(supervisor_pid: int, address: str) -> int:
    """SIGKILL the one descendant of `supervisor_pid` started with `--listen address`
    (by its pid: nothing else on the machine is touched); that pid."""
    children: dict[int, list[int]] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
            commands[int(entry.name)] = (entry / "cmdline").read_text().split("\0")
    found: list[int] = []
    pending = [supervisor_pid]
    while pending:
        pid = pending.pop()
        for child in children.get(pid, []):
            argv = commands.get(child, [])
            if "--listen" in argv and argv[argv.index("--listen") + 1 :][:1] == [address]:
                found.append(child)
            pending.append(child)
    assert len(found) == 1, f"processes listening on {address} under {supervisor_pid}: {found}"
    os.kill(found[0], signal.SIGKILL)
    return found[0]
