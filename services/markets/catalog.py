"""Load the market catalog once, at the edge, from one TOML file.

Every service reads markets from here (the matcher for its group's books, the
shard for reservation arithmetic and routing symbols to matcher groups, the
gateway for validation), so the units can never disagree between them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

INT64_MAX = (1 << 63) - 1


class MarketCatalogError(ValueError):
    """The catalog file is missing, malformed or inconsistent."""


@dataclass(frozen=True, slots=True)
class Market:
    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    tick_size: int
    min_notional: int
    price_band_bps: int
    reference_price_ticks: int
    maker_fee_ppm: int
    taker_fee_ppm: int
    matcher_group: str


@dataclass(frozen=True, slots=True)
class MarketCatalog:
    markets: tuple[Market, ...]

    def by_symbol(self) -> dict[str, Market]:
        return {market.symbol: market for market in self.markets}

    def group(self, name: str) -> tuple[Market, ...]:
        return tuple(market for market in self.markets if market.matcher_group == name)

    def groups(self) -> list[str]:
        return sorted({market.matcher_group: None for market in self.markets})

    def assets(self) -> list[str]:
        found: dict[str, None] = {}
        for market in self.markets:
            found[market.base_asset] = None
            found[market.quote_asset] = None
        return sorted(found)


def _market(entry: Mapping[str, Any], index: int) -> Market:
    names = [field.name for field in fields(Market)]
    missing = [name for name in names if name not in entry]
    unknown = [key for key in entry if key not in names]
    if missing or unknown:
        raise MarketCatalogError(f"market #{index + 1}: missing {missing}, unknown {unknown}")
    values: dict[str, Any] = {}
    for name in names:
        value = entry[name]
        expected: type = (
            str if name in ("symbol", "base_asset", "quote_asset", "matcher_group") else int
        )
        if type(value) is not expected:
            raise MarketCatalogError(
                f"market #{index + 1}: {name} must be {expected.__name__}, not {value!r}"
            )
        if isinstance(value, int) and not 0 <= value <= INT64_MAX:
            raise MarketCatalogError(f"market #{index + 1}: {name} out of range: {value}")
        values[name] = value
    return Market(**values)


def parse_catalog(text: str) -> MarketCatalog:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise MarketCatalogError(f"market catalog is not valid TOML: {error}") from error
    entries = document.get("market")
    if not isinstance(entries, list) or not entries:
        raise MarketCatalogError("market catalog holds no [[market]] entries")
    markets = tuple(_market(entry, index) for index, entry in enumerate(entries))
    symbols = [market.symbol for market in markets]
    if len(set(symbols)) != len(symbols):
        raise MarketCatalogError(f"duplicate symbols in the catalog: {symbols}")
    return MarketCatalog(markets)


def load_catalog(path: Path | None = None) -> MarketCatalog:
    """The catalog at `path`, or the packaged development catalog."""
    if path is None:
        text = resources.files("services.markets").joinpath("default_markets.toml").read_text()
    else:
        try:
            text = path.read_text()
        except OSError as error:
            raise MarketCatalogError(f"cannot read market catalog {path}: {error}") from error
    return parse_catalog(text)
