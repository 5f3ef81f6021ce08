"""Rules 3 and 4: admit, reserve exactly, send; matcher answers settle; cancels."""

from __future__ import annotations

import pytest

from services.shard.core.egress import (
    CancelToMatcher,
    FillRecord,
    LedgerPosting,
    OrderUpdate,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.settings import RateLimitSettings
from services.shard.core.vocabulary import (
    BUY,
    MARKET,
    SELL,
    EventKind,
    OrderStatus,
    RejectReason,
)
from tests.shard.support import (
    BTC,
    ETH,
    SHARD,
    ShardDriver,
    of_type,
    only,
    results,
    settings,
    unbalanced_postings,
)


def test_limit_buy_reserves_notional_plus_the_higher_fee_and_goes_out() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    out = driver.run(driver.place(7, "a", price_ticks=250, quantity_lots=4))
    submit = only(out, SubmitToMatcher)
    result = only(out, ShardResult)
    update = only(out, OrderUpdate)
    assert result.accepted and result.status == OrderStatus.PENDING
    assert result.order_id == submit.order_id == f"{SHARD}:7:1"
    assert submit.matcher_group == "g1" and submit.request.quantity_lots == 4
    assert update.status == OrderStatus.PENDING and update.remaining_lots == 4
    notional = 250 * 4 * BTC.tick_size
    assert driver.balance(7, "USDT") == (100_000, notional + notional * 2_000 // 1_000_000)
    assert driver.machine.statistics().in_flight_submits == 1
    second = results(driver.run(driver.place(7, "b", price_ticks=1, quantity_lots=1)))[0]
    assert second.order_id == f"{SHARD}:7:2"


@pytest.mark.parametrize(
    ("side", "order_type", "quantity", "quote", "asset", "reserved"),
    [
        (SELL, 1, 3, 0, "BTC", 3 * BTC.lot_size),
        (BUY, MARKET, 0, 5_000, "USDT", 5_000),
        (SELL, MARKET, 2, 0, "BTC", 2 * BTC.lot_size),
    ],
)
def test_other_order_types_reserve_exactly(  # noqa: PLR0917 - parametrized
    side: int, order_type: int, quantity: int, quote: int, asset: str, reserved: int
) -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000, BTC=10_000)
    out = driver.run(
        driver.place(
            7, "a", side=side, order_type=order_type, quantity_lots=quantity, quote_amount=quote
        )
    )
    assert only(out, ShardResult).accepted
    assert driver.balance(7, asset)[1] == reserved


def test_matcher_reject_releases_the_reservation() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    order_id = results(driver.run(driver.place(7, "a")))[0].order_id
    event = driver.event("g1", EventKind.REJECTED, order_id, 7, reason=7)
    out = driver.run(driver.events("g1", event))
    update = only(out, OrderUpdate)
    assert update.status == OrderStatus.REJECTED and update.matcher_reason == 7
    assert driver.balance(7, "USDT") == (100_000, 0)
    actor = driver.machine.actor(7)
    assert actor is not None and not actor.orders
    assert driver.machine.statistics().in_flight_submits == 0


def test_fills_settle_at_the_real_price_with_double_entry_and_release_the_rest() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    order_id = driver.accepted_order(7, "a", price_ticks=100, quantity_lots=3)
    reserved = 3_000 + 6
    assert driver.balance(7, "USDT") == (100_000, reserved)
    # Maker fill at a better price: 1 lot at 90, maker fee 0.1%.
    out = driver.run(
        driver.events(
            "g1",
            driver.fill(order_id, 7, price_ticks=90, quantity_lots=1, maker=True, remaining_lots=2),
        )
    )
    assert only(out, OrderUpdate).status == OrderStatus.PARTIALLY_FILLED
    assert only(out, FillRecord).fee == 0  # 900 * 1000 // 1e6 rounds down
    assert unbalanced_postings(out) == []
    assert driver.balance(7, "USDT") == (100_000 - 900, reserved - 900)
    assert driver.balance(7, "BTC") == (BTC.lot_size, 0)
    # Taker fill of the rest at the limit, done: the unused part is released.
    out = driver.run(
        driver.events("g1", driver.fill(order_id, 7, price_ticks=100, quantity_lots=2, done=True))
    )
    assert only(out, OrderUpdate).status == OrderStatus.FILLED
    assert driver.balance(7, "USDT") == (100_000 - 900 - 2_004, 0)
    assert driver.balance(7, "BTC") == (3 * BTC.lot_size, 0)
    accounts = driver.machine.state.accounts
    assert accounts.fees["USDT"] == 4
    assert accounts.clearing["USDT"] == 900 + 2_000
    assert accounts.clearing["BTC"] == -3 * BTC.lot_size
    position = driver.machine.actor(7).positions["BTC-USDT"]  # type: ignore[union-attr]
    assert (position.quantity_lots, position.cost_basis) == (3, 2_900)
    assert position.realized_pnl == -4  # fees are realized costs


def test_seller_pays_the_fee_out_of_the_proceeds() -> None:
    driver = ShardDriver()
    driver.resident(8, BTC=5 * BTC.lot_size)
    order_id = driver.accepted_order(8, "s", side=SELL, price_ticks=100, quantity_lots=2)
    assert driver.balance(8, "BTC") == (5_000, 2_000)
    out = driver.run(
        driver.events(
            "g1", driver.fill(order_id, 8, side=SELL, price_ticks=110, quantity_lots=2, done=True)
        )
    )
    assert unbalanced_postings(out) == []
    assert driver.balance(8, "BTC") == (3_000, 0)
    assert driver.balance(8, "USDT") == (2_200 - 4, 0)
    posting = only(out, LedgerPosting)
    assert (0, "fees", "USDT", 4) in posting.rows
    position = driver.machine.actor(8).positions["BTC-USDT"]  # type: ignore[union-attr]
    assert position.quantity_lots == -2 and position.cost_basis == -2_200


def test_market_buy_spends_its_quote_amount_fee_included() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=10_000)
    order_id = results(
        driver.run(driver.place(7, "m", order_type=MARKET, quantity_lots=0, quote_amount=2_500))
    )[0].order_id
    driver.run(driver.events("g1", driver.event("g1", EventKind.ACCEPTED, order_id, 7)))
    driver.run(driver.events("g1", driver.fill(order_id, 7, price_ticks=100, quantity_lots=2)))
    assert driver.balance(7, "USDT") == (10_000 - 2_004, 2_500 - 2_004)
    cancelled = driver.event("g1", EventKind.CANCELLED, order_id, 7, reason=2)
    out = driver.run(driver.events("g1", cancelled))
    assert only(out, OrderUpdate).status == OrderStatus.CANCELLED
    assert driver.balance(7, "USDT") == (10_000 - 2_004, 0)


def test_expiry_releases_what_is_left() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=10_000)
    order_id = driver.accepted_order(
        7, "e", quantity_lots=2, time_in_force=4, expire_at_ms=driver.now + 5
    )
    out = driver.run(
        driver.events("g1", driver.event("g1", EventKind.EXPIRED, order_id, 7, remaining_lots=2))
    )
    assert only(out, OrderUpdate).status == OrderStatus.EXPIRED
    assert driver.balance(7, "USDT") == (10_000, 0)


def test_cancel_by_order_id_or_client_id_goes_to_the_matcher_and_releases_on_cancelled() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    first = driver.accepted_order(7, "a")
    second = driver.accepted_order(7, "b", symbol="ETH-USDT")
    out = driver.run(driver.cancel(7, order_id=first))
    assert only(out, CancelToMatcher) == CancelToMatcher("g1", first, 7)
    assert only(out, ShardResult).accepted
    assert driver.machine.statistics().in_flight_cancels == 1
    assert driver.balance(7, "USDT")[1] > 0  # released only when Cancelled arrives
    out = driver.run(driver.cancel(7, client_order_id="b"))
    assert only(out, CancelToMatcher) == CancelToMatcher("g2", second, 7)
    again = driver.run(driver.cancel(7, client_order_id="b"))
    assert of_type(again, CancelToMatcher) == [] and only(again, ShardResult).duplicate
    driver.run(
        driver.events(
            "g1", driver.event("g1", EventKind.CANCELLED, first, 7, remaining_lots=1, reason=1)
        )
    )
    driver.run(
        driver.events(
            "g2", driver.event("g2", EventKind.CANCELLED, second, 7, remaining_lots=1, reason=1)
        )
    )
    assert driver.balance(7, "USDT") == (100_000, 0)
    assert driver.machine.statistics().in_flight_cancels == 0


def test_cancel_refusals_name_the_reason_and_change_nothing() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    driver.resident(8, USDT=100_000)
    done = driver.accepted_order(7, "a")
    driver.run(
        driver.events("g1", driver.event("g1", EventKind.CANCELLED, done, 7, remaining_lots=1))
    )
    other = driver.accepted_order(8, "x")
    before = driver.machine.state_hash()
    cases = [
        (driver.cancel(7, order_id=f"{SHARD}:7:99"), RejectReason.ORDER_NOT_FOUND),
        (driver.cancel(7, client_order_id="never"), RejectReason.ORDER_NOT_FOUND),
        (driver.cancel(7, order_id=done), RejectReason.ORDER_NOT_CANCELLABLE),
        (driver.cancel(7, client_order_id="a"), RejectReason.ORDER_NOT_CANCELLABLE),
        (driver.cancel(7, order_id=other), RejectReason.ORDER_NOT_FOUND),  # user 8's order
        (driver.cancel(7, order_id="elsewhere:7:1"), RejectReason.ORDER_NOT_FOUND),
        (driver.cancel(7), RejectReason.MALFORMED),
    ]
    for command, reason in cases:
        out = driver.run(command)
        assert [r.reject_reason for r in results(out)] == [reason], command
        assert of_type(out, CancelToMatcher) == []
    assert driver.machine.state_hash() == before


def test_duplicate_and_reordered_matcher_events_never_settle_twice() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    order_id = results(driver.run(driver.place(7, "a", quantity_lots=2)))[0].order_id
    accepted = driver.event("g1", EventKind.ACCEPTED, order_id, 7)
    fill_one = driver.fill(order_id, 7, price_ticks=100, quantity_lots=1, remaining_lots=1)
    fill_two = driver.fill(order_id, 7, price_ticks=100, quantity_lots=1, done=True)
    driver.run(driver.events("g1", accepted, fill_one))
    after_first = driver.balance(7, "USDT")
    # The same events again, out of order, interleaved with the next one.
    driver.run(driver.events("g1", fill_one, accepted, fill_two, fill_one, fill_two))
    stats = driver.machine.statistics()
    assert stats.counter("fills_settled") == 2
    assert stats.counter("matcher_events_duplicate") == 4
    assert stats.counter("matcher_sequence_gaps") == 0
    assert driver.balance(7, "USDT") == (after_first[0] - 1_002, 0)
    assert driver.machine.state.sequences["g1"] == fill_two.sequence


def test_a_sequence_gap_is_counted_and_later_events_still_apply() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    order_id = results(driver.run(driver.place(7, "a")))[0].order_id
    lost_accept = driver.event("g1", EventKind.ACCEPTED, order_id, 7)
    fill = driver.fill(order_id, 7, price_ticks=100, quantity_lots=1, done=True)
    out = driver.run(driver.events("g1", fill))  # the Accepted never arrives
    assert only(out, OrderUpdate).status == OrderStatus.FILLED
    assert driver.machine.statistics().counter("matcher_sequence_gaps") == 1
    late = driver.run(driver.events("g1", lost_accept))  # too late: below the last sequence
    assert late == []
    assert driver.machine.statistics().in_flight_submits == 0


def test_events_of_another_oms_shard_are_ignored() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    order_id = results(driver.run(driver.place(7, "a")))[0].order_id
    foreign = driver.event("g1", EventKind.ACCEPTED, order_id, 7)._replace(oms_shard="s2")
    before = driver.machine.state_hash()
    assert driver.run(driver.events("g1", foreign)) == []
    assert driver.machine.state_hash() == before
    assert driver.machine.statistics().counter("matcher_events_foreign") == 1


def test_backpressure_refuses_new_orders_but_never_cancels_or_fills() -> None:
    driver = ShardDriver(settings(max_in_flight_sagas=2))
    driver.resident(7, USDT=100_000)
    first = results(driver.run(driver.place(7, "a")))[0].order_id
    driver.run(driver.place(7, "b"))
    before = driver.machine.state_hash()
    refused = results(driver.run(driver.place(7, "c")))[0]
    assert refused.reject_reason == RejectReason.BACKPRESSURE and refused.retryable
    assert driver.machine.state_hash() == before
    assert only(driver.run(driver.cancel(7, order_id=first)), ShardResult).accepted
    fill = driver.fill(first, 7, price_ticks=100, quantity_lots=1, done=True)
    assert only(driver.run(driver.events("g1", fill)), OrderUpdate).status == OrderStatus.FILLED
    # One saga answered: room again for a new order.
    assert results(driver.run(driver.place(7, "c")))[0].accepted


def test_rate_limit_refills_on_consensus_time() -> None:
    driver = ShardDriver(settings(normal_rate_limit=RateLimitSettings(2, 1)))
    driver.resident(7, USDT=10**9)
    assert results(driver.run(driver.place(7, "a")))[0].accepted
    assert results(driver.run(driver.place(7, "b")))[0].accepted
    before = driver.machine.state_hash()
    refused = results(driver.run(driver.place(7, "c")))[0]
    assert refused.reject_reason == RejectReason.RATE_LIMITED and refused.retryable
    assert driver.machine.state_hash() == before
    assert results(driver.run(driver.place(7, "c"), advance_ms=999))[0].reject_reason == (
        RejectReason.RATE_LIMITED
    )
    assert results(driver.run(driver.place(7, "c"), advance_ms=1))[0].accepted


def test_in_flight_sagas_can_be_re_driven_from_state() -> None:
    driver = ShardDriver()
    driver.resident(7, USDT=100_000)
    pending = results(driver.run(driver.place(7, "a")))[0].order_id
    resting = driver.accepted_order(7, "b", symbol=ETH.symbol)
    driver.run(driver.cancel(7, order_id=resting))
    work = driver.machine.in_flight_egress()
    assert [type(item) for item in work] == [SubmitToMatcher, CancelToMatcher]
    assert work[0].order_id == pending and work[1].order_id == resting
