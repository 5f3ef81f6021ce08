"""`oms client instruments|book|trades|ticker|candles`: market data from a terminal.

    oms client instruments                          every symbol, its units, fees, status
    oms client book BTC-USDT [--depth 10] [--follow]
    oms client trades BTC-USDT [--limit 20 | --from SEQ] [--follow]
    oms client ticker [BTC-USDT ...]
    oms client candles BTC-USDT [--interval 1m] [--from WHEN] [--to WHEN] [--limit 30]

They call the market-data service (`oms.v1.MarketData`, `gateway/market_data_client.py`),
found as `--market-data HOST:PORT`, else OMS_MARKETDATA_ADDRESS, else, when no gateway
is named either, the local mesh's (its state folder's record, `oms up` wrote it, whose
development authority then checks the service's certificate). A named service is
reached as the gateway is: TLS checked by OMS_CLIENT_TLS_CA or the system's roots,
OMS_TLS=off for plaintext. Market data is public unless the mesh says otherwise
(OMS_MARKETDATA_PUBLIC=false): then a key with the READ scope signs every call, the
same `--api-key` and `--api-secret`/`--private-key-file` (or OMS_API_KEY, OMS_API_SECRET)
as the other client commands; a key given is used either way.

Figures are in the instrument's units (`gateway/market_data_display.py`); `--raw`
prints the integers the system keeps (ticks, lots, ms). A book or trades `--follow`ed
is printed as it changes until Ctrl-C: the book table again after each change (redrawn
in place on a terminal), each trade as a line. A followed stream that breaks (the
service restarting) is followed again, the trades from the last one printed, for at
most 20 s without an answer. Without `--follow`, `trades` prints the trades the service
still holds up to the newest when it was asked (the last `--limit`, or those after
`--from`), then exits. Exit status: 0 done, 1 refused or no answer, 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.client_waits import RETRY_CODES, RETRY_PAUSE_S, WAIT_S, retryable
from gateway.key_command import read_private_key
from gateway.market_data_client import BookOutOfSyncError, LocalBook, MarketDataClient, book_levels
from gateway.market_data_display import (
    BookView,
    TradeColumns,
    Units,
    book_table,
    candles_table,
    instruments_table,
    ticker_table,
)
from gateway.settings import ClientSettings
from gateway.signed_channel import GatewayCallError
from protos.oms.v1 import market_data_pb2
from services.clients.call_failures import WORDS, failure_words
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.settings import SettingsError, load_settings

ADDRESS_ENV = "OMS_MARKETDATA_ADDRESS"  # ClientSettings.market_data_address

T = TypeVar("T")
COMMAND = "oms client"
INTERVALS = {
    "1m": (market_data_pb2.CANDLE_INTERVAL_1M, 60_000),
    "5m": (market_data_pb2.CANDLE_INTERVAL_5M, 300_000),
    "15m": (market_data_pb2.CANDLE_INTERVAL_15M, 900_000),
    "1h": (market_data_pb2.CANDLE_INTERVAL_1H, 3_600_000),
    "4h": (market_data_pb2.CANDLE_INTERVAL_4H, 14_400_000),
    "1d": (market_data_pb2.CANDLE_INTERVAL_1D, 86_400_000),
}
AGO_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Trades printed without --follow: the held ones up to the newest arrive at once, as the
# stream's first messages; this long without one means the service is not sending them.
CATCH_UP_S = 10.0
# A terminal's "cursor home, clear screen": a followed book is redrawn in place.
REDRAW = "\x1b[H\x1b[2J"


def register_market_data(actions: Any) -> None:
    """The market-data actions of `oms client` (the `--market-data` flag is the client
    parser's, beside `--gateway`)."""
    instruments = actions.add_parser(
        "instruments", help="every instrument: its lot, price step, fees and status"
    )
    _raw_argument(instruments)
    instruments.set_defaults(handler=run_instruments)

    book = actions.add_parser("book", help="a symbol's order book, bids beside asks")
    book.add_argument("symbol", help="e.g. BTC-USDT")
    book.add_argument(
        "--depth",
        type=int,
        default=10,
        help="price levels per side, best first; 0: all (with --follow: 0, 1, 5, 10, 20,"
        " 50, 100, 500 or 1000)",
    )
    book.add_argument(
        "--follow", action="store_true", help="print the book again at every change, until Ctrl-C"
    )
    _raw_argument(book)
    book.set_defaults(handler=run_book)

    trades = actions.add_parser("trades", help="a symbol's recent public trades")
    trades.add_argument("symbol", help="e.g. BTC-USDT")
    trades.add_argument(
        "--from",
        type=int,
        default=None,
        dest="from_sequence",
        metavar="SEQ",
        help="the trades after trade SEQ (the last sequence printed), instead of the last --limit",
    )
    trades.add_argument(
        "--limit", type=int, default=20, help="without --from: the last this many (default 20)"
    )
    trades.add_argument(
        "--follow", action="store_true", help="then print each new trade as it happens"
    )
    _raw_argument(trades)
    trades.set_defaults(handler=run_trades)

    ticker = actions.add_parser(
        "ticker", help="last price, best bid and ask, 24 hours' range and volume"
    )
    ticker.add_argument("symbols", nargs="*", metavar="SYMBOL", help="default: every symbol")
    _raw_argument(ticker)
    ticker.set_defaults(handler=run_ticker)

    candles = actions.add_parser("candles", help="a symbol's OHLCV candles, oldest first")
    candles.add_argument("symbol", help="e.g. BTC-USDT")
    candles.add_argument("--interval", choices=list(INTERVALS), default="1m")
    candles.add_argument(
        "--from",
        default=None,
        dest="from_time",
        metavar="WHEN",
        help="the first candle opens at or after: ms since the epoch, an ISO time (UTC"
        " unless it says), or how long ago (90m, 6h, 2d); default: --limit intervals ago",
    )
    candles.add_argument(
        "--to", default=None, dest="to_time", metavar="WHEN", help="candles opening before"
    )
    candles.add_argument("--limit", type=int, default=30, help="1..1000 candles (default 30)")
    _raw_argument(candles)
    candles.set_defaults(handler=run_candles)


def _raw_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--raw",
        action="store_true",
        help="the integers the system keeps: prices in ticks, sizes in lots, times in ms",
    )


# --- where the service is, and whose key signs -------------------------------------------


@dataclass(frozen=True)
class MarketDataTarget:
    """The service a command calls, and what to run when it does not answer."""

    address: str
    hint: str
    api_key: str = ""
    api_secret: str = ""
    private_key: Ed25519PrivateKey | None = None

    def client(self) -> MarketDataClient:
        return MarketDataClient(
            self.address,
            api_key=self.api_key,
            api_secret="" if self.private_key is not None else self.api_secret,
            private_key=self.private_key,
        )


def market_data_target(arguments: argparse.Namespace) -> MarketDataTarget:
    """The flags, else OMS_MARKETDATA_ADDRESS, else the local mesh's (adopting its TLS)."""
    key, secret, private_key = _key(arguments)
    named = arguments.market_data or load_settings(ClientSettings).market_data_address
    if named:
        hint = "is the address right (--market-data, OMS_MARKETDATA_ADDRESS)?"
        return MarketDataTarget(named, hint, key, secret, private_key)
    if arguments.gateway or "OMS_GATEWAY_ADDRESS" in os.environ:
        # A named gateway is another mesh than the folder's: its market data is named too.
        raise SettingsError(
            "a gateway is named (--gateway, OMS_GATEWAY_ADDRESS): name its mesh's"
            " market-data service too: --market-data HOST:PORT or OMS_MARKETDATA_ADDRESS"
        )
    state_dir = state_dir_of(arguments.state_dir)
    local = LocalMesh.find(state_dir)
    if local is None:
        raise SettingsError(
            f"no mesh under {state_dir}: start one with `make run` (or `oms up`), or name"
            " the market-data service: --market-data HOST:PORT or OMS_MARKETDATA_ADDRESS"
        )
    if not local.record.market_data:
        raise SettingsError(
            f"the mesh under {state_dir} was started before it had a market-data service:"
            " stop it and run `oms up` again (it keeps its data)"
        )
    local.adopt()
    hint = (
        f"is the mesh under {state_dir} running? (`oms status --state-dir {state_dir}`;"
        " `oms up` starts it)"
    )
    return MarketDataTarget(local.record.market_data, hint, key, secret, private_key)


def _key(arguments: argparse.Namespace) -> tuple[str, str, Ed25519PrivateKey | None]:
    """The key that signs the calls, if one is given: a mesh whose market data is not
    public needs one (the user id is not part of a signature)."""
    settings = load_settings(
        ClientSettings,
        overrides={"api_key": arguments.api_key, "api_secret": arguments.api_secret},
    )
    private_key = (
        read_private_key(arguments.private_key_file) if arguments.private_key_file else None
    )
    if settings.api_key and not (settings.api_secret or private_key):
        raise SettingsError(
            "an API key signs with its secret: --api-secret or OMS_API_SECRET (an Ed25519"
            " key: --private-key-file)"
        )
    if (settings.api_secret or private_key) and not settings.api_key:
        raise SettingsError("a secret or private key signs for its key: --api-key or OMS_API_KEY")
    return settings.api_key, settings.api_secret, private_key


# --- calls, waits and refusals ---------------------------------------------------------


class CommandFailedError(Exception):
    """The command cannot go on: its message is printed, the exit status is 1."""


def _why(error: GatewayCallError) -> str:
    """A refusal in the service's words: the contract's reason when it sent one."""
    if error.reason:
        return f"refused: {error.reason.removeprefix('GATEWAY_ERROR_REASON_')}: {error.detail}"
    if error.code in WORDS:
        return failure_words(error.code, error.detail)
    return f"refused: {error.detail}" if error.detail else "refused"


def _own_words(error: GatewayCallError) -> str | None:
    """What the service itself said of a call it could not answer now (the book not read
    from its matcher group yet, say); None when it was not reached."""
    if error.detail and failure_words(error.code, error.detail).endswith(error.detail):
        return error.detail
    return None


def refusal_line(error: GatewayCallError, target: MarketDataTarget) -> str:
    """What a call that failed in the end prints."""
    if error.reason or error.code not in RETRY_CODES:
        return f"{COMMAND}: {_why(error)}"
    said = _own_words(error)
    if said is not None:
        return (
            f"{COMMAND}: the market-data service at {target.address} could not answer"
            f" within {WAIT_S:.0f} s: {said}"
        )
    return (
        f"{COMMAND}: no answer from the market-data service at {target.address} within"
        f" {WAIT_S:.0f} s ({failure_words(error.code, error.detail)}); {target.hint}"
    )


class Patience:
    """How long a command keeps asking a service that does not answer now (restarting,
    or not yet having read a book from its matcher group): `WAIT_S` since the last
    answer, saying once on stderr that it waits."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.said = False

    def answered(self) -> None:
        self.since = None
        self.said = False

    async def wait_after(self, error: GatewayCallError) -> None:
        """Pause before asking again; raises `error` once the patience is spent."""
        if not retryable(error):
            raise error
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since >= WAIT_S:
            raise error
        if not self.said:
            print(f"{COMMAND}: waiting ({_waiting_words(error)})", file=sys.stderr, flush=True)
            self.said = True
        await asyncio.sleep(RETRY_PAUSE_S)


def _waiting_words(error: GatewayCallError) -> str:
    if error.reason:
        return _why(error).removeprefix("refused: ")
    said = _own_words(error)
    if said is not None:
        return said
    return f"no answer from the market-data service: {failure_words(error.code, error.detail)}"


async def answer(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`'s answer, asked again while the service cannot answer now."""
    patience = Patience()
    while True:
        try:
            return await call()
        except GatewayCallError as error:
            await patience.wait_after(error)


def run_market_data(
    arguments: argparse.Namespace,
    action: Callable[[MarketDataClient], Awaitable[int]],
) -> int:
    """Run one command's `action` with a client of the service, in the user's terms."""
    try:
        target = market_data_target(arguments)
    except SettingsError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2

    async def call() -> int:
        async with target.client() as client:
            return await action(client)

    try:
        return asyncio.run(call())
    except SettingsError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    except GatewayCallError as error:
        print(refusal_line(error, target), file=sys.stderr)
        return 1
    except CommandFailedError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0  # Ctrl-C ends a --follow: what the user asked for
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's own flush at
        # exit from failing on the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


async def units_of(client: MarketDataClient, symbol: str, *, raw: bool) -> Units:
    instruments = await answer(client.instruments)
    for instrument in instruments:
        if instrument.symbol == symbol:
            return Units.of(instrument, raw=raw)
    known = ", ".join(item.symbol for item in instruments) or "none"
    raise CommandFailedError(f"no instrument {symbol!r} (the instruments: {known})")


def say(text: str) -> None:
    print(text, flush=True)  # a followed stream is read as it comes, even through a pipe


# --- the commands ------------------------------------------------------------------------


def run_instruments(arguments: argparse.Namespace) -> int:
    async def action(client: MarketDataClient) -> int:
        instruments = await answer(client.instruments)
        if not instruments:
            say("no instruments")
            return 0
        say(instruments_table(instruments, raw=arguments.raw))
        return 0

    return run_market_data(arguments, action)


def run_book(arguments: argparse.Namespace) -> int:
    symbol = arguments.symbol
    if arguments.depth < 0:
        print(f"{COMMAND}: --depth must be 0 (all) or more", file=sys.stderr)
        return 2

    async def action(client: MarketDataClient) -> int:
        units = await units_of(client, symbol, raw=arguments.raw)
        if not arguments.follow:
            book = await answer(lambda: client.order_book(symbol, arguments.depth))
            bids, asks = book_levels(book)
            view = BookView(
                book.symbol,
                book.status,
                book.book_sequence,
                book.consensus_time_ms,
                bids,
                asks,
                book.trade_sequence,
            )
            say(book_table(view, units))
            return 0
        await follow_book(client, symbol, arguments.depth, units)
        return 0

    return run_market_data(arguments, action)


async def follow_book(client: MarketDataClient, symbol: str, depth: int, units: Units) -> None:
    """Keep a `LocalBook` from the stream and print it after each message, until Ctrl-C;
    a broken stream is followed again (its first message, a whole book, replaces ours)."""
    book = LocalBook(symbol)
    terminal = sys.stdout.isatty()
    patience = Patience()
    printed = 0
    while True:
        try:
            async for event in client.book_events(symbol, depth):
                book.apply(event)
                patience.answered()
                bids, asks = book.levels(depth)
                view = BookView(
                    symbol, book.status, book.book_sequence, book.consensus_time_ms, bids, asks
                )
                table = book_table(view, units)
                if terminal:
                    say(REDRAW + table)
                else:
                    say(("\n" if printed else "") + table)
                printed += 1
            # The stream never ends by itself; if it did, it is followed again.
            await patience.wait_after(
                GatewayCallError(grpc.StatusCode.UNAVAILABLE, "", "the book stream ended")
            )
        except BookOutOfSyncError:
            book = LocalBook(symbol)  # never on one stream: start over from a whole book
        except GatewayCallError as error:
            await patience.wait_after(error)


def run_trades(arguments: argparse.Namespace) -> int:
    symbol = arguments.symbol
    if arguments.limit < 1 or (arguments.from_sequence is not None and arguments.from_sequence < 0):
        print(f"{COMMAND}: --limit must be 1 or more, --from 0 or more", file=sys.stderr)
        return 2

    async def action(client: MarketDataClient) -> int:
        units = await units_of(client, symbol, raw=arguments.raw)
        # The newest trade now: what the trades printed without --follow end at.
        book = await answer(lambda: client.order_book(symbol, 1))
        newest = book.trade_sequence
        recent = arguments.from_sequence is None
        after = max(0, newest - arguments.limit) if recent else arguments.from_sequence
        tail = TradeTail(
            client,
            symbol,
            TradeColumns(units),
            after,
            newest,
            follow=arguments.follow,
            recent=recent,
        )
        await tail.run()
        if not tail.printed and not arguments.follow:
            say(
                "no trades yet"
                if newest == 0
                else f"no trades after {tail.last} (the newest is {newest})"
            )
        return 0

    return run_market_data(arguments, action)


def note(text: str) -> None:
    """A remark beside the output, on stderr: what is printed stays a clean table."""
    print(f"{COMMAND}: {text}", file=sys.stderr, flush=True)


# The service's words when it no longer holds the trades asked for (market_data.proto:
# OUT_OF_RANGE "with the oldest it holds").
OLDEST_HELD = re.compile(r"oldest held is (\d+)")


class TradeTail:
    """Prints a symbol's trades after `last`: up to `newest` and returns, or, following,
    each one as it comes until Ctrl-C; the stream is asked again after the last one
    printed when it breaks or falls behind (RESOURCE_EXHAUSTED). The recent trades
    (`recent`: no --from) the service no longer holds (it started after them) are
    skipped, saying so; asked for by --from, that is a refusal."""

    def __init__(
        self,
        client: MarketDataClient,
        symbol: str,
        columns: TradeColumns,
        last: int,
        newest: int,
        *,
        follow: bool,
        recent: bool,
    ) -> None:
        self.client = client
        self.symbol = symbol
        self.columns = columns
        self.last = last
        self.newest = newest
        self.follow = follow
        self.recent = recent
        self.printed = 0

    def show(self, trade: market_data_pb2.MarketTrade) -> None:
        if self.printed == 0 and not self.follow:
            say(self.columns.header())
        say(self.columns.line(trade))
        self.printed += 1
        self.last = trade.trade_sequence

    async def run(self) -> None:
        if self.follow:
            say(self.columns.header())  # at once: the trades may be a while coming
        patience = Patience()
        while self.follow or self.last < self.newest:
            # After nothing (0): every held trade up to the newest asked for, trade 1 too.
            recent = self.newest if self.last == 0 else 0
            stream = self.client.trades(self.symbol, from_trade_sequence=self.last, recent=recent)
            try:
                async for message in _within(
                    stream, None if self.follow else CATCH_UP_S, self.newest
                ):
                    patience.answered()
                    for trade in message.trades:
                        if trade.trade_sequence > self.last:  # a resumed stream starts after it
                            self.show(trade)
                    if not self.follow and self.last >= self.newest:
                        return
                await patience.wait_after(
                    GatewayCallError(grpc.StatusCode.UNAVAILABLE, "", "the trade stream ended")
                )
            except GatewayCallError as error:
                if self.follow and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    note(f"fell behind the trades of {self.symbol}; resuming after {self.last}")
                    continue
                if error.code == grpc.StatusCode.OUT_OF_RANGE and self.recent:
                    self.recent = False  # once: a second refusal is the service's answer
                    found = OLDEST_HELD.search(error.detail)
                    oldest = int(found.group(1)) if found else self.newest + 1
                    if oldest - 1 > self.last:
                        note(
                            f"trades of {self.symbol} up to {oldest - 1} are no longer held by"
                            " the market-data service"
                        )
                        self.last = oldest - 1
                        continue
                await patience.wait_after(error)


async def _within(
    stream: AsyncIterator[market_data_pb2.MarketTrades], timeout_s: float | None, newest: int
) -> AsyncIterator[market_data_pb2.MarketTrades]:
    """The stream's messages, each within `timeout_s` (None: however long it takes)."""
    try:
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    message = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError as error:
                raise CommandFailedError(
                    f"the market-data service sent no trade up to {newest} within {timeout_s:g} s"
                ) from error
            yield message
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def run_ticker(arguments: argparse.Namespace) -> int:
    async def action(client: MarketDataClient) -> int:
        instruments = await answer(client.instruments)
        units = {item.symbol: Units.of(item, raw=arguments.raw) for item in instruments}
        unknown = [symbol for symbol in arguments.symbols if symbol not in units]
        if unknown:
            raise CommandFailedError(
                f"no instrument {', '.join(map(repr, unknown))} (the instruments:"
                f" {', '.join(units) or 'none'})"
            )
        tickers = await answer(lambda: client.tickers(arguments.symbols))
        say(ticker_table(tickers, units))
        return 0

    return run_market_data(arguments, action)


def parse_when(text: str, now_ms: int) -> int:
    """ms since the epoch from `text`: digits (ms), a duration ago (90m, 6h, 2d, 30s), or
    an ISO 8601 date or time (UTC unless it names a zone)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    ago = re.fullmatch(r"(\d+)([smhd])", text)
    if ago:
        return max(0, now_ms - int(ago.group(1)) * AGO_UNITS_MS[ago.group(2)])
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as error:
        raise SettingsError(
            f"{text!r} is not a time: ms since the epoch, an ISO time (2025-01-31T12:00) or"
            " how long ago (90m, 6h, 2d)"
        ) from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return max(0, int(moment.timestamp() * 1000))


def run_candles(arguments: argparse.Namespace) -> int:
    interval, width_ms = INTERVALS[arguments.interval]
    if not 1 <= arguments.limit <= 1000:
        print(f"{COMMAND}: --limit must be 1..1000", file=sys.stderr)
        return 2
    now_ms = time.time_ns() // 1_000_000
    try:
        to_ms = parse_when(arguments.to_time, now_ms) if arguments.to_time else 0
        if arguments.from_time:
            from_ms = parse_when(arguments.from_time, now_ms)
        else:
            # The last --limit widths up to now (or --to): the newest candles.
            end = to_ms or now_ms
            from_ms = max(0, (end // width_ms - arguments.limit + 1) * width_ms)
    except SettingsError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2

    async def action(client: MarketDataClient) -> int:
        units = await units_of(client, arguments.symbol, raw=arguments.raw)
        candles = await answer(
            lambda: client.candles(
                arguments.symbol, interval, from_ms=from_ms, to_ms=to_ms, limit=arguments.limit
            )
        )
        if not candles.candles:
            say(f"no trades of {arguments.symbol} in that time")
        else:
            say(units.scale())
            say(candles_table(candles, units))
        if candles.more and candles.candles:
            say(f"more: --from {candles.candles[-1].open_time_ms + width_ms}")
        return 0

    return run_market_data(arguments, action)
