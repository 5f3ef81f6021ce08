"""Exact integer money: notional, fees rounded down, what a quote budget buys, the band.

notional = price_ticks * quantity_lots * tick_size (quote minor units);
fee = notional * fee_ppm // 1_000_000, per fill, rounded down.
"""

from __future__ import annotations

from services.matcher.core.settings import BPS, PPM


def notional(price_ticks: int, quantity_lots: int, tick_size: int) -> int:
    return price_ticks * quantity_lots * tick_size


def fee(notional_amount: int, fee_ppm: int) -> int:
    return notional_amount * fee_ppm // PPM


def affordable_lots(budget: int, lot_cost: int, fee_ppm: int) -> int:
    """The most lots L with L*lot_cost + fee(L*lot_cost) <= budget, in one fill.

    L*c + floor(L*c*r/PPM) = floor(L*c*(PPM+r)/PPM) <= B  <=>  L*c*(PPM+r) <= (B+1)*PPM - 1.
    """
    if budget <= 0:
        return 0
    return ((budget + 1) * PPM - 1) // (lot_cost * (PPM + fee_ppm))


def within_band(price_ticks: int, reference_ticks: int, band_bps: int) -> bool:
    """A limit price's band check: |price - reference| * 10000 <= reference * band_bps."""
    return abs(price_ticks - reference_ticks) * BPS <= reference_ticks * band_bps


def market_reach(reference_ticks: int, band_bps: int, is_buy: bool) -> int:
    """The worst price a market order may trade at: above the reference for a buy.

    A market buy takes asks while (price - ref) * 10000 <= ref * band, a market
    sell takes bids while (ref - price) * 10000 <= ref * band.
    """
    reach = reference_ticks * band_bps // BPS
    return reference_ticks + reach if is_buy else reference_ticks - reach
