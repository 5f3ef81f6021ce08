"""`RollingDay`: a symbol's trades of the last 24 hours in minute buckets, on consensus time.

Pure. Fed by the live trades and, for what came before the service started, by
minute candles read from the fills in PostgreSQL (`seed`). The window is the 1,440
whole minutes up to the newest consensus time the service has seen from the symbol's
matcher group: [minute(as_of) - 1,439 minutes, as_of]; buckets that leave it are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

MINUTE_MS = 60_000
DAY_MINUTES = 1_440
INT64_MAX = (1 << 63) - 1


@dataclass(slots=True)
class MinuteBucket:
    open_ticks: int
    high_ticks: int
    low_ticks: int
    close_ticks: int
    volume_lots: int
    quote_volume_ticks: int
    trades: int


@dataclass(frozen=True, slots=True)
class DayFigures:
    open_ticks: int
    high_ticks: int
    low_ticks: int
    volume_lots: int
    quote_volume_ticks: int
    trades: int


class RollingDay:
    __slots__ = ("buckets", "seeded")

    def __init__(self) -> None:
        self.buckets: dict[int, MinuteBucket] = {}  # minute number -> its trades
        self.seeded = False  # the trades before the live ones are in

    def add_trade(self, time_ms: int, price_ticks: int, quantity_lots: int) -> None:
        minute = time_ms // MINUTE_MS
        bucket = self.buckets.get(minute)
        notional = price_ticks * quantity_lots
        if bucket is None:
            self.buckets[minute] = MinuteBucket(
                price_ticks, price_ticks, price_ticks, price_ticks, quantity_lots, notional, 1
            )
            return
        bucket.high_ticks = max(bucket.high_ticks, price_ticks)
        bucket.low_ticks = min(bucket.low_ticks, price_ticks)
        bucket.close_ticks = price_ticks
        bucket.volume_lots += quantity_lots
        bucket.quote_volume_ticks += notional
        bucket.trades += 1

    def seed(self, candles: list[tuple[int, MinuteBucket]]) -> None:
        """Merge minute candles of trades that came before every live one (older first)."""
        for open_time_ms, earlier in candles:
            minute = open_time_ms // MINUTE_MS
            later = self.buckets.get(minute)
            if later is None:
                self.buckets[minute] = earlier
                continue
            self.buckets[minute] = MinuteBucket(
                earlier.open_ticks,
                max(earlier.high_ticks, later.high_ticks),
                min(earlier.low_ticks, later.low_ticks),
                later.close_ticks,
                earlier.volume_lots + later.volume_lots,
                earlier.quote_volume_ticks + later.quote_volume_ticks,
                earlier.trades + later.trades,
            )
        self.seeded = True

    def figures(self, as_of_ms: int) -> DayFigures:
        first = as_of_ms // MINUTE_MS - (DAY_MINUTES - 1)
        for minute in [minute for minute in self.buckets if minute < first]:
            del self.buckets[minute]
        if not self.buckets:
            return DayFigures(0, 0, 0, 0, 0, 0)
        minutes = sorted(self.buckets)
        chosen = [self.buckets[minute] for minute in minutes]
        return DayFigures(
            open_ticks=chosen[0].open_ticks,
            high_ticks=max(bucket.high_ticks for bucket in chosen),
            low_ticks=min(bucket.low_ticks for bucket in chosen),
            volume_lots=min(sum(bucket.volume_lots for bucket in chosen), INT64_MAX),
            quote_volume_ticks=min(sum(bucket.quote_volume_ticks for bucket in chosen), INT64_MAX),
            trades=sum(bucket.trades for bucket in chosen),
        )
