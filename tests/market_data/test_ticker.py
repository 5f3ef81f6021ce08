"""`RollingDay`: a symbol's last 24 hours in minute buckets on consensus time.

Live trades fill minute buckets; the minutes read from the fills (the trades before the
service started) merge under them, earlier first; the figures cover the 1,440 whole
minutes up to the newest time seen and forget the minutes that left the window.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.market_data.ticker import (
    DAY_MINUTES,
    INT64_MAX,
    MINUTE_MS,
    DayFigures,
    MinuteBucket,
    RollingDay,
)

START = 1_700_000_000_000 // MINUTE_MS * MINUTE_MS  # a whole minute


def test_an_empty_day_has_no_figures() -> None:
    assert RollingDay().figures(START) == DayFigures(0, 0, 0, 0, 0, 0)
    assert not RollingDay().seeded


def test_trades_of_one_minute_make_one_bucket() -> None:
    day = RollingDay()
    day.add_trade(START + 1_000, 100, 2)
    day.add_trade(START + 2_000, 104, 1)
    day.add_trade(START + 59_999, 98, 3)
    assert list(day.buckets) == [START // MINUTE_MS]
    assert day.buckets[START // MINUTE_MS] == MinuteBucket(
        open_ticks=100,
        high_ticks=104,
        low_ticks=98,
        close_ticks=98,
        volume_lots=6,
        quote_volume_ticks=200 + 104 + 294,
        trades=3,
    )
    day.add_trade(START + MINUTE_MS, 101, 1)
    assert len(day.buckets) == 2


def test_the_figures_span_the_buckets_of_the_window() -> None:
    day = RollingDay()
    day.add_trade(START, 100, 1)
    day.add_trade(START + 10 * MINUTE_MS, 120, 2)
    day.add_trade(START + 20 * MINUTE_MS, 90, 3)
    day.add_trade(START + 20 * MINUTE_MS + 5, 95, 1)
    figures = day.figures(START + 20 * MINUTE_MS + 5)
    assert figures == DayFigures(
        open_ticks=100,
        high_ticks=120,
        low_ticks=90,
        volume_lots=7,
        quote_volume_ticks=100 + 240 + 270 + 95,
        trades=4,
    )


def test_minutes_that_leave_the_24_hours_are_dropped() -> None:
    day = RollingDay()
    day.add_trade(START, 500, 5)  # minute m
    day.add_trade(START + MINUTE_MS, 100, 1)  # minute m + 1
    day.add_trade(START + 2 * MINUTE_MS, 110, 1)  # minute m + 2
    # As of minute m + 1,439 (its last ms), minute m is still the window's first.
    last_with_m = START + (DAY_MINUTES - 1) * MINUTE_MS + MINUTE_MS - 1
    assert day.figures(last_with_m).open_ticks == 500
    assert len(day.buckets) == 3
    # One ms later the window starts at m + 1: minute m is gone, for good.
    figures = day.figures(last_with_m + 1)
    assert figures == DayFigures(100, 110, 100, 2, 210, 2)
    assert START // MINUTE_MS not in day.buckets
    day_later = START + (DAY_MINUTES + 2) * MINUTE_MS
    assert day.figures(day_later) == DayFigures(0, 0, 0, 0, 0, 0)
    assert not day.buckets


def test_a_seed_goes_under_the_live_trades_earlier_candles_first() -> None:
    day = RollingDay()
    minute = START + 5 * MINUTE_MS
    # Live: the service saw trades from the middle of minute 5 on.
    day.add_trade(minute + 30_000, 105, 1)
    day.add_trade(minute + 40_000, 103, 2)
    day.add_trade(START + 6 * MINUTE_MS, 107, 1)
    day.seed(
        [
            (START + 3 * MINUTE_MS, MinuteBucket(90, 95, 88, 94, 4, 370, 2)),
            # The same minute 5, before the live ones: its open is the day's in that minute.
            (minute, MinuteBucket(99, 110, 97, 100, 3, 310, 3)),
        ]
    )
    assert day.seeded
    assert day.buckets[minute // MINUTE_MS] == MinuteBucket(
        open_ticks=99,
        high_ticks=110,
        low_ticks=97,
        close_ticks=103,  # the live close: the later trade
        volume_lots=6,
        quote_volume_ticks=310 + 105 + 206,
        trades=5,
    )
    figures = day.figures(START + 6 * MINUTE_MS)
    assert figures == DayFigures(
        open_ticks=90,
        high_ticks=110,
        low_ticks=88,
        volume_lots=4 + 6 + 1,
        quote_volume_ticks=370 + 621 + 107,
        trades=2 + 5 + 1,
    )


def test_a_seed_older_than_the_window_is_dropped_by_the_figures() -> None:
    day = RollingDay()
    day.seed([(START, MinuteBucket(1, 1, 1, 1, 1, 1, 1))])
    day.add_trade(START + DAY_MINUTES * MINUTE_MS, 50, 2)
    assert day.figures(START + DAY_MINUTES * MINUTE_MS) == DayFigures(50, 50, 50, 2, 100, 1)


def test_volumes_are_capped_at_the_int64_maximum() -> None:
    day = RollingDay()
    day.add_trade(START, INT64_MAX, INT64_MAX)
    day.add_trade(START + MINUTE_MS, INT64_MAX, INT64_MAX)
    figures = day.figures(START + MINUTE_MS)
    assert figures.volume_lots == INT64_MAX and figures.quote_volume_ticks == INT64_MAX
    assert figures.trades == 2


trades = st.lists(
    st.tuples(
        st.integers(0, 3 * DAY_MINUTES * MINUTE_MS), st.integers(1, 1_000), st.integers(1, 50)
    ),
    min_size=1,
    max_size=60,
)


@given(trades, st.integers(0, 2 * DAY_MINUTES * MINUTE_MS))
def test_the_figures_are_those_of_the_trades_in_the_window(
    drawn: list[tuple[int, int, int]], lookback_ms: int
) -> None:
    # Consensus time never goes back: the trades in time order, the figures as of the last
    # one's time or later.
    ordered = sorted(drawn, key=lambda row: row[0])
    day = RollingDay()
    for time_ms, price, lots in ordered:
        day.add_trade(START + time_ms, price, lots)
    as_of = START + ordered[-1][0] + lookback_ms
    first_ms = (as_of // MINUTE_MS - (DAY_MINUTES - 1)) * MINUTE_MS
    inside = [row for row in ordered if START + row[0] >= first_ms]
    figures = day.figures(as_of)
    if not inside:
        assert figures == DayFigures(0, 0, 0, 0, 0, 0)
        return
    prices = [price for _, price, _ in inside]
    assert figures == DayFigures(
        open_ticks=prices[0],
        high_ticks=max(prices),
        low_ticks=min(prices),
        volume_lots=sum(lots for _, _, lots in inside),
        quote_volume_ticks=sum(price * lots for _, price, lots in inside),
        trades=len(inside),
    )


@given(trades, st.data())
def test_a_seed_of_the_earlier_trades_and_the_live_ones_make_the_whole_day(
    drawn: list[tuple[int, int, int]], data: st.DataObject
) -> None:
    ordered = sorted(drawn, key=lambda row: row[0])
    split = data.draw(st.integers(0, len(ordered)), label="first live trade")
    everything, seeded = RollingDay(), RollingDay()
    earlier = RollingDay()  # the earlier trades as the fills' minute candles show them
    for time_ms, price, lots in ordered:
        everything.add_trade(START + time_ms, price, lots)
    for time_ms, price, lots in ordered[:split]:
        earlier.add_trade(START + time_ms, price, lots)
    for time_ms, price, lots in ordered[split:]:
        seeded.add_trade(START + time_ms, price, lots)
    seeded.seed(
        [(minute * MINUTE_MS, bucket) for minute, bucket in sorted(earlier.buckets.items())]
    )
    assert seeded.buckets == everything.buckets
    as_of = START + ordered[-1][0]
    assert seeded.figures(as_of) == everything.figures(as_of)
