"""Rule 10: positions and P&L from fills, marks, admission limits, drawdown and reduce-only."""

from __future__ import annotations

from typing import Any

import pytest

from services.shard.core.egress import RiskAlert, ShardResult
from services.shard.core.positions import Position
from services.shard.core.risk import RiskLimits
from services.shard.core.vocabulary import BUY, MARKET, SELL, RejectReason
from tests.shard.support import ShardDriver, of_type, only, results


def test_average_cost_and_realized_pnl_in_exact_integers() -> None:
    position = Position()
    position.apply_fill(True, 3, 3_000, 0)  # long 3 at 1_000 each
    position.apply_fill(True, 1, 1_300, 0)  # long 4, cost 4_300
    position.apply_fill(False, 2, 2_400, 0)  # sell 2 at 1_200: basis 2_150, +250
    assert (position.quantity_lots, position.cost_basis, position.realized_pnl) == (2, 2_150, 250)
    position.apply_fill(False, 5, 5_500, 5)  # close 2 at 1_100 (+50), open short 3
    assert (position.quantity_lots, position.cost_basis) == (-3, -3_300)
    assert position.realized_pnl == 250 + 50 - 5
    position.apply_fill(True, 3, 3_000, 0)  # cover at 1_000: +300
    assert (position.quantity_lots, position.cost_basis, position.realized_pnl) == (0, 0, 595)


def test_rounding_stays_in_the_basis_so_a_full_close_is_exact() -> None:
    position = Position()
    position.apply_fill(True, 3, 1_000, 0)
    for _ in range(3):
        position.apply_fill(False, 1, 400, 0)
    assert (position.quantity_lots, position.cost_basis, position.realized_pnl) == (0, 0, 200)


def test_marks_give_unrealized_pnl() -> None:
    position = Position(quantity_lots=-2, cost_basis=-2_000)
    assert position.unrealized_pnl(90, 10) == -1_800 + 2_000
    assert position.unrealized_pnl(0, 10) == 0


def _limited(**limits: int) -> ShardDriver:
    driver = ShardDriver()
    driver.resident(1, USDT=10**9, BTC=10**6)
    out = driver.run(driver.limits(1, RiskLimits(**limits)))
    assert only(out, ShardResult).accepted
    return driver


@pytest.mark.parametrize(
    ("limits", "place", "reason"),
    [
        (
            {"max_order_notional": 999},
            {"price_ticks": 100, "quantity_lots": 1},
            "RISK_MAX_ORDER_NOTIONAL",
        ),
        ({"max_position_lots": 2}, {"quantity_lots": 3}, "RISK_MAX_POSITION"),
        ({"max_position_lots": 2}, {"side": SELL, "quantity_lots": 3}, "RISK_MAX_POSITION"),
        ({"price_band_bps": 500}, {"price_ticks": 106}, "RISK_PRICE_BAND"),
        ({"price_band_bps": 500}, {"price_ticks": 94}, "RISK_PRICE_BAND"),
    ],
)
def test_admission_limits(limits: dict[str, int], place: dict[str, Any], reason: str) -> None:
    driver = _limited(**limits)
    driver.run(driver.marks(BTC_USDT=100))
    before = driver.machine.state_hash()
    result = results(driver.run(driver.place(1, "x", **place)))[0]
    assert result.reject_reason == RejectReason[reason]
    assert driver.machine.state_hash() == before


def test_limits_pass_at_their_edge() -> None:
    driver = _limited(max_order_notional=1_000, max_position_lots=2, price_band_bps=500)
    driver.run(driver.marks(BTC_USDT=100))
    assert results(driver.run(driver.place(1, "a", price_ticks=100, quantity_lots=1)))[0].accepted
    assert results(driver.run(driver.place(1, "b", price_ticks=95, quantity_lots=1)))[0].accepted
    # Two buys of one lot are live: a third would make the worst case 3 lots.
    third = results(driver.run(driver.place(1, "c", price_ticks=95, quantity_lots=1)))[0]
    assert third.reject_reason == RejectReason.RISK_MAX_POSITION


def test_max_open_orders() -> None:
    driver = _limited(max_open_orders=2)
    driver.run(driver.place(1, "a"), driver.place(1, "b"))
    assert results(driver.run(driver.place(1, "c")))[0].reject_reason == (
        RejectReason.RISK_MAX_OPEN_ORDERS
    )


def test_market_buy_notional_is_its_quote_amount() -> None:
    driver = _limited(max_order_notional=5_000)
    place = driver.place(1, "m", order_type=MARKET, quantity_lots=0, quote_amount=5_001)
    assert results(driver.run(place))[0].reject_reason == RejectReason.RISK_MAX_ORDER_NOTIONAL


def test_drawdown_past_the_limit_alerts_and_goes_reduce_only_until_cleared() -> None:
    driver = _limited(max_drawdown=500)
    order_id = driver.accepted_order(1, "long", price_ticks=100, quantity_lots=2)
    driver.run(
        driver.events("g1", driver.fill(order_id, 1, price_ticks=100, quantity_lots=2, done=True))
    )
    driver.run(driver.marks(BTC_USDT=120))  # +400 unrealized: the peak rises
    actor = driver.machine.actor(1)
    assert actor is not None and actor.peak_equity == 400 - 4
    out = driver.run(driver.marks(BTC_USDT=95))  # equity -104: 500 below the peak
    assert of_type(out, RiskAlert) == []
    out = driver.run(driver.marks(BTC_USDT=94))
    assert only(out, RiskAlert).kind == "drawdown"
    assert actor.reduce_only
    # Growing the long is refused; selling what is held is allowed.
    refused = results(driver.run(driver.place(1, "more", side=BUY, price_ticks=94)))[0]
    assert refused.reject_reason == RejectReason.REDUCE_ONLY
    too_much = results(
        driver.run(driver.place(1, "flip", side=SELL, price_ticks=94, quantity_lots=3))
    )[0]
    assert too_much.reject_reason == RejectReason.REDUCE_ONLY
    assert results(driver.run(driver.place(1, "cut", side=SELL, price_ticks=94, quantity_lots=2)))[
        0
    ].accepted
    out = driver.run(driver.marks(BTC_USDT=50))
    assert of_type(out, RiskAlert) == []  # one alert per breach, not per tick
    driver.run(driver.limits(1, RiskLimits(max_drawdown=500), clear=True))
    assert not actor.reduce_only
    assert results(driver.run(driver.place(1, "again", price_ticks=50)))[0].accepted


def test_drawdown_from_realized_losses_on_fills() -> None:
    driver = _limited(max_drawdown=100)
    buy = driver.accepted_order(1, "b", price_ticks=100, quantity_lots=1)
    driver.run(
        driver.events("g1", driver.fill(buy, 1, price_ticks=100, quantity_lots=1, done=True))
    )
    sell = driver.accepted_order(1, "s", side=SELL, price_ticks=80, quantity_lots=1)
    out = driver.run(
        driver.events(
            "g1", driver.fill(sell, 1, side=SELL, price_ticks=80, quantity_lots=1, done=True)
        )
    )
    assert only(out, RiskAlert).kind == "drawdown"


def test_negative_limits_are_malformed() -> None:
    driver = ShardDriver()
    driver.resident(1)
    result = results(driver.run(driver.limits(1, RiskLimits(max_open_orders=-1))))[0]
    assert result.reject_reason == RejectReason.MALFORMED
