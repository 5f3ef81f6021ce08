"""Matching rules by example: priority, time in force, self-trade prevention, halts, kill switch."""

from __future__ import annotations

from protos.oms.v1 import matcher_pb2
from tests.matcher.support import (
    BUY,
    CANCELLED,
    FILLED,
    IOC,
    OPEN,
    PARTIALLY_FILLED,
    POST_ONLY,
    SELL,
    Driver,
    Row,
    cancel,
    halt,
    kill_switch,
    limit,
    market_sell,
    resume,
)

R = matcher_pb2


def kinds(events: list[Row]) -> list[Row]:
    """(order id, kind, the first payload field) per event."""
    return [(event[2], event[5], event[6] if len(event) > 6 else None) for event in events]


def test_best_price_first_then_first_in_first_out() -> None:
    driver = Driver.create()
    driver.apply(
        [
            limit("s1:1:1", 1, SELL, 101, 2),
            limit("s1:2:1", 2, SELL, 100, 2),
            limit("s1:3:1", 3, SELL, 100, 2),
            limit("s1:4:1", 4, SELL, 102, 2),
        ],
        1_000,
    )
    result, events = driver.one(limit("s2:5:1", 5, BUY, 101, 5), 1_001)
    fills = [(e[2], e[9], e[10], e[13]) for e in events if e[5] == "fill"]
    assert fills == [
        ("s1:2:1", 100, 2, True),
        ("s2:5:1", 100, 2, False),
        ("s1:3:1", 100, 2, True),
        ("s2:5:1", 100, 2, False),
        ("s1:1:1", 101, 1, True),
        ("s2:5:1", 101, 1, False),
    ]
    trade_ids = [e[6] for e in events if e[5] == "fill"]
    assert trade_ids == [1, 1, 2, 2, 3, 3]
    assert result[2][1] == FILLED
    assert driver.book()["asks"] == [(101, [("s1:1:1", 1)]), (102, [("s1:4:1", 2)])]
    state = driver.machine.order_state("s1:1:1")
    assert state is not None and state.status == PARTIALLY_FILLED


def test_gtc_remainder_rests_ioc_remainder_is_cancelled_post_only_rests() -> None:
    driver = Driver.create()
    driver.one(limit("s1:1:1", 1, SELL, 100, 2), 1_000)
    result, _ = driver.one(limit("s2:2:1", 2, BUY, 100, 5), 1_000)
    assert result[2][1] == PARTIALLY_FILLED
    assert driver.book()["bids"] == [(100, [("s2:2:1", 3)])]
    result, events = driver.one(limit("s2:3:1", 3, SELL, 99, 5, tif=IOC), 1_000)
    assert result[2][1] == CANCELLED and result[2][2] == 3
    assert events[-1][5:] == ("cancelled", R.CANCEL_REASON_IOC_REMAINDER, 2)
    result, _ = driver.one(limit("s2:3:2", 3, SELL, 101, 5, tif=POST_ONLY), 1_000)
    assert result[2][1] == OPEN
    assert driver.book()["asks"] == [(101, [("s2:3:2", 5)])]


def test_self_trade_cancel_newest_is_the_default() -> None:
    for stp in (0, 1):
        driver = Driver.create()
        driver.apply([limit("s1:1:1", 1, SELL, 100, 2), limit("s1:2:1", 2, SELL, 100, 2)], 1_000)
        driver.one(limit("s1:1:2", 1, SELL, 99, 2), 1_000)  # user 1's order is first in line
        result, events = driver.one(limit("s1:1:3", 1, BUY, 100, 4, stp=stp), 1_000)
        assert kinds(events) == [
            ("s1:1:3", "accepted", events[0][6]),
            ("s1:1:3", "cancelled", R.CANCEL_REASON_SELF_TRADE),
        ]
        assert result[2][1] == CANCELLED
        assert [level[0] for level in driver.book()["asks"]] == [99, 100]


def test_self_trade_cancel_oldest_cancels_resting_and_goes_on() -> None:
    driver = Driver.create()
    driver.apply([limit("s1:1:1", 1, SELL, 100, 2), limit("s1:2:1", 2, SELL, 100, 2)], 1_000)
    result, events = driver.one(limit("s1:1:2", 1, BUY, 100, 2, stp=2), 1_000)
    assert [(e[2], e[5]) for e in events] == [
        ("s1:1:2", "accepted"),
        ("s1:1:1", "cancelled"),
        ("s1:2:1", "fill"),
        ("s1:1:2", "fill"),
    ]
    assert events[1][6] == R.CANCEL_REASON_SELF_TRADE
    assert result[2][1] == FILLED and driver.book()["asks"] == []


def test_self_trade_cancel_both() -> None:
    driver = Driver.create()
    driver.apply([limit("s1:2:1", 2, SELL, 100, 1), limit("s1:1:1", 1, SELL, 100, 2)], 1_000)
    driver.one(limit("s1:2:2", 2, SELL, 100, 2), 1_000)
    result, events = driver.one(limit("s1:1:2", 1, BUY, 100, 5, stp=3), 1_000)
    assert [(e[2], e[5]) for e in events] == [
        ("s1:1:2", "accepted"),
        ("s1:2:1", "fill"),
        ("s1:1:2", "fill"),
        ("s1:1:1", "cancelled"),
        ("s1:1:2", "cancelled"),
    ]
    assert result[2][1] == CANCELLED and result[2][2] == 1
    assert driver.book()["asks"] == [(100, [("s1:2:2", 2)])]


def test_halt_cancels_in_book_order_cancels_still_allowed_resume_reopens() -> None:
    driver = Driver.create()
    driver.apply(
        [
            limit("s1:1:1", 1, BUY, 98, 2),
            limit("s1:2:1", 2, SELL, 102, 2),
            limit("s1:3:1", 3, BUY, 99, 2),
            limit("s1:4:1", 4, SELL, 101, 2),
            limit("s1:5:1", 5, BUY, 99, 2),
            limit("s1:6:1", 6, BUY, 49, 2, symbol="BBB-USD"),
        ],
        1_000,
    )
    result, events = driver.one(halt("AAA-USD"), 1_000)
    assert result == (0, False, None, 0, False) and events == []
    result, events = driver.one(limit("s1:7:1", 7, BUY, 99, 2), 1_000)
    assert result[3] == R.MATCHER_REJECT_REASON_SYMBOL_HALTED
    result, events = driver.one(cancel("s1:1:1", 1), 1_000)
    assert kinds(events) == [("s1:1:1", "cancelled", R.CANCEL_REASON_REQUESTED)]
    _, events = driver.one(halt("AAA-USD", cancel_resting=True), 1_000)
    assert kinds(events) == [
        ("s1:3:1", "cancelled", R.CANCEL_REASON_HALT),
        ("s1:5:1", "cancelled", R.CANCEL_REASON_HALT),
        ("s1:4:1", "cancelled", R.CANCEL_REASON_HALT),
        ("s1:2:1", "cancelled", R.CANCEL_REASON_HALT),
    ]
    assert driver.book("BBB-USD")["bids"] == [(49, [("s1:6:1", 2)])]
    driver.one(resume("AAA-USD"), 1_000)
    result, _ = driver.one(limit("s1:7:2", 7, BUY, 99, 2), 1_000)
    assert result[3] == 0


def test_kill_switch_cancels_the_users_orders_and_rejects_until_lifted() -> None:
    driver = Driver.create()
    driver.apply(
        [
            limit("s1:1:1", 1, BUY, 99, 2),
            limit("s2:1:1", 1, SELL, 51, 2, symbol="BBB-USD"),
            limit("s1:2:1", 2, BUY, 99, 2),
            limit("s1:1:2", 1, BUY, 98, 2),
        ],
        1_000,
    )
    _, events = driver.one(kill_switch(1, True), 1_000)
    assert kinds(events) == [
        ("s1:1:1", "cancelled", R.CANCEL_REASON_KILL_SWITCH),
        ("s2:1:1", "cancelled", R.CANCEL_REASON_KILL_SWITCH),
        ("s1:1:2", "cancelled", R.CANCEL_REASON_KILL_SWITCH),
    ]
    assert driver.machine.open_orders("s1", 1).orders == []
    result, _ = driver.one(limit("s1:1:3", 1, BUY, 99, 2), 1_000)
    assert result[3] == R.MATCHER_REJECT_REASON_USER_KILL_SWITCHED
    driver.one(kill_switch(1, False), 1_000)
    result, _ = driver.one(limit("s1:1:4", 1, BUY, 99, 2), 1_000)
    assert result[3] == 0


def test_many_cancels_inside_a_level_keep_fifo_order() -> None:
    driver = Driver.create()
    ids = [f"s1:{user}:1" for user in range(1, 201)]
    driver.apply(
        [limit(order_id, index + 1, SELL, 100, 1) for index, order_id in enumerate(ids)], 1_000
    )
    cancelled = {order_id for index, order_id in enumerate(ids) if index % 5 != 3}
    driver.apply(
        [cancel(order_id, int(order_id.split(":")[1])) for order_id in sorted(cancelled)], 1_000
    )
    left = [order_id for order_id in ids if order_id not in cancelled]
    assert driver.book()["asks"] == [(100, [(order_id, 1) for order_id in left])]
    _, events = driver.one(market_sell("s2:999:1", 999, 1), 1_000)
    assert events[-1][5] == "rejected"  # no bids: nothing to sell into
    _, events = driver.one(limit("s2:999:2", 999, BUY, 100, 30), 1_000)
    makers = [event[2] for event in events if event[5] == "fill" and event[13]]
    assert makers == left[:30]
    assert driver.book()["asks"] == [(100, [(order_id, 1) for order_id in left[30:]])]
