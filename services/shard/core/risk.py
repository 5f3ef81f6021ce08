"""Risk limits: what a user may hold and send (the checks are in `risk_checks`).

Everything is an integer in quote minor units or lots. Limits of 0 mean "no
limit". Checks that need a mark price (band, market-order size) are skipped
while the symbol has none: the matcher's own band still applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.shard.core.vocabulary import MARKET


@dataclass(frozen=True, slots=True)
class RiskLimits:
    max_order_notional: int = 0  # quote minor units
    max_position_lots: int = 0  # absolute base position per symbol
    max_open_orders: int = 0
    price_band_bps: int = 0  # limit price vs mark
    max_drawdown: int = 0  # quote minor units of loss from peak equity

    def plain(self) -> tuple[int, int, int, int, int]:
        return (
            self.max_order_notional,
            self.max_position_lots,
            self.max_open_orders,
            self.price_band_bps,
            self.max_drawdown,
        )

    def named(self) -> dict[str, int]:
        return dict(zip(LIMIT_NAMES, self.plain(), strict=True))

    def problems(self) -> list[str]:
        values = zip(LIMIT_NAMES, self.plain(), strict=True)
        return [f"{name} must be >= 0" for name, value in values if value < 0]


LIMIT_NAMES = (
    "max_order_notional",
    "max_position_lots",
    "max_open_orders",
    "price_band_bps",
    "max_drawdown",
)
NO_LIMITS = RiskLimits()


def estimated_lots(
    order_type: int, quantity_lots: int, quote_amount: int, mark: int, tick_size: int
) -> int:
    """Lots an order can trade: exact for limits and market sells, by mark for market buys."""
    if order_type == MARKET and quote_amount:
        return quote_amount // (mark * tick_size) if mark > 0 else -1
    return quantity_lots
