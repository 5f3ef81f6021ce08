"""Price-level aggregates: each level's `total_lots` and `live_count` equal what its live
orders add up to after every entry (rest, cancel, expiry, fills, self-trade cancels,
halts, kill switches), and a restore rebuilds them without their being in the snapshot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.matcher.core.engine import MatcherEngine
from tests.matcher import support
from tests.matcher.support import BUY, SELL, Driver, cancel, limit
from tests.matcher.test_contract import feed, random_commands
from tests.matcher.test_differential import DataChooser, StreamBuilder


def check_levels(engine: MatcherEngine) -> None:
    for book in engine.books.values():
        book.bids.check_aggregates()
        book.asks.check_aggregates()


def levels(engine: MatcherEngine) -> dict[str, list[tuple[int, int, int]]]:
    return {
        f"{symbol}/{name}": [
            (level.price_ticks, level.total_lots, level.live_count)
            for level in side.levels_best_first()
        ]
        for symbol, book in sorted(engine.books.items())
        for name, side in (("bids", book.bids), ("asks", book.asks))
    }


def test_a_partial_fill_shrinks_the_makers_level_by_the_fill() -> None:
    driver = Driver.create()
    driver.apply([limit("s1:1:1", 1, SELL, 101, 5), limit("s1:2:1", 2, SELL, 101, 4)], 1_000)
    engine = driver.machine.engine
    assert levels(engine)["AAA-USD/asks"] == [(101, 9, 2)]
    driver.one(limit("s1:3:1", 3, BUY, 101, 3), 1_001)
    assert levels(engine)["AAA-USD/asks"] == [(101, 6, 2)]
    driver.one(limit("s1:3:2", 3, BUY, 101, 4), 1_002)  # the first maker done, the second hit
    assert levels(engine)["AAA-USD/asks"] == [(101, 2, 1)]
    driver.one(cancel("s1:2:1", 2), 1_003)
    assert levels(engine)["AAA-USD/asks"] == []
    check_levels(engine)


@pytest.mark.parametrize("seed", range(4))
def test_aggregates_stay_exact_on_long_streams_and_are_rebuilt_by_restore(seed: int) -> None:
    driver = Driver.create(dedup_horizon_ms=200)
    for entry in random_commands(seed=seed, batches=400):
        feed(driver, [entry])
        check_levels(driver.machine.engine)
    restored = Driver.create(dedup_horizon_ms=200)
    restored.machine.restore(driver.machine.snapshot())
    check_levels(restored.machine.engine)
    assert levels(restored.machine.engine) == levels(driver.machine.engine)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_aggregates_stay_exact_on_random_streams(data: st.DataObject) -> None:
    driver = Driver.create(dedup_horizon_ms=40)
    builder = StreamBuilder(
        DataChooser(data), lambda symbol: 100 if symbol == support.AAA.symbol else 50
    )
    now = 1_000
    for _ in range(data.draw(st.integers(1, 40))):
        now += data.draw(st.integers(0, 30))
        if data.draw(st.integers(0, 5)) == 0:
            driver.timer(now)
        else:
            driver.apply([builder.command(now) for _ in range(data.draw(st.integers(1, 4)))], now)
        check_levels(driver.machine.engine)
