"""The market catalog every service reads: loads, and refuses what it cannot trust."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.markets.catalog import MarketCatalogError, load_catalog, parse_catalog

ENTRY = """
[[market]]
symbol = "BTC-USDT"
base_asset = "BTC"
quote_asset = "USDT"
lot_size = 10000
tick_size = 1
min_notional = 1000000
price_band_bps = 1000
reference_price_ticks = 6500000
maker_fee_ppm = 1000
taker_fee_ppm = 2000
matcher_group = "g1"
"""


def test_the_packaged_catalog_loads() -> None:
    catalog = load_catalog()
    assert "BTC-USDT" in catalog.by_symbol()
    assert catalog.groups() == sorted(catalog.groups())
    assert all(market.matcher_group in catalog.groups() for market in catalog.markets)


def test_a_catalog_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "markets.toml"
    path.write_text(ENTRY)
    assert load_catalog(path).group("g1")[0].lot_size == 10_000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no \\[\\[market\\]\\]"),
        ("[[market", "not valid TOML"),
        (ENTRY.replace("lot_size = 10000\n", ""), "missing \\['lot_size'\\]"),
        (ENTRY.replace("lot_size = 10000", 'lot_size = "10000"'), "lot_size must be int"),
        (ENTRY.replace("tick_size = 1", "tick_size = -1"), "out of range"),
        (ENTRY + ENTRY, "duplicate symbols"),
        (ENTRY.replace('matcher_group = "g1"', 'matcher_group = "g1"\ncolour = 1'), "unknown"),
    ],
)
def test_bad_catalogs_are_refused(text: str, message: str) -> None:
    with pytest.raises(MarketCatalogError, match=message):
        parse_catalog(text)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MarketCatalogError, match="cannot read"):
        load_catalog(tmp_path / "absent.toml")
