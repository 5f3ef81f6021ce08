"""What a matcher group trades and the bounds of its state, fixed at start.

`SymbolSettings` mirrors `oms.v1.SymbolConfig` field for field (units in the
names). The symbol list is part of the state: a snapshot carries it and restore
uses the snapshot's list. The other fields bound work and memory; replicas must
run with equal values, and the state hash covers them so a mismatch shows up as
a divergence.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.matcher.core.errors import SettingsError

INT64_MAX = (1 << 63) - 1
PPM = 1_000_000  # fee rates are in millionths of notional
BPS = 10_000  # price band in basis points


@dataclass(frozen=True, slots=True)
class SymbolSettings:
    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int  # base minor units per lot
    tick_size: int  # quote minor units per lot per price tick
    min_notional: int  # quote minor units, limit orders only
    price_band_bps: int  # allowed distance from the reference price
    reference_price_ticks: int  # band reference until the first trade sets one
    maker_fee_ppm: int
    taker_fee_ppm: int

    def problems(self) -> list[str]:
        found = []
        if not self.symbol or len(self.symbol) > 64:
            found.append(f"symbol {self.symbol!r} must have 1 to 64 characters")
        positive = {
            "lot_size": self.lot_size,
            "tick_size": self.tick_size,
            "price_band_bps": self.price_band_bps,
            "reference_price_ticks": self.reference_price_ticks,
        }
        for name, value in positive.items():
            if not 0 < value <= INT64_MAX:
                found.append(f"{self.symbol}: {name} must be a positive int64, not {value}")
        if not 0 <= self.min_notional <= INT64_MAX:
            found.append(f"{self.symbol}: min_notional must be >= 0, not {self.min_notional}")
        for name, rate in (
            ("maker_fee_ppm", self.maker_fee_ppm),
            ("taker_fee_ppm", self.taker_fee_ppm),
        ):
            if not 0 <= rate <= PPM:
                found.append(f"{self.symbol}: {name} must be within 0..{PPM}, not {rate}")
        return found


@dataclass(frozen=True, slots=True)
class EngineSettings:
    symbols: tuple[SymbolSettings, ...]
    # A finished order's id stays known this long after it ends (contract point 1).
    dedup_horizon_ms: int = 600_000
    # Events kept per OMS shard for subscribers that resume (contract point 3).
    retained_events_per_shard: int = 100_000
    # Work bounds of one timer tick; the rest waits for the next tick.
    max_expiries_per_timer: int = 10_000
    max_dedup_sweeps_per_timer: int = 10_000
    # A command batch with more commands is refused whole.
    max_commands_per_batch: int = 10_000
    # Market data (state-machine version 2 on) kept per symbol for subscribers that
    # resume: this many book updates, and as many trades.
    retained_market_data_per_symbol: int = 10_000

    def __post_init__(self) -> None:
        # Accept any sequence of symbols; keep an immutable tuple.
        object.__setattr__(self, "symbols", tuple(self.symbols))
        found = check_symbols(self.symbols)
        bounds = {
            "dedup_horizon_ms": (self.dedup_horizon_ms, 0),
            "retained_events_per_shard": (self.retained_events_per_shard, 1),
            "max_expiries_per_timer": (self.max_expiries_per_timer, 1),
            "max_dedup_sweeps_per_timer": (self.max_dedup_sweeps_per_timer, 1),
            "max_commands_per_batch": (self.max_commands_per_batch, 1),
            "retained_market_data_per_symbol": (self.retained_market_data_per_symbol, 1),
        }
        for name, (value, lowest) in bounds.items():
            if not lowest <= value <= INT64_MAX:
                found.append(f"{name} must be within {lowest}..{INT64_MAX}, not {value}")
        if found:
            raise SettingsError("; ".join(found))


def check_symbols(symbols: tuple[SymbolSettings, ...]) -> list[str]:
    found: list[str] = []
    seen: dict[str, None] = {}
    for settings in symbols:
        found.extend(settings.problems())
        if settings.symbol in seen:
            found.append(f"symbol {settings.symbol!r} is listed twice")
        seen[settings.symbol] = None
    return found
