"""`oms bench marketdata`: the market-data service fanning the matchers' feed out to subscribers.

A throwaway mesh is started as `make run` starts it (`oms up`, every service its own
process, `oms marketdata` among them), with a market catalog of four symbols (the
packaged one plus one market of its own in an existing matcher group when the packaged
one holds fewer: `oms up` starts the packaged catalog's matcher groups whatever
OMS_MARKETS_FILE says, while every service reads the catalog from OMS_MARKETS_FILE).
Users are created and funded through the admin API, and each symbol's book is given
`--levels` resting orders per side. Then, per phase, orders are placed at `--rate`
orders/s, open loop (`open_loop.py`: each order at its slot), on `Trade` streams (one per
user, each order written with whatever else is queued on its stream: the cheaper of the
gateway's two APIs, leaving more of the cores to the market data), spread evenly over
the symbols: per symbol, in turn, a passive buy and a passive sell at one of the
`--levels` prices below and above the reference price, and an IOC buy and an IOC sell
that each take the best level (makers and takers are different users, so no order
meets its own user's). The book keeps its depth and every taker trades.

The phases: no subscriber first, then each count of `--subscribers`, then none again
(the two phases without subscribers give the run-to-run swing of the matchers' CPU).
A subscriber follows one symbol (in turn over the symbols): its book at one of
`--depths` (in turn) and its trades, two streams. The subscribers run in
`--subscriber-processes` processes of their own (`market_data_subscribers.py`), at
most `STREAMS_PER_CONNECTION` streams per connection (the service's limit per
connection is 200), all of them started and counted by the service before the phase.

Per phase, measured over the same window:

- delay: the subscriber's wall clock at receipt minus the `consensus_time_ms` each
  `OrderBookDiff` and `MarketTrade` carries (the matcher leader's wall clock at its log
  entry; one machine, one clock); whole milliseconds truncated, so up to 1 ms long;
- the matchers' CPU per acknowledged order (every `oms matcher` process, from /proc);
- the service's CPU per delivered message (its CPU seconds over the messages counted
  at the subscribers: diffs, trade messages and resynchronising books), also beyond what
  it used per second without subscribers; its resident memory (VmRSS) at the end of the
  phase, and per subscriber: (RSS once the phase's N subscribers joined - RSS just
  before) / N, both read before the orders start (the service's trade history grows
  all run long, so RSS phase against phase would count it too);
- slow consumers: books sent again mid-stream (resynchronised) and trade streams ended
  RESOURCE_EXHAUSTED (resumed from their last trade, as a client would).

Below the table, the number of subscribers at which the cores would be full, an
estimate from the CPU per delivered message and each subscriber's message rate, and
each goal beside its figure.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import overload

import grpc
import uvloop

from gateway.market_data_client import MarketDataClient
from gateway.signed_channel import GatewayCallError
from gateway.signing import signed_metadata
from protos.oms.v1 import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    status_pb2,
    status_pb2_grpc,
)
from services.bench.e2e_bench import (
    TRADE_METHOD,
    User,
    _funded_users,
    _now_ms,
    _quiet,
    _reason,
)
from services.bench.latency import percentile, summarize_ms
from services.bench.market_data_subscribers import BIN_MS, READY, START, STOP, Tally
from services.bench.mesh_launch import LaunchedMesh, _cpu_seconds
from services.bench.open_loop import open_loop
from services.clients.channels import gateway_channel
from services.market_data.depth_view import STREAM_DEPTHS
from services.markets.catalog import Market, MarketCatalog, load_catalog, parse_catalog
from services.runtime.collector import settle_long_lived_state

SUBSCRIBER_MODULE = "services.bench.market_data_subscribers"
MARKET_DATA_PROCESS = "marketdata"  # as `LaunchedMesh.service_processes` names it
MARKETS_FILE_VARIABLE = "OMS_MARKETS_FILE"
SYMBOLS = 4
# A fourth market when the packaged catalog has three, in a group `oms up` starts (g2,
# beside SOL-USDT: two symbols per group).
FOURTH_MARKET = """
[[market]]
symbol = "XRP-USDT"
base_asset = "XRP"
quote_asset = "USDT"
lot_size = 1_000_000
tick_size = 1
min_notional = 1_000_000
price_band_bps = 1_500
reference_price_ticks = 1_200_000
maker_fee_ppm = 1_000
taker_fee_ppm = 2_000
matcher_group = "g2"
"""
STREAMS_PER_CONNECTION = 100  # the service refuses past 200 per connection
FUNDS = 10**15  # of every asset, per user
PRICE_STRIDE = 7  # passive orders visit the levels in this stride
PLACE_OUTSTANDING = 1_000  # unanswered orders, at most (as e2e's per stream)
STREAM_BATCH = 100  # orders per Trade batch, at most
ANSWER_TIMEOUT_S = 30.0
MARKET_DATA_TIMEOUT_S = 120.0  # the service reads every book from its matcher group
READY_TIMEOUT_S = 120.0  # every subscriber's streams started
RESULT_TIMEOUT_S = 120.0  # a subscriber process's tally after `stop`
EXIT_TIMEOUT_S = 30.0
POLL_S = 0.2
LEGEND = (
    ("subs, procs", "subscribers (two streams each), and the processes they ran in"),
    (
        "msgs/s, /sub/s",
        "messages delivered to all subscribers, counted at the subscribers (diffs, trade"
        " messages, books resent), and per subscriber",
    ),
    (
        "p50, p99, max ms",
        "the matcher's log entry (consensus_time_ms) to the subscriber's receipt; whole ms"
        " truncated, so up to 1 ms long",
    ),
    ("match µs", "the matchers' CPU per acknowledged order"),
    (
        "svc µs, +svc µs, µs/upd, svc %",
        "the market-data service's CPU per delivered message; the same beyond its CPU per"
        " second in the first phase (no subscriber); its CPU per matcher update delivered"
        " (the book updates the diffs carried, and the trades); its CPU in % of a core",
    ),
    (
        "RSS MiB, KiB/sub",
        "the service's resident memory at the phase's end; its growth as the phase's"
        " subscribers joined (before the orders), per subscriber",
    ),
    ("cli µs", "the subscribers' own CPU per message"),
    (
        "resync, ended",
        "books resent mid-stream (the stream fell behind); trade streams ended"
        " RESOURCE_EXHAUSTED (then resumed from their last trade)",
    ),
)
# The goals the figures are held to.
GOAL_SUBSCRIBERS = 100
GOAL_P99_MS = 10.0
GOAL_SERVICE_US = 20.0
# The matchers' CPU per order with subscribers is held to the swing between the two
# phases without, and at least this fraction of their mean (two samples make a small
# swing by chance; a 2-core VM swings far more from run to run).
SWING_FLOOR = 0.10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--subscribers",
        default="10,100,1000",
        help="subscriber counts, one phase each, after a phase with none (and before another)",
    )
    parser.add_argument("--rate", type=int, default=500, help="orders/s offered in every phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each phase")
    parser.add_argument(
        "--subscriber-processes",
        type=int,
        default=4,
        help="processes the subscribers are spread over (each a Python gRPC client)",
    )
    parser.add_argument(
        "--depths", default="0,10,20", help="book depths the subscribers follow, in turn"
    )
    parser.add_argument(
        "--levels", type=int, default=40, help="resting price levels per side and symbol"
    )
    parser.add_argument(
        "--users", type=int, default=8, help="funded users, half of them makers, a stream each"
    )
    parser.add_argument(
        "--plaintext", action="store_true", help="the mesh without TLS (oms up --plaintext)"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary one")


@dataclass(frozen=True)
class PhaseResult:
    subscribers: int
    processes: int  # the subscribers' processes
    seconds: float
    acked: int
    refused: Counter[str]
    ack_p99_ms: float
    cpu_seconds: dict[str, float]  # by mesh process, over the window
    load_cpu_seconds: float  # the bench's own (placing the orders)
    subscriber_cpu_seconds: float  # the subscribers' processes
    service_rss_bytes: int  # the market-data service's, at the end of the window
    # Its RSS just before the phase's subscribers joined, and once all had joined (before
    # the orders): their own memory, apart from what the service keeps as trades go by.
    service_rss_before_join: int
    service_rss_joined: int
    service_counters: dict[str, int]  # its status counters' change over the window
    # Messages waiting in its streams' queues once the orders stopped: how far behind the
    # service's own writers were (a backlog elsewhere is in gRPC and the subscribers).
    service_queued_at_end: int
    received: Tally  # what the subscribers counted over the window

    def feed_counter(self, name: str) -> int:
        """One of the service's `FeedStatistics` over the window (`feed_<name>` in its
        status; `feed.<name>` in its first release)."""
        counters = self.service_counters
        return counters.get(f"feed_{name}", counters.get(f"feed.{name}", 0))

    @property
    def matcher_us_per_order(self) -> float:
        used = sum(cpu for name, cpu in self.cpu_seconds.items() if name.startswith("matcher-"))
        return 1e6 * used / self.acked if self.acked else math.nan

    @property
    def service_cpu_seconds(self) -> float:
        return self.cpu_seconds.get(MARKET_DATA_PROCESS, 0.0)

    @property
    def other_cpu_seconds(self) -> float:
        """The rest of the mesh, etcd and PostgreSQL included."""
        return sum(self.cpu_seconds.values()) - self.service_cpu_seconds

    def service_added_us(self, baseline: PhaseResult) -> float:
        """The service's CPU per delivered message beyond what it used, per second, in the
        phase without subscribers (following the matchers, the tickers)."""
        idle = baseline.service_cpu_seconds / baseline.seconds if baseline.seconds > 0 else 0.0
        return self.per_message_us(self.service_cpu_seconds - idle * self.seconds)

    def per_update_us(self, cpu_seconds: float) -> float:
        """CPU per matcher update delivered (book updates a diff carried, and trades)."""
        updates = self.received.updates
        return 1e6 * cpu_seconds / updates if updates else math.nan

    def per_message_us(self, cpu_seconds: float) -> float:
        delivered = self.received.delivered
        return 1e6 * cpu_seconds / delivered if delivered else math.nan

    @property
    def messages_per_subscriber_s(self) -> float:
        if not self.subscribers or self.seconds <= 0:
            return math.nan
        return self.received.delivered / self.subscribers / self.seconds

    @property
    def rss_per_subscriber_kib(self) -> float:
        if not self.subscribers:
            return math.nan
        return (self.service_rss_joined - self.service_rss_before_join) / 1024 / self.subscribers

    @property
    def slow_consumers(self) -> int:
        return self.received.resync_books + self.received.ended

    def delay_ms(self, fraction: float) -> float:
        return percentile(_Histogram(self.received.delays), fraction)


class _Histogram(Sequence[float]):
    """Binned delays as the sorted list of their values (ms), for `latency.percentile`."""

    def __init__(self, bins: Counter[int]) -> None:
        self.keys = sorted(bins)
        self.ends = list(itertools.accumulate(bins[key] for key in self.keys))

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[float]: ...
    def __getitem__(self, index: int | slice) -> float | Sequence[float]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self.keys[bisect.bisect_right(self.ends, index)] * BIN_MS


def run(arguments: argparse.Namespace) -> int:
    try:
        counts = [int(part) for part in arguments.subscribers.split(",") if part.strip()]
        depths = [int(part) for part in arguments.depths.split(",") if part.strip()]
    except ValueError:
        print("oms bench marketdata: --subscribers and --depths take numbers", file=sys.stderr)
        return 2
    if any(count < 0 for count in counts) or not depths or arguments.rate <= 0:
        print("oms bench marketdata: counts >= 0, a depth, a rate > 0", file=sys.stderr)
        return 2
    if set(depths) - STREAM_DEPTHS:
        print(
            f"oms bench marketdata: --depths from {', '.join(map(str, sorted(STREAM_DEPTHS)))}",
            file=sys.stderr,
        )
        return 2
    if arguments.state_dir is None:
        with tempfile.TemporaryDirectory(prefix="oms-bench-marketdata-") as folder:
            return _run_in(Path(folder), arguments, counts, depths)
    return _run_in(arguments.state_dir, arguments, counts, depths)


def _run_in(
    state_dir: Path, arguments: argparse.Namespace, counts: list[int], depths: list[int]
) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    catalog, markets_file = _catalog(state_dir)
    markets = list(catalog.markets[:SYMBOLS])
    print(
        f"symbols: {', '.join(m.symbol for m in markets)}"
        + (f" (catalog {markets_file})" if markets_file else " (the packaged catalog)"),
        flush=True,
    )
    print(f"machine: {_machine()} before", flush=True)
    print(f"starting the mesh under {state_dir} ...", flush=True)
    # `oms up` hands its environment to every service: they all read this catalog.
    previous = os.environ.get(MARKETS_FILE_VARIABLE)
    if markets_file is not None:
        os.environ[MARKETS_FILE_VARIABLE] = str(markets_file)
    try:
        with LaunchedMesh(state_dir / "mesh", plaintext=arguments.plaintext) as mesh:
            results = uvloop.run(_measure(mesh, markets, [0, *counts, 0], depths, arguments))
    finally:
        if previous is None:
            os.environ.pop(MARKETS_FILE_VARIABLE, None)
        else:
            os.environ[MARKETS_FILE_VARIABLE] = previous
    print(f"machine: {_machine()} after", flush=True)
    _report(results, arguments, depths)
    return 0


def _catalog(state_dir: Path) -> tuple[MarketCatalog, Path | None]:
    """The packaged catalog, or it and a fourth market in a file of the run's own."""
    packaged = load_catalog()
    if len(packaged.markets) >= SYMBOLS:
        return packaged, None
    text = resources.files("services.markets").joinpath("default_markets.toml").read_text()
    text += FOURTH_MARKET
    catalog = parse_catalog(text)
    path = state_dir / "markets.toml"
    path.write_text(text)
    return catalog, path


def _machine() -> str:
    one, five, fifteen = os.getloadavg()
    return (
        f"{os.cpu_count()} cores, load average (1 / 5 / 15 min)"
        f" {one:.2f} / {five:.2f} / {fifteen:.2f}"
    )


# --- the orders ---------------------------------------------------------------------------


@dataclass
class OrderFlow:
    """Which order number n is: the symbols in turn; per symbol, in turn, a passive buy, a
    passive sell, an IOC buy and an IOC sell that each take the best level."""

    markets: Sequence[Market]
    makers: Sequence[User]
    takers: Sequence[User]
    levels: int
    lots: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        # Every order at least the market's minimum notional, at the lowest price used.
        self.lots = {
            market.symbol: max(
                1,
                math.ceil(
                    market.min_notional
                    / ((market.reference_price_ticks - self.levels - 1) * market.tick_size)
                ),
            )
            for market in self.markets
        }

    def order(self, number: int) -> tuple[User, gateway_pb2.PlaceOrderRequest]:
        market = self.markets[number % len(self.markets)]
        turn = number // len(self.markets)
        kind, step = turn % 4, turn // 4
        buy = kind in (0, 2)
        if kind < 2:
            offset = 1 + (step * PRICE_STRIDE) % self.levels
            return self.makers[number % len(self.makers)], self._request(
                market, number, buy, offset, common_pb2.TIME_IN_FORCE_GTC
            )
        return self.takers[number % len(self.takers)], self._request(
            market, number, buy, -(self.levels + 1), common_pb2.TIME_IN_FORCE_IOC
        )

    def resting(self) -> Iterator[tuple[User, gateway_pb2.PlaceOrderRequest]]:
        """One passive order per level, side and symbol: the book before the first phase."""
        number = itertools.count(1 << 40)  # client order ids apart from the flow's
        for market in self.markets:
            for offset in range(1, self.levels + 1):
                for buy in (True, False):
                    n = next(number)
                    yield (
                        self.makers[n % len(self.makers)],
                        self._request(market, n, buy, offset, common_pb2.TIME_IN_FORCE_GTC),
                    )

    def _request(
        self,
        market: Market,
        number: int,
        buy: bool,
        offset: int,
        time_in_force: common_pb2.TimeInForce.ValueType,
    ) -> gateway_pb2.PlaceOrderRequest:
        """`offset` ticks away from the reference price on the order's own side (a
        negative one crosses the book)."""
        reference = market.reference_price_ticks
        return gateway_pb2.PlaceOrderRequest(
            user_id=0,
            client_order_id=f"md{number}",
            symbol=market.symbol,
            side=common_pb2.SIDE_BUY if buy else common_pb2.SIDE_SELL,
            order_type=common_pb2.ORDER_TYPE_LIMIT,
            time_in_force=time_in_force,
            price_ticks=reference - offset if buy else reference + offset,
            quantity_lots=self.lots[market.symbol],
        )


@dataclass
class Placed:
    acked: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)


class TradeStreams:
    """Orders on `Trade` streams, one per user (a stream is signed by its user's key): each
    order is queued on its user's stream and written with whatever else is queued there
    (at most `STREAM_BATCH` per batch), and its answer comes back by request id."""

    def __init__(self, orders: gateway_pb2_grpc.OrderGatewayStub, users: Sequence[User]) -> None:
        self.orders = orders
        self.queues: dict[int, asyncio.Queue[gateway_pb2.TradeRequest]] = {}
        self.waiting: dict[int, asyncio.Future[gateway_pb2.TradeResponse]] = {}
        self.request_ids = itertools.count(1)
        self.readers: list[asyncio.Task[None]] = []
        for user in users:
            self.queues[user.user_id] = asyncio.Queue()
            metadata = signed_metadata(user.api_key, user.api_secret, TRADE_METHOD, None, _now_ms())
            call = orders.Trade(self._batches(self.queues[user.user_id]), metadata=metadata)
            self.readers.append(asyncio.create_task(self._answers(call)))

    async def place(self, request: gateway_pb2.PlaceOrderRequest) -> gateway_pb2.TradeResponse:
        request_id = next(self.request_ids)
        answer = self.waiting[request_id] = asyncio.get_running_loop().create_future()
        self.queues[request.user_id].put_nowait(
            gateway_pb2.TradeRequest(request_id=request_id, place=request)
        )
        try:
            response: gateway_pb2.TradeResponse = await answer
        finally:
            self.waiting.pop(request_id, None)
        return response

    @staticmethod
    async def _batches(
        queue: asyncio.Queue[gateway_pb2.TradeRequest],
    ) -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
        while True:
            batch = gateway_pb2.TradeRequestBatch(requests=[await queue.get()])
            while not queue.empty() and len(batch.requests) < STREAM_BATCH:
                batch.requests.append(queue.get_nowait())
            yield batch

    async def _answers(self, call: AsyncIterator[gateway_pb2.TradeResponseBatch]) -> None:
        async for response_batch in call:
            for response in response_batch.responses:
                answer = self.waiting.get(response.request_id)
                if answer is not None and not answer.done():
                    answer.set_result(response)

    async def close(self) -> None:
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


async def _place_all(
    streams: TradeStreams, requests: Iterator[tuple[User, gateway_pb2.PlaceOrderRequest]]
) -> Placed:
    """Every request at once (the book before the first phase), each answered."""
    placed = Placed()

    async def one(user: User, request: gateway_pb2.PlaceOrderRequest) -> None:
        request.user_id = user.user_id
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            response = await streams.place(request)
        if response.WhichOneof("response") == "place" and response.place.accepted:
            placed.acked += 1
        else:
            placed.refused[_reason(response)] += 1

    await asyncio.gather(*(one(user, request) for user, request in requests))
    return placed


async def _place(
    streams: TradeStreams,
    requests: Iterator[tuple[User, gateway_pb2.PlaceOrderRequest]],
    *,
    rate: int,
    seconds: float,
) -> tuple[Placed, float]:
    """Each request at its slot (`open_loop`), its latency from the slot to its ack."""
    placed = Placed()

    async def one(slot_ns: int) -> None:
        try:
            user, request = next(requests)
        except StopIteration:
            return
        request.user_id = user.user_id
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                response = await streams.place(request)
        except TimeoutError:
            placed.refused["no answer"] += 1
            return
        if response.WhichOneof("response") == "place" and response.place.accepted:
            placed.acked += 1
            placed.latencies_ns.append(time.perf_counter_ns() - slot_ns)
        else:
            placed.refused[_reason(response)] += 1

    elapsed = await open_loop(one, rate=rate, seconds=seconds, outstanding=PLACE_OUTSTANDING)
    return placed, elapsed


async def _fund_bases(
    channel: grpc.aio.Channel, admin: tuple[str, str], users: Sequence[User], assets: Sequence[str]
) -> None:
    """Deposits of the base assets `_funded_users` does not make (it funds USDT and BTC)."""
    stub = gateway_pb2_grpc.AdminGatewayStub(channel)
    method = "/oms.v1.AdminGateway/Deposit"
    for user in users:
        for asset in assets:
            request = gateway_pb2.TransferRequest(
                user_id=user.user_id,
                asset=asset,
                amount=FUNDS,
                transfer_id=f"bench-marketdata-{user.user_id}-{asset}",
            )
            metadata = signed_metadata(*admin, method, request, _now_ms())
            ack = await stub.Deposit(request, metadata=metadata, timeout=30)
            if not ack.accepted:
                raise RuntimeError(f"deposit of {asset} for user {user.user_id} refused: {ack}")


# --- the subscribers ----------------------------------------------------------------------


@dataclass
class SubscriberProcesses:
    """The subscribers of one phase, spread over processes of their own.

    Started with `subprocess.Popen` without closing descriptors, so with posix_spawn,
    not fork: gRPC's fork handlers (and their warnings) stay out of it, and only the
    pipes are inherited (Python's and gRPC's own descriptors are close-on-exec). Their
    lines are read in threads: a line not come by its deadline ends the wait, and the
    process is killed on `close`, which ends the read."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        mesh: LaunchedMesh,
        subscriptions: list[tuple[str, int]],
        processes: int,
        log_folder: Path,
    ) -> SubscriberProcesses:
        record = mesh.record
        assert record is not None
        started = cls()
        count = min(processes, len(subscriptions))
        for index in range(count):
            spec = {
                "address": record.market_data,
                "state_dir": str(mesh.state_dir),
                "tls": record.tls,
                "subscriptions": subscriptions[index::count],
                "streams_per_channel": STREAMS_PER_CONNECTION,
            }
            log = (log_folder / f"subscribers-{len(subscriptions)}-{index + 1}.log").open("ab")
            with log:
                started.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", SUBSCRIBER_MODULE, json.dumps(spec)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        close_fds=False,
                    )
                )
        return started

    async def wait_ready(self) -> None:
        for process in self.processes:
            line = await self._line(process, READY_TIMEOUT_S)
            if line != READY:
                raise RuntimeError(f"a subscriber process did not start its streams: {line}")

    def say(self, command: str) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(command.encode() + b"\n")
            process.stdin.flush()

    async def tallies(self) -> list[Tally]:
        """Each process's tally after `stop`."""
        tallies = []
        for process in self.processes:
            answer = await self._line(process, RESULT_TIMEOUT_S)
            if not answer.startswith("{"):
                raise RuntimeError(f"a subscriber process gave no tally: {answer}")
            tallies.append(Tally.from_json(answer))
        return tallies

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(process.pid) for process in self.processes)

    async def close(self) -> None:
        for process in self.processes:
            if process.poll() is None and process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()  # the process exits when its input ends
        for process in self.processes:
            try:
                await asyncio.to_thread(process.wait, EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
            if process.stdout is not None:
                process.stdout.close()

    @staticmethod
    async def _line(process: subprocess.Popen[bytes], timeout_s: float) -> str:
        assert process.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                line = await asyncio.to_thread(process.stdout.readline)
        except TimeoutError:
            return f"nothing in {timeout_s:g} s"
        return line.decode().strip() or f"its output ended (exit status {process.poll()})"


def _subscriptions(
    count: int, markets: Sequence[Market], depths: Sequence[int]
) -> list[tuple[str, int]]:
    """Subscriber i follows symbol i mod 4 at depth i mod len(depths): every pair in turn."""
    return [
        (markets[index % len(markets)].symbol, depths[index % len(depths)])
        for index in range(count)
    ]


# --- the phases ---------------------------------------------------------------------------


async def _measure(
    mesh: LaunchedMesh,
    markets: Sequence[Market],
    counts: Sequence[int],
    depths: Sequence[int],
    arguments: argparse.Namespace,
) -> list[PhaseResult]:
    record = mesh.record
    assert record is not None
    if not record.market_data:
        raise RuntimeError("the mesh has no market-data service (mesh.json: market_data)")
    async with (
        gateway_channel(record.gateway) as channel,
        MarketDataClient(record.market_data) as market_data,
    ):
        admin = (record.admin_api_key, record.admin_api_secret)
        users = await _funded_users(channel, *admin, max(2, arguments.users))
        bases = sorted({m.base_asset for m in markets} - {"BTC"})
        await _fund_bases(channel, admin, users, bases)
        await _wait_for_books(market_data, markets)
        half = len(users) // 2
        flow = OrderFlow(markets, users[:half], users[half:], arguments.levels)
        orders = TradeStreams(gateway_pb2_grpc.OrderGatewayStub(channel), users)
        try:
            resting = await _place_all(orders, flow.resting())
            print(
                f"resting book: {resting.acked} orders placed, {arguments.levels} levels per side"
                " and symbol" + _refusals(resting.refused),
                flush=True,
            )
            settle_long_lived_state()  # the bench's own collector, as the services'
            phases = Phases(mesh, market_data, orders, flow, markets, depths, arguments)
            results: list[PhaseResult] = []
            print(_header(), flush=True)
            for count in counts:
                result = await phases.measure(count)
                results.append(result)
                print(_line(result, results[0]), flush=True)
            return results
        finally:
            await orders.close()


async def _wait_for_books(market_data: MarketDataClient, markets: Sequence[Market]) -> None:
    """Until the service has read every symbol's book from its matcher group."""
    deadline = time.monotonic() + MARKET_DATA_TIMEOUT_S
    for market in markets:
        while True:
            try:
                await market_data.order_book(market.symbol, 1)
                break
            except GatewayCallError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the market-data service has no book of {market.symbol}: {error}"
                    ) from error
                await asyncio.sleep(POLL_S)


@dataclass
class Phases:
    """What every phase shares: the mesh, its clients, the order flow."""

    mesh: LaunchedMesh
    market_data: MarketDataClient
    orders: TradeStreams
    flow: OrderFlow
    markets: Sequence[Market]
    depths: Sequence[int]
    arguments: argparse.Namespace
    numbers: Iterator[int] = field(default_factory=itertools.count)

    async def measure(self, count: int) -> PhaseResult:
        """One phase with `count` subscribers."""
        mesh, market_data, arguments = self.mesh, self.market_data, self.arguments
        await _wait_for_streams(market_data, 0)  # the last phase's subscribers gone
        subscribers = SubscriberProcesses()
        rss_before_join = rss_joined = _service_rss(mesh)
        try:
            if count:
                subscribers = SubscriberProcesses.start(
                    mesh,
                    _subscriptions(count, self.markets, self.depths),
                    arguments.subscriber_processes,
                    mesh.state_dir,
                )
                await subscribers.wait_ready()
                await _wait_for_streams(market_data, 2 * count)
                rss_joined = _service_rss(mesh)
            await _quiet(mesh)
            counters_before = await _service_counters(market_data)
            cpu_before = mesh.service_cpu_seconds()
            subscriber_cpu_before = subscribers.cpu_seconds()
            load_before = time.process_time()
            subscribers.say(START)
            placed, elapsed = await _place(
                self.orders,
                (self.flow.order(number) for number in self.numbers),
                rate=arguments.rate,
                seconds=arguments.seconds,
            )
            subscribers.say(STOP)
            cpu_after = mesh.service_cpu_seconds()
            counters_after = await _service_counters(market_data)
            load_used = time.process_time() - load_before
            service_rss = _service_rss(mesh)
            tallies = await subscribers.tallies()
            subscriber_cpu = subscribers.cpu_seconds() - subscriber_cpu_before
        finally:
            await subscribers.close()
        received = Tally()
        for tally in tallies:
            received.add(tally)
        return PhaseResult(
            subscribers=count,
            processes=len(subscribers.processes),
            seconds=elapsed,
            acked=placed.acked,
            refused=placed.refused,
            ack_p99_ms=summarize_ms(placed.latencies_ns)[1],
            cpu_seconds={
                name: used - cpu_before.get(name, 0.0) for name, used in sorted(cpu_after.items())
            },
            load_cpu_seconds=load_used,
            subscriber_cpu_seconds=subscriber_cpu,
            service_rss_bytes=service_rss,
            service_rss_before_join=rss_before_join,
            service_rss_joined=rss_joined,
            service_counters={
                name: value - counters_before.get(name, 0) for name, value in counters_after.items()
            },
            service_queued_at_end=counters_after.get("queued_messages", 0),
            received=received,
        )


async def _wait_for_streams(market_data: MarketDataClient, streams: int) -> None:
    """Until the service holds exactly `streams` streams: every stream of the phase's
    subscribers (a trade stream from now on sends nothing to show it started), and no
    stream of an earlier phase's."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        held = (await _service_counters(market_data)).get("streams", 0)
        if held == streams:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the market-data service holds {held} of {streams} streams")
        await asyncio.sleep(POLL_S)


STATUS_TIMEOUT_S = 120.0


async def _service_counters(market_data: MarketDataClient) -> dict[str, int]:
    """The market-data service's status counters (its public port serves oms.v1.Status)."""
    # A service saturated by its subscribers answers late: its figures are the point.
    report = await status_pb2_grpc.StatusStub(market_data.channel).GetStatus(
        status_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S
    )
    return dict(report.counters)


def _service_rss(mesh: LaunchedMesh) -> int:
    return sum(_rss_bytes(pid) for pid in mesh.service_processes()[MARKET_DATA_PROCESS])


def _rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it exited)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# --- the report ---------------------------------------------------------------------------


def _header() -> str:
    return (
        f"{'subs':>5}{'procs':>6}{'orders/s':>9}{'msgs/s':>9}{'/sub/s':>7}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'max ms':>9}{'match µs':>9}{'svc µs':>8}{'+svc µs':>8}"
        f"{'µs/upd':>8}{'svc %':>7}"
        f"{'RSS MiB':>8}{'KiB/sub':>8}{'cli µs':>8}{'resync':>7}{'ended':>6}"
    )


def _line(result: PhaseResult, baseline: PhaseResult) -> str:
    received = result.received
    seconds = max(result.seconds, 1e-9)
    return (
        f"{result.subscribers:>5,}{result.processes:>6}{result.acked / seconds:>9,.0f}"
        f"{received.delivered / seconds:>9,.0f}{result.messages_per_subscriber_s:>7.1f}"
        f"{result.delay_ms(0.50):>8.1f}{result.delay_ms(0.99):>8.1f}{result.delay_ms(1.0):>9.1f}"
        f"{result.matcher_us_per_order:>9.0f}"
        f"{result.per_message_us(result.service_cpu_seconds):>8.1f}"
        f"{result.service_added_us(baseline):>8.1f}"
        f"{result.per_update_us(result.service_cpu_seconds):>8.1f}"
        f"{100 * result.service_cpu_seconds / seconds:>7.1f}"
        f"{result.service_rss_bytes / 2**20:>8.1f}{result.rss_per_subscriber_kib:>8.1f}"
        f"{result.per_message_us(result.subscriber_cpu_seconds):>8.1f}"
        f"{received.resync_books:>7,}{received.ended:>6,}"
    )


def _refusals(refused: Counter[str]) -> str:
    if not refused:
        return ""
    return "; refused: " + ", ".join(f"{reason} {n:,}" for reason, n in refused.most_common())


def _report(
    results: Sequence[PhaseResult], arguments: argparse.Namespace, depths: Sequence[int]
) -> None:
    print()
    print(
        f"oms bench marketdata: {arguments.rate:,} orders/s offered on {SYMBOLS} symbols,"
        f" {arguments.seconds:g} s per phase; a subscriber follows one symbol's book (depths"
        f" {', '.join(map(str, depths))} in turn) and its trades"
    )
    print(_header())
    for result in results:
        print(_line(result, results[0]))
    print()
    for column, meaning in LEGEND:
        print(f"  {column}: {meaning}")
    print("\nCPU, % of a core, by process:")
    names = sorted({name for result in results for name in result.cpu_seconds})
    print(f"{'subs':>5}" + "".join(f"{name:>12}" for name in names) + f"{'bench':>9}{'subs':>9}")
    for result in results:
        seconds = max(result.seconds, 1e-9)
        print(
            f"{result.subscribers:>5,}"
            + "".join(
                f"{100 * result.cpu_seconds.get(name, 0.0) / seconds:>12.1f}" for name in names
            )
            + f"{100 * result.load_cpu_seconds / seconds:>9.1f}"
            + f"{100 * result.subscriber_cpu_seconds / seconds:>9.1f}"
        )
    print("\norders, slow consumers and errors, by phase:")
    for result in results:
        received = result.received
        offered = arguments.rate * arguments.seconds  # one order per slot
        print(
            f"  {result.subscribers:,} subscribers: {result.acked:,} orders acknowledged"
            f" ({100 * result.acked / offered if offered else 0:.0f}% of those offered), ack p99"
            f" {result.ack_p99_ms:.1f} ms; {received.resync_books:,} books resent and"
            f" {received.ended:,} trade streams ended at the subscribers; the service counted"
            f" {result.feed_counter('resyncs'):,} resyncs and"
            f" {result.feed_counter('streams_ended_behind'):,} ended,"
            f" {result.feed_counter('messages_offered'):,} messages offered and"
            f" {result.service_queued_at_end:,} queued in it at the end,"
            f" {received.broken_chains:,} broken chains"
            + (f"; stream errors: {dict(received.stream_errors)}" if received.stream_errors else "")
            + _refusals(result.refused)
        )
    for line in _saturation_lines(results):
        print(line)
    print("\ngoals (the figure, then the goal):")
    for line in _goal_lines(results):
        print("  " + line)


def _saturation_lines(results: Sequence[PhaseResult]) -> list[str]:
    """Subscribers at which the cores would be full, an estimate linear in N from each
    phase with subscribers: the cores the mesh used at the rate without subscribers, plus
    N x (messages per subscriber per second) x (the service's CPU per message beyond its
    CPU without subscribers)."""
    with_subscribers = [r for r in results if r.subscribers and r.received.delivered]
    if not with_subscribers:
        return []
    baseline = results[0]
    cores = os.cpu_count() or 1
    seconds = max(baseline.seconds, 1e-9)
    service_idle = baseline.service_cpu_seconds / seconds  # cores, without subscribers
    others = baseline.other_cpu_seconds / seconds  # the rest of the mesh
    load = baseline.load_cpu_seconds / seconds  # the bench placing the orders

    def subscribers(free_cores: float, per_subscriber: float, seconds_per_message: float) -> str:
        if free_cores <= 0 or not seconds_per_message > 0 or not per_subscriber > 0:
            return "none"
        return f"{free_cores / (per_subscriber * seconds_per_message):,.0f}"

    lines = [
        f"\nsaturation of the {cores} cores, an estimate (linear in the subscribers) from each"
        f" phase; the mesh without subscribers at {baseline.acked / seconds:,.0f} orders/s used"
        f" {100 * (others + service_idle):.0f}% of a core, the bench's orders"
        f" {100 * load:.0f}%. A subscriber's messages per second fall as the load rises"
        " (more matcher updates per diff): the lightest phase gives the safest figure.",
        f"{'subs':>7}{'msgs/s/sub':>12}{'+svc µs':>9}{'cli µs':>8}"
        f"{'beside the mesh':>17}{'and clients, as here':>22}{'service alone':>15}",
    ]
    for result in with_subscribers:
        per_subscriber = result.messages_per_subscriber_s
        service_s = result.service_added_us(baseline) / 1e6
        client_s = result.per_message_us(result.subscriber_cpu_seconds) / 1e6
        free = cores - others - service_idle
        beside = subscribers(free, per_subscriber, service_s)
        as_here = subscribers(free - load, per_subscriber, service_s + client_s)
        alone = subscribers(cores - service_idle, per_subscriber, service_s)
        lines.append(
            f"{result.subscribers:>7,}{per_subscriber:>12.1f}{service_s * 1e6:>9.1f}"
            f"{client_s * 1e6:>8.1f}{beside:>17}{as_here:>22}{alone:>15}"
        )
    return lines


def _goal_lines(results: Sequence[PhaseResult]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines: list[str] = []
    at_goal = [r for r in results if r.subscribers == GOAL_SUBSCRIBERS]
    if at_goal:
        p99 = at_goal[0].delay_ms(0.99)
        lines.append(
            f"p99 delay with {GOAL_SUBSCRIBERS} subscribers {p99:.1f} ms (at most"
            f" {GOAL_P99_MS:g} ms): {verdict(p99 <= GOAL_P99_MS)}"
        )
    else:
        lines.append(f"p99 delay with {GOAL_SUBSCRIBERS} subscribers: no such phase")
    for result in results:
        if not result.subscribers:
            continue
        cost = result.per_message_us(result.service_cpu_seconds)
        per_update = result.per_update_us(result.service_cpu_seconds)
        lines.append(
            f"service CPU per delivered message with {result.subscribers:,} subscribers"
            f" {cost:.1f} µs ({result.service_added_us(results[0]):.1f} µs beyond its CPU"
            f" without subscribers; {per_update:.1f} µs per matcher update delivered) (at"
            f" most {GOAL_SERVICE_US:g} µs per message): {verdict(cost <= GOAL_SERVICE_US)}"
        )
    without = [r.matcher_us_per_order for r in results if not r.subscribers]
    if len(without) >= 2:
        mean = sum(without) / len(without)
        swing = max(max(without) - min(without), SWING_FLOOR * mean)
        for result in results:
            if not result.subscribers:
                continue
            value = result.matcher_us_per_order
            lines.append(
                f"matcher CPU per order with {result.subscribers:,} subscribers {value:.0f} µs"
                f" (at most {mean + swing:.0f}: without, {', '.join(f'{v:.0f}' for v in without)}"
                f" µs, their mean plus the larger of their swing and {100 * SWING_FLOOR:.0f}%):"
                f" {verdict(value <= mean + swing)}"
            )
    return lines
