"""How `oms client`'s market-data commands write the integers the service sends: prices
and sizes exact in the assets' units, as many decimals as one tick or one lot needs."""

from __future__ import annotations

from gateway.market_data_command import parse_when
from gateway.market_data_display import BookView, Units, book_table, percent, utc_time
from protos.oms.v1 import market_data_pb2

BTC = Units("BTC-USDT", "BTC", "USDT", lot_size=10_000, tick_size=1)
SOL = Units("SOL-USDT", "SOL", "USDT", lot_size=1_000_000, tick_size=1)


def test_prices_and_sizes_in_the_assets_units() -> None:
    assert BTC.price(6_500_000) == "65,000.00"  # a tick: 0.01 USDT per BTC
    assert BTC.price(1) == "0.01"
    assert BTC.size(3_000) == "0.3000"  # a lot: 0.0001 BTC
    assert BTC.notional(6_500_000 * 3_000) == "19,500.00"
    assert BTC.quote_amount(1_000_000) == "1.00"
    assert BTC.quote_amount(1_234_567) == "1.234567"  # exact, never rounded
    assert SOL.price(15_000) == "15.000"  # a tick: 0.001 USDT per SOL
    assert SOL.size(1) == "0.001"


def test_a_step_that_does_not_end_and_an_asset_without_decimals() -> None:
    thirds = Units("X-USDT", "BTC", "USDT", lot_size=3, tick_size=1)  # 1e8/3/1e6 per tick
    assert thirds.price(3) == "100.000000000000000000"
    assert thirds.price(1).startswith("33.333333333333333333")
    plain = Units("GOLD-EUR", "GOLD", "EUR", lot_size=10, tick_size=5)  # unknown: minor units
    assert (plain.price(1), plain.price(4), plain.size(7)) == ("0.5", "2.0", "70")


def test_raw_figures_are_the_integers() -> None:
    raw = Units("BTC-USDT", "BTC", "USDT", lot_size=10_000, tick_size=1, raw=True)
    assert (raw.price(6_500_000), raw.size(3_000), raw.notional(9)) == ("6500000", "3000", "9")
    assert (raw.price_unit, raw.size_unit) == ("ticks", "lots")


def test_fees_bands_and_times() -> None:
    assert (percent(1_000, 1_000_000), percent(1_500, 10_000), percent(25, 1_000_000)) == (
        "0.1%",
        "15%",
        "0.0025%",
    )
    assert utc_time(0) == "-"
    assert utc_time(1_700_000_000_123) == "2023-11-14 22:13:20.123"


def test_the_book_faces_its_two_sides() -> None:
    view = BookView(
        "BTC-USDT",
        market_data_pb2.MARKET_STATUS_HALTED,
        book_sequence=7,
        consensus_time_ms=1_700_000_000_000,
        bids=[(6_490_000, 1_500, 1), (6_480_000, 20, 2)],
        asks=[(6_510_000, 400, 1)],
    )
    lines = book_table(view, BTC).splitlines()
    assert lines[0] == "BTC-USDT HALTED, book sequence 7, at 2023-11-14 22:13:20.000 UTC"
    assert [line.split() for line in lines[3:]] == [
        ["1", "0.1500", "64,900.00", "|", "65,100.00", "0.0400", "1"],
        ["2", "0.0020", "64,800.00", "|"],
    ]
    empty = BookView("BTC-USDT", market_data_pb2.MARKET_STATUS_TRADING, 0, 0, [], [])
    assert book_table(empty, BTC).splitlines()[-1] == "the book is empty"


def test_times_the_candles_take() -> None:
    now = 1_700_000_000_000
    assert parse_when("1699999999000", now) == 1_699_999_999_000
    assert parse_when("90m", now) == now - 90 * 60_000
    assert parse_when("2d", now) == now - 2 * 86_400_000
    assert parse_when("2023-11-14T22:00", now) == 1_699_999_200_000  # UTC when unsaid
    assert parse_when("2023-11-14T23:00+01:00", now) == 1_699_999_200_000
