"""Every reject reason, and what "a rejected order changes nothing" means exactly.

A rejected submit changes exactly two things:
- the dedup index gains the order, status REJECTED, with its reason (so a re-submit
  is answered as a duplicate until the horizon passes);
- the owning OMS shard's stream gains one Rejected event (its sequence moves by one).
Books, open orders, last prices, trade and arrival counters, halts, kill switches and
pending expiries are untouched, and the state digest moves by exactly the new
record's digest: once the horizon sweep forgets the record, the digest is back where
it was. An INVALID_ORDER_ID reject, a refused batch, a duplicate and a cancel that
finds nothing change nothing at all (same state hash, no event).
"""

from __future__ import annotations

import pytest

from protos.oms.v1 import matcher_pb2
from services.matcher.core.state_digest import MASK
from tests.matcher import support
from tests.matcher.support import (
    BUY,
    FOK,
    GTD,
    IOC,
    MARKET,
    POST_ONLY,
    REJECTED,
    SELL,
    Driver,
    cancel,
    halt,
    kill_switch,
    limit,
    market_buy,
    market_sell,
    order,
    submit,
)

R = matcher_pb2


def fingerprint(driver: Driver) -> dict[str, object]:
    """Everything but the dedup index, the event streams and the digest over the index."""
    engine = driver.machine.engine
    return {
        "books": {symbol: driver.book(symbol) for symbol in ("AAA-USD", "BBB-USD")},
        "open": {
            user: [view.spec.order_id for view in engine.open_orders(shard, user)[1]]
            for shard in ("s1", "s2")
            for user in range(1, 6)
        },
        "last": engine.last_trades(),
        "trade_id": engine.last_trade_id,
        "arrival": engine.last_arrival,
        "halted": {symbol: book.halted for symbol, book in engine.books.items()},
        "killed": sorted(engine.kill_switched),
        "expiries": len(engine.expiries),
    }


def market(now: int = 1_000, horizon: int = 1_000) -> Driver:
    """AAA around 100: bids 98 (GTD) and 99 of user 2, asks 101 and 102 of user 3; BBB: one ask."""
    driver = Driver.create(dedup_horizon_ms=horizon)
    driver.apply(
        [
            limit("s2:2:1", 2, BUY, 98, 5, tif=GTD, expire_at_ms=now + 50_000),
            limit("s2:2:2", 2, BUY, 99, 5),
            limit("s2:3:1", 3, SELL, 101, 5),
            limit("s2:3:2", 3, SELL, 102, 5),
            limit("s1:3:1", 3, SELL, 52, 1, symbol="BBB-USD"),
        ],
        now,
    )
    return driver


CASES = [
    (
        "unknown symbol",
        limit("s1:1:1", 1, BUY, 100, 5, symbol="XYZ"),
        R.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL,
    ),
    ("negative price", limit("s1:1:1", 1, BUY, -100, 5), R.MATCHER_REJECT_REASON_PRICE_OFF_TICK),
    ("zero quantity", limit("s1:1:1", 1, BUY, 100, 0), R.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT),
    (
        "negative quantity",
        limit("s1:1:1", 1, BUY, 100, -2),
        R.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT,
    ),
    (
        "market sell of nothing",
        market_sell("s1:1:1", 1, 0),
        R.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT,
    ),
    (
        "below min notional",
        limit("s1:1:1", 1, BUY, 99, 1),
        R.MATCHER_REJECT_REASON_BELOW_MIN_NOTIONAL,
    ),
    ("above the band", limit("s1:1:1", 1, BUY, 106, 5), R.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND),
    ("below the band", limit("s1:1:1", 1, SELL, 94, 5), R.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND),
    (
        "post-only crossing",
        limit("s1:1:1", 1, BUY, 101, 2, tif=POST_ONLY),
        R.MATCHER_REJECT_REASON_POST_ONLY_WOULD_CROSS,
    ),
    (
        "FOK too big",
        limit("s1:1:1", 1, BUY, 102, 11, tif=FOK),
        R.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE,
    ),
    (
        "FOK not crossing",
        limit("s1:1:1", 1, BUY, 100, 1, tif=FOK),
        R.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE,
    ),
    (
        "FOK behind own order",
        limit("s1:3:9", 3, BUY, 102, 6, tif=FOK, stp=2),
        R.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE,
    ),
    (
        "GTD in the past",
        limit("s1:1:1", 1, BUY, 99, 5, tif=GTD, expire_at_ms=1_000),
        R.MATCHER_REJECT_REASON_EXPIRE_TIME_PASSED,
    ),
    ("side unspecified", limit("s1:1:1", 1, 0, 100, 5), R.MATCHER_REJECT_REASON_INVALID_ORDER),
    (
        "type unspecified",
        limit("s1:1:1", 1, BUY, 100, 5, order_type=0),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    ("limit without price", limit("s1:1:1", 1, BUY, 0, 5), R.MATCHER_REJECT_REASON_INVALID_ORDER),
    (
        "limit without time in force",
        limit("s1:1:1", 1, BUY, 100, 5, tif=0),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "limit with quote",
        submit(order("s1:1:1", 1, BUY, price=100, quantity=5, quote=9)),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "GTD without expiry",
        limit("s1:1:1", 1, BUY, 100, 5, tif=GTD),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "expiry without GTD",
        limit("s1:1:1", 1, BUY, 100, 5, expire_at_ms=9_999),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "unknown STP mode",
        limit("s1:1:1", 1, BUY, 100, 5, stp=7),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "market with price",
        submit(order("s1:1:1", 1, SELL, price=99, quantity=5, order_type=MARKET, tif=0)),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "market GTC",
        submit(order("s1:1:1", 1, SELL, quantity=5, order_type=MARKET)),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "market buy without quote",
        submit(order("s1:1:1", 1, BUY, quantity=5, order_type=MARKET, tif=IOC)),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "market sell with quote",
        submit(order("s1:1:1", 1, SELL, quantity=5, quote=50, order_type=MARKET, tif=0)),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    (
        "notional beyond int64",
        limit("s1:1:1", 1, BUY, 100, 2**62),
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
    ),
    ("market buy too small", market_buy("s1:1:1", 1, 302), R.MATCHER_REJECT_REASON_NO_LIQUIDITY),
    (
        "market sell, no bids",
        market_sell("s1:1:1", 1, 1, symbol="BBB-USD"),
        R.MATCHER_REJECT_REASON_NO_LIQUIDITY,
    ),
]


@pytest.mark.parametrize(
    ("command", "reason"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_each_reject_reason_changes_only_the_dedup_index_and_the_stream(
    command: matcher_pb2.MatcherCommand, reason: int
) -> None:
    driver = market()
    engine = driver.machine.engine
    before = fingerprint(driver)
    digest_before = engine.digest_sum
    order_id = command.submit.order.order_id
    shard = order_id.split(":")[0]
    sequence_before = engine.streams[shard].last_sequence if shard in engine.streams else 0

    result, events = driver.one(command, 1_000)

    assert result[3] == reason and result[1] is False
    assert result[2][1] == REJECTED
    assert [event[5:] for event in events] == [
        ("rejected", support.order_fields(command.submit.order), reason)
    ]
    assert events[0][:2] == (shard, sequence_before + 1)
    assert fingerprint(driver) == before
    record = engine.dedup.orders[order_id]
    assert (engine.digest_sum - digest_before) & MASK == record.digest
    # Re-submitting is a duplicate that repeats the reason; nothing moves.
    hash_before = driver.machine.state_hash()
    duplicate, events = driver.one(command, 1_001)
    assert duplicate == (0, True, result[2], reason, False) and events == []
    assert driver.machine.state_hash() == hash_before
    # Past the horizon the record is forgotten and the digest is back where it was.
    driver.timer(2_000)
    assert order_id not in engine.dedup.orders
    assert engine.digest_sum == digest_before
    assert fingerprint(driver) == before


def test_market_orders_trade_only_within_the_band_of_their_arrival() -> None:
    driver = Driver.create()
    last_trade_at_100 = [limit("s2:2:9", 2, BUY, 100, 1), market_sell("s2:4:9", 4, 1)]
    driver.apply([limit("s2:3:1", 3, SELL, 103, 1), limit("s2:2:1", 2, BUY, 103, 1)], 1_000)
    # Reference 103: an ask at 108 is within the band. Then trade at 100.
    driver.apply([limit("s2:3:2", 3, SELL, 104, 2), limit("s2:3:3", 3, SELL, 108, 5)], 1_000)
    driver.apply(last_trade_at_100, 1_000)
    # Reference 100, band 5%: a market buy reaches 105; its own trade at 104 does not move that.
    result, events = driver.one(market_buy("s1:1:1", 1, 100_000), 1_000)
    assert [event[5] for event in events] == ["accepted", "fill", "fill", "cancelled"]
    assert events[-1][6] == R.CANCEL_REASON_PRICE_BAND
    assert result[2][2] == 2
    # Back to reference 100 with only the ask at 108: nothing to take at all.
    driver.apply([limit("s2:2:8", 2, BUY, 100, 1), market_sell("s2:4:8", 4, 1)], 1_000)
    assert driver.machine.last_prices()[0].price_ticks == 100
    result, events = driver.one(market_buy("s1:1:2", 1, 100_000), 1_000)
    assert result[3] == R.MATCHER_REJECT_REASON_NO_LIQUIDITY
    assert [event[5] for event in events] == ["rejected"]


def test_halted_symbol_and_kill_switched_user_are_rejected_and_change_nothing() -> None:
    driver = market()
    driver.one(halt("AAA-USD"), 1_000)
    driver.one(kill_switch(4, True), 1_000)
    for command, reason in (
        (limit("s1:1:1", 1, BUY, 99, 5), R.MATCHER_REJECT_REASON_SYMBOL_HALTED),
        (
            limit("s1:4:1", 4, BUY, 99, 5, symbol="BBB-USD"),
            R.MATCHER_REJECT_REASON_USER_KILL_SWITCHED,
        ),
    ):
        before = fingerprint(driver)
        result, events = driver.one(command, 1_000)
        assert result[3] == reason and [event[5] for event in events] == ["rejected"]
        assert fingerprint(driver) == before


@pytest.mark.parametrize(
    "command",
    [
        limit("s1:2:1", 1, BUY, 99, 5),  # names another user
        limit("s1:01:1", 1, BUY, 99, 5),  # not the canonical spelling
        limit("s1:1:0", 1, BUY, 99, 5),  # sequence must be positive
        limit("s1:1:007", 1, BUY, 99, 5),
        limit("s1:1", 1, BUY, 99, 5),
        limit("s1:1:1:1", 1, BUY, 99, 5),
        limit(":1:1", 1, BUY, 99, 5),
        limit("s1:0:1", 0, BUY, 99, 5),  # user ids are positive
        limit("s1:1:-1", 1, BUY, 99, 5),
        limit("s1:1:" + "9" * 30, 1, BUY, 99, 5),  # beyond uint64
        limit("s" * 200 + ":1:1", 1, BUY, 99, 5),  # too long
        limit("s\u00e9:1:1", 1, BUY, 99, 5),  # not ASCII
        limit("", 1, BUY, 99, 5),
    ],
)
def test_invalid_order_id_changes_nothing_at_all(command: matcher_pb2.MatcherCommand) -> None:
    driver = market()
    hash_before = driver.machine.state_hash()
    result, events = driver.one(command, 1_000)
    assert result[3] == R.MATCHER_REJECT_REASON_INVALID_ORDER_ID
    assert result[2][1] == REJECTED and events == []
    assert driver.machine.state_hash() == hash_before
    assert driver.machine.order_state(command.submit.order.order_id) is None


def test_fok_not_fillable_leaves_own_orders_it_would_have_cancelled() -> None:
    driver = market()
    hash_before = driver.machine.state_hash()
    # User 3 owns the asks; CANCEL_OLDEST would cancel them while filling, but 6 lots
    # are not available without them, so nothing happens beyond the reject.
    result, _ = driver.one(limit("s1:3:9", 3, BUY, 102, 6, tif=FOK, stp=2), 1_000)
    assert result[3] == R.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE
    assert driver.book()["asks"] == [(101, [("s2:3:1", 5)]), (102, [("s2:3:2", 5)])]
    assert driver.machine.state_hash() != hash_before  # the dedup record, nothing else


def test_cancels_that_find_nothing_change_nothing() -> None:
    driver = market()
    driver.one(cancel("s2:2:2", 2), 1_000)
    hash_before = driver.machine.state_hash()
    for command, expected_not_found in (
        (cancel("s9:9:9", 9), True),  # unknown id
        (cancel("s2:2:1", 3), True),  # somebody else's order
        (cancel("s2:2:2", 2), False),  # already cancelled: its state, no event
    ):
        result, events = driver.one(command, 1_001)
        assert result[4] is expected_not_found and events == []
        assert (result[2] is None) is expected_not_found
    assert driver.machine.state_hash() == hash_before


def test_empty_command_and_unknown_symbol_halt_are_answered_and_change_nothing() -> None:
    driver = market()
    hash_before = driver.machine.state_hash()
    results, events = driver.apply(
        [matcher_pb2.MatcherCommand(correlation_id=5), halt("XYZ"), support.resume("XYZ")], 1_000
    )
    assert [result[3] for result in results] == [
        R.MATCHER_REJECT_REASON_INVALID_ORDER,
        R.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL,
        R.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL,
    ]
    assert results[0][0] == 5 and events == []
    assert driver.machine.state_hash() == hash_before
