"""How `oms client`'s market-data commands show what the service answers: tables in
the instrument's units, or, with `--raw`, in the integers the system keeps.

The market-data service sends integers: prices in ticks, quantities in lots, notionals
in ticks x lots. An instrument's `lot_size` (base minor units per lot) and `tick_size`
(quote minor units per lot per tick) turn them into the assets' units: a price in
quote per whole base unit, a quantity in the base asset. The assets' decimals are the
ones `oms demo` shows (`services/mesh/demo.py`); an asset not listed there is shown
in its minor units. Each price is written with as many decimals as one tick needs
(0.01 USDT for BTC-USDT), each quantity as one lot needs (0.0001 BTC): a column's
figures line up and none is rounded.

Pure formatting: no I/O, no clock (times are given, in ms since the epoch).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from gateway.market_data_client import LevelRow
from protos.oms.v1 import common_pb2, market_data_pb2
from services.markets.asset_decimals import ASSET_DECIMALS

# More decimals than any asset's minor unit needs: a step that never terminates (a lot
# size of 3, say) is shown to this many places rather than forever.
MAX_PLACES = 18
# Enough significant digits for an int64 times 10^18 and its decimals.
PRECISION = 60


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns right-aligned to their widest cell, two spaces apart."""
    cells = [list(header), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    return "\n".join(lines)


def _places(step: Fraction) -> int:
    """The decimals `step` needs to be written exactly (MAX_PLACES if it never ends)."""
    for places in range(MAX_PLACES + 1):
        if (step * 10**places).denominator == 1:
            return places
    return MAX_PLACES


def _decimal(value: Fraction, places: int) -> str:
    with localcontext() as context:
        context.prec = PRECISION
        exact = Decimal(value.numerator) / Decimal(value.denominator)
        return f"{exact:,.{places}f}"


def _name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)  # a value newer than this build's protos


def status_name(status: int) -> str:
    return _name(market_data_pb2.MarketStatus, status, "MARKET_STATUS_")


def side_name(side: int) -> str:
    return _name(common_pb2.Side, side, "SIDE_")


def utc_time(ms: int) -> str:
    """ms since the epoch as a UTC time to the millisecond; "-" for 0 (never)."""
    if not ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


@dataclass(frozen=True)
class Units:
    """One instrument's integers in its assets' units (or as integers, `raw`)."""

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    tick_size: int
    raw: bool = False

    @classmethod
    def of(cls, instrument: market_data_pb2.Instrument, *, raw: bool = False) -> Units:
        return cls(
            instrument.symbol,
            instrument.base_asset,
            instrument.quote_asset,
            instrument.lot_size,
            instrument.tick_size,
            raw,
        )

    @property
    def base_decimals(self) -> int:
        return ASSET_DECIMALS.get(self.base_asset, 0)

    @property
    def quote_decimals(self) -> int:
        return ASSET_DECIMALS.get(self.quote_asset, 0)

    @property
    def price_unit(self) -> str:
        """What a price column holds."""
        return "ticks" if self.raw else self.quote_asset

    @property
    def size_unit(self) -> str:
        """What a quantity column holds."""
        return "lots" if self.raw else self.base_asset

    @property
    def _tick(self) -> Fraction:
        """One tick in quote per whole base unit (a lot is lot_size base minor units)."""
        return Fraction(
            self.tick_size * 10**self.base_decimals, (self.lot_size or 1) * 10**self.quote_decimals
        )

    @property
    def _lot(self) -> Fraction:
        """One lot in whole base units."""
        return Fraction(self.lot_size, 10**self.base_decimals)

    def price(self, ticks: int) -> str:
        if self.raw:
            return str(ticks)
        return _decimal(self._tick * ticks, _places(self._tick))

    def size(self, lots: int) -> str:
        if self.raw:
            return str(lots)
        return _decimal(self._lot * lots, _places(self._lot))

    def notional(self, ticks_times_lots: int) -> str:
        """A sum of price_ticks x quantity_lots: in the quote asset, or those integers."""
        if self.raw:
            return str(ticks_times_lots)
        return self.quote_amount(ticks_times_lots * self.tick_size)

    def quote_amount(self, minor_units: int) -> str:
        """An amount of the quote asset (min_notional): to its decimals, or minor units."""
        if self.raw:
            return str(minor_units)
        decimals = self.quote_decimals
        value = Fraction(minor_units, 10**decimals)
        # As `oms demo` writes amounts: exact, and at least cents.
        return _decimal(value, max(_places(value), min(decimals, 2)))

    def scale(self) -> str:
        """The line that says what one tick and one lot are."""
        if self.raw:
            return (
                f"prices in ticks (x {self.tick_size} {self.quote_asset} minor units per lot),"
                f" sizes in lots (x {self.lot_size} {self.base_asset} minor units)"
            )
        return (
            f"prices in {self.quote_asset} per {self.base_asset}"
            f" (1 tick = {self.price(1)}), sizes in {self.base_asset} (1 lot = {self.size(1)})"
        )


def percent(parts: int, per: int) -> str:
    """`parts` per `per` as a percentage, exact (basis points: per 10,000)."""
    value = Fraction(parts * 100, per)
    return _decimal(value, _places(value)) + "%"


def instruments_table(instruments: Sequence[market_data_pb2.Instrument], *, raw: bool) -> str:
    if raw:
        header = (
            "symbol",
            "status",
            "base",
            "quote",
            "lot size",
            "tick size",
            "min notional",
            "band bps",
            "reference ticks",
            "maker ppm",
            "taker ppm",
        )
        raw_rows = [
            (
                item.symbol,
                status_name(item.status),
                item.base_asset,
                item.quote_asset,
                item.lot_size,
                item.tick_size,
                item.min_notional,
                item.price_band_bps,
                item.reference_price_ticks,
                item.maker_fee_ppm,
                item.taker_fee_ppm,
            )
            for item in instruments
        ]
        return format_table(header, raw_rows)
    unit_header = (
        "symbol",
        "status",
        "lot",
        "price step",
        "min notional",
        "price band",
        "reference price",
        "maker fee",
        "taker fee",
    )
    rows = []
    for item in instruments:
        units = Units.of(item)
        rows.append(
            (
                item.symbol,
                status_name(item.status),
                f"{units.size(1)} {item.base_asset}",
                f"{units.price(1)} {item.quote_asset}",
                f"{units.quote_amount(item.min_notional)} {item.quote_asset}",
                "±" + percent(item.price_band_bps, 10_000),
                f"{units.price(item.reference_price_ticks)} {item.quote_asset}",
                percent(item.maker_fee_ppm, 1_000_000),
                percent(item.taker_fee_ppm, 1_000_000),
            )
        )
    return format_table(unit_header, rows)


@dataclass(frozen=True)
class BookView:
    """What a book table shows: a `LocalBook`'s state, or an `OrderBook`'s."""

    symbol: str
    status: int
    book_sequence: int
    consensus_time_ms: int
    bids: Sequence[LevelRow]  # (price_ticks, total_lots, order_count), best first
    asks: Sequence[LevelRow]
    trade_sequence: int = 0  # 0: not known (a stream's diffs do not carry it)


def book_table(view: BookView, units: Units) -> str:
    """The book as two sides face to face: bids on the left, asks on the right, each
    best first, one price level per row."""
    title = (
        f"{view.symbol} {status_name(view.status)}, book sequence {view.book_sequence}"
        + (f", trade sequence {view.trade_sequence}" if view.trade_sequence else "")
        + f", at {utc_time(view.consensus_time_ms)} UTC"
    )
    header = (
        "orders",
        f"bid size {units.size_unit}",
        f"bid {units.price_unit}",
        "|",
        f"ask {units.price_unit}",
        f"ask size {units.size_unit}",
        "orders",
    )
    rows: list[tuple[object, ...]] = []
    for index in range(max(len(view.bids), len(view.asks))):
        left: tuple[object, ...] = ("", "", "")
        right: tuple[object, ...] = ("", "", "")
        if index < len(view.bids):
            price, lots, count = view.bids[index]
            left = (count, units.size(lots), units.price(price))
        if index < len(view.asks):
            price, lots, count = view.asks[index]
            right = (units.price(price), units.size(lots), count)
        rows.append((*left, "|", *right))
    lines = [title, units.scale()]
    if not rows:
        lines.append("the book is empty")
    else:
        lines.append(format_table(header, rows))
    return "\n".join(lines)


@dataclass(frozen=True)
class TradeColumns:
    """The trades' lines, one per trade, at fixed widths: a followed stream prints each
    trade as it comes, before the widest figure is known."""

    units: Units

    def header(self) -> str:
        return self._line(
            "sequence",
            "trade id",
            "time UTC" if not self.units.raw else "time ms",
            "taker",
            f"price {self.units.price_unit}",
            f"size {self.units.size_unit}",
        )

    def line(self, trade: market_data_pb2.MarketTrade) -> str:
        time_shown = (
            str(trade.consensus_time_ms) if self.units.raw else utc_time(trade.consensus_time_ms)
        )
        return self._line(
            str(trade.trade_sequence),
            str(trade.trade_id),
            time_shown,
            side_name(trade.taker_side),
            self.units.price(trade.price_ticks),
            self.units.size(trade.quantity_lots),
        )

    @staticmethod
    def _line(*cells: str) -> str:
        sequence, trade_id, time_shown, side, price, size = cells
        return f"{sequence:>8}  {trade_id:>8}  {time_shown:<23}  {side:<5}  {price:>16}  {size:>14}"


def ticker_table(
    tickers: Sequence[market_data_pb2.Ticker], units_by_symbol: dict[str, Units]
) -> str:
    """One row per symbol; the 24-hour figures marked * while not yet complete."""
    raw = any(units.raw for units in units_by_symbol.values())
    header = (
        "symbol",
        "status",
        "last",
        "bid",
        "bid size",
        "ask",
        "ask size",
        "24h open",
        "24h high",
        "24h low",
        "24h volume",
        "24h quote volume",
        "24h trades",
    )
    rows: list[tuple[object, ...]] = []
    partial = False
    for ticker in tickers:
        units = units_by_symbol[ticker.symbol]
        if ticker.status == market_data_pb2.MARKET_STATUS_UNKNOWN:
            rows.append((ticker.symbol, status_name(ticker.status), *["-"] * 11))
            continue

        def price(ticks: int, units: Units = units) -> str:
            return units.price(ticks) if ticks else "-"

        def size(lots: int, shown: bool, units: Units = units) -> str:
            return units.size(lots) if shown else "-"

        mark = "" if ticker.complete_24h else "*"
        partial = partial or not ticker.complete_24h
        rows.append(
            (
                ticker.symbol,
                status_name(ticker.status),
                price(ticker.last_price_ticks),
                price(ticker.best_bid_ticks),
                size(ticker.best_bid_lots, bool(ticker.best_bid_ticks)),
                price(ticker.best_ask_ticks),
                size(ticker.best_ask_lots, bool(ticker.best_ask_ticks)),
                price(ticker.open_24h_ticks),
                price(ticker.high_24h_ticks),
                price(ticker.low_24h_ticks),
                f"{units.size(ticker.volume_24h_lots)} {units.size_unit}{mark}",
                f"{units.notional(ticker.quote_volume_24h_ticks)}"
                f" {'ticks x lots' if raw else units.quote_asset}{mark}",
                f"{ticker.trades_24h}{mark}",
            )
        )
    lines = [format_table(header, rows)]
    lines.append(
        "prices in ticks, sizes in lots"
        if raw
        else "prices in each symbol's quote asset per unit of its base, sizes in its base"
    )
    as_of = max((ticker.as_of_ms for ticker in tickers), default=0)
    if as_of:
        lines.append(f"24 hours up to {utc_time(as_of)} UTC")
    if partial:
        lines.append("* the trades before the service started are still being read")
    return "\n".join(lines)


def candles_table(candles: market_data_pb2.Candles, units: Units) -> str:
    header = (
        "open time UTC" if not units.raw else "open time ms",
        "open",
        "high",
        "low",
        "close",
        f"volume {units.size_unit}",
        f"quote volume {'ticks x lots' if units.raw else units.quote_asset}",
        "trades",
    )
    rows = [
        (
            str(candle.open_time_ms) if units.raw else utc_time(candle.open_time_ms)[:16],
            units.price(candle.open_ticks),
            units.price(candle.high_ticks),
            units.price(candle.low_ticks),
            units.price(candle.close_ticks),
            units.size(candle.volume_lots),
            units.notional(candle.quote_volume_ticks),
            candle.trades,
        )
        for candle in candles.candles
    ]
    return format_table(header, rows)
