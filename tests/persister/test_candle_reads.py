"""`read_candles` (persister/candle_reads.py) on a real PostgreSQL: one symbol's taker fills
in buckets of a fixed width from the epoch.

Fills rows as the persister writes them (a maker and a taker row per trade, several
symbols, inserted out of order): the candles' open and close are the first and last
trade by (time, trade id), high, low, volumes and counts are the taker rows' (a maker row
is never counted, not even one whose taker row is not written yet), `from_ms` is
inclusive and `to_ms` exclusive, `limit` pages with `more`, `max_trade_id` bounds the
trades and `stored_max_trade_id` tells what is written. `candle_problem` refuses what the
read must never see.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from persister.candle_reads import (
    INT64_MAX,
    MAX_CANDLES,
    MAX_INTERVAL_MS,
    MIN_INTERVAL_MS,
    candle_problem,
    read_candles,
)
from persister.migrations import apply_migrations
from persister.store import Store
from protos.oms.v1 import market_data_pb2, persister_pb2
from tests.databases import drop_database, fresh_database

BTC, ETH, BIG = "BTC-USDT", "ETH-USDT", "BIG-USDT"
MINUTE = 60_000
HOUR = 3_600_000
BASE = 19_675 * 86_400_000  # a UTC midnight: every width's bucket starts there

# (symbol, trade_id, time from BASE, price_ticks, quantity_lots), in no useful order.
TRADES = [
    (BTC, 22, 59_999, 108, 4),
    (BTC, 21, 1_000, 101, 1),
    (ETH, 24, 2_000, 5_000, 9),  # another symbol, in BTC's minute
    (BTC, 31, 3 * MINUTE + 500, 111, 1),
    (BTC, 20, 1_000, 100, 2),  # same time as 21, lower id: the minute's open
    (BTC, 40, HOUR + MINUTE, 120, 1),
    (BTC, 23, 59_999, 97, 1),  # same time as 22, higher id: the minute's close
    (BTC, 30, 2 * MINUTE, 110, 5),  # exactly on its bucket's start
    (BTC, 32, 4 * MINUTE - 1, 112, 2),
    (ETH, 60, 2 * MINUTE, 5_100, 1),
    (BIG, 70, 0, INT64_MAX, INT64_MAX),
    (BIG, 71, 1, 1, INT64_MAX),
]
# A trade whose maker row is written and whose taker row is not yet (another shard's
# persister is behind): no candle shows it, and it is not "stored" yet.
MAKER_ONLY = (BTC, 50, MINUTE + 1, 999, 7)

_INSERT = """
INSERT INTO fills (order_id, trade_id, user_id, symbol, side, price_ticks, quantity_lots,
    fee, maker, shard_id, position, consensus_time_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, 'shard-1', $9, $10)
"""


def fill_rows() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for position, (symbol, trade_id, offset, price, lots) in enumerate(TRADES, start=1):
        time_ms = BASE + offset
        # The maker's row first, as a taker that crosses a resting order: BUY took an ask.
        rows.append(
            (f"maker-{trade_id}", trade_id, 1, symbol, 2, price, lots, True, position, time_ms)
        )
        rows.append(
            (f"taker-{trade_id}", trade_id, 2, symbol, 1, price, lots, False, position, time_ms)
        )
    symbol, trade_id, offset, price, lots = MAKER_ONLY
    rows.append((f"maker-{trade_id}", trade_id, 1, symbol, 2, price, lots, True, 99, BASE + offset))
    return rows


async def _populate(url: str) -> None:
    store = await Store.open(url, pool_size=1)
    try:
        await apply_migrations(store)
        async with store.session() as session:
            await session.executemany(_INSERT, fill_rows())
    finally:
        await store.close()


@pytest.fixture(scope="module")
def candle_database(database_url: str) -> Iterator[str]:
    """One database for the module: the tests only read it."""
    url = fresh_database(database_url, prefix="oms_candles")
    try:
        with ThreadPoolExecutor(1) as thread:  # its own loop: this fixture is not async
            thread.submit(asyncio.run, _populate(url)).result()
        yield url
    finally:
        drop_database(database_url, url)


@pytest.fixture
async def store(candle_database: str) -> AsyncIterator[Store]:
    opened = await Store.open(candle_database, pool_size=1)
    try:
        yield opened
    finally:
        await opened.close()


async def read(store: Store, **fields: object) -> persister_pb2.CandlePage:
    query = persister_pb2.CandleQuery(
        **{"symbol": BTC, "interval_ms": MINUTE, "limit": 100, **fields}  # type: ignore[arg-type]
    )
    assert candle_problem(query) == ""
    async with store.session() as session:
        return await read_candles(session, query)


def candle(
    offset: int, prices: tuple[int, int, int, int], volume: int, quote: int, trades: int
) -> market_data_pb2.Candle:
    """The candle opening at BASE + `offset`; prices: (open, high, low, close)."""
    open_, high, low, close = prices
    return market_data_pb2.Candle(
        open_time_ms=BASE + offset,
        open_ticks=open_,
        high_ticks=high,
        low_ticks=low,
        close_ticks=close,
        volume_lots=volume,
        quote_volume_ticks=quote,
        trades=trades,
    )


# BTC's minutes: the first (four trades), the third, the fourth, and one an hour later.
FIRST_MINUTE = candle(0, (100, 108, 97, 97), 8, 200 + 101 + 432 + 97, 4)
THIRD_MINUTE = candle(2 * MINUTE, (110, 110, 110, 110), 5, 550, 1)
FOURTH_MINUTE = candle(3 * MINUTE, (111, 112, 111, 112), 3, 111 + 224, 2)
LATER_MINUTE = candle(HOUR + MINUTE, (120, 120, 120, 120), 1, 120, 1)


async def test_minute_candles_are_the_taker_fills_of_each_minute(store: Store) -> None:
    page = await read(store)
    assert list(page.candles) == [FIRST_MINUTE, THIRD_MINUTE, FOURTH_MINUTE, LATER_MINUTE]
    assert not page.more
    # The trade with only its maker row written is neither a candle nor stored.
    assert page.stored_max_trade_id == 40


async def test_wider_buckets_merge_the_minutes_from_the_epoch(store: Store) -> None:
    five = await read(store, interval_ms=5 * MINUTE)
    assert list(five.candles) == [
        candle(0, (100, 112, 97, 112), 16, 830 + 550 + 335, 7),
        candle(HOUR, (120, 120, 120, 120), 1, 120, 1),
    ]
    day = await read(store, interval_ms=MAX_INTERVAL_MS)
    assert list(day.candles) == [candle(0, (100, 120, 97, 120), 17, 830 + 550 + 335 + 120, 8)]


async def test_from_is_inclusive_and_to_exclusive(store: Store) -> None:
    page = await read(store, from_ms=BASE + 2 * MINUTE, to_ms=BASE + 3 * MINUTE + 500)
    assert list(page.candles) == [THIRD_MINUTE]  # trade 31 at the bound is after it
    page = await read(store, from_ms=BASE + 2 * MINUTE, to_ms=BASE + 3 * MINUTE + 501)
    assert list(page.candles) == [THIRD_MINUTE, candle(3 * MINUTE, (111, 111, 111, 111), 1, 111, 1)]
    page = await read(store, from_ms=BASE + 2 * MINUTE + 1)
    assert list(page.candles) == [FOURTH_MINUTE, LATER_MINUTE]


async def test_a_from_inside_a_bucket_gives_its_later_trades_under_its_start(store: Store) -> None:
    # The service asks from a bucket's start (service.py rounds up); the read itself
    # bounds trades, not buckets.
    page = await read(store, from_ms=BASE + 59_999, to_ms=BASE + MINUTE)
    assert list(page.candles) == [candle(0, (108, 108, 97, 97), 5, 432 + 97, 2)]


async def test_limit_pages_and_more_says_buckets_follow(store: Store) -> None:
    page = await read(store, limit=2)
    assert list(page.candles) == [FIRST_MINUTE, THIRD_MINUTE] and page.more
    page = await read(store, limit=2, from_ms=BASE + 3 * MINUTE)
    assert list(page.candles) == [FOURTH_MINUTE, LATER_MINUTE] and not page.more
    page = await read(store, limit=1, to_ms=BASE + MINUTE)
    assert list(page.candles) == [FIRST_MINUTE] and not page.more
    page = await read(store, limit=MAX_CANDLES)
    assert len(page.candles) == 4 and not page.more


async def test_max_trade_id_bounds_the_trades_and_what_is_stored(store: Store) -> None:
    page = await read(store, max_trade_id=22)
    assert list(page.candles) == [candle(0, (100, 108, 100, 108), 7, 200 + 101 + 432, 3)]
    assert page.stored_max_trade_id == 22 and not page.more
    assert page.stored_trades == 3  # the taker rows up to trade 22
    page = await read(store, max_trade_id=29)
    assert list(page.candles) == [FIRST_MINUTE] and page.stored_max_trade_id == 23
    page = await read(store, max_trade_id=39)
    assert page.stored_max_trade_id == 32 and len(page.candles) == 3
    page = await read(store, max_trade_id=55)  # the maker-only 50 is not stored yet
    assert page.stored_max_trade_id == 40
    page = await read(store, max_trade_id=19)
    assert list(page.candles) == [] and page.stored_max_trade_id == 0
    # stored_max_trade_id is the table's, whatever the time range.
    page = await read(store, from_ms=BASE + 2 * HOUR)
    assert list(page.candles) == [] and page.stored_max_trade_id == 40


async def test_other_symbols_never_mix_in(store: Store) -> None:
    page = await read(store, symbol=ETH)
    assert list(page.candles) == [
        candle(0, (5_000, 5_000, 5_000, 5_000), 9, 45_000, 1),
        candle(2 * MINUTE, (5_100, 5_100, 5_100, 5_100), 1, 5_100, 1),
    ]
    assert page.stored_max_trade_id == 60
    page = await read(store, symbol="NONE-USDT")
    assert list(page.candles) == [] and not page.more and page.stored_max_trade_id == 0


async def test_volumes_that_overflow_int64_are_capped(store: Store) -> None:
    page = await read(store, symbol=BIG)
    assert list(page.candles) == [candle(0, (INT64_MAX, INT64_MAX, 1, 1), INT64_MAX, INT64_MAX, 2)]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"symbol": ""}, "symbol is required"),
        ({"interval_ms": 0}, "interval_ms must be"),
        ({"interval_ms": MIN_INTERVAL_MS - 1}, "interval_ms must be"),
        ({"interval_ms": MAX_INTERVAL_MS + 1}, "interval_ms must be"),
        ({"limit": 0}, "limit must be"),
        ({"limit": MAX_CANDLES + 1}, "limit must be"),
        ({"from_ms": 5, "to_ms": 5}, "to_ms must be after from_ms"),
        ({"from_ms": 6, "to_ms": 5}, "to_ms must be after from_ms"),
        ({"from_ms": INT64_MAX + 1}, "signed 64-bit"),
        ({"from_ms": 1, "to_ms": INT64_MAX + 1}, "signed 64-bit"),
        ({"max_trade_id": INT64_MAX + 1}, "signed 64-bit"),
    ],
)
def test_candle_problem_refuses_what_the_read_must_not_see(
    fields: dict[str, object], problem: str
) -> None:
    query = persister_pb2.CandleQuery(
        **{"symbol": BTC, "interval_ms": MINUTE, "limit": 10, **fields}  # type: ignore[arg-type]
    )
    assert problem in candle_problem(query)


@pytest.mark.parametrize(
    "fields",
    [
        {"interval_ms": MIN_INTERVAL_MS, "limit": 1},
        {"interval_ms": MAX_INTERVAL_MS, "limit": MAX_CANDLES},
        {"from_ms": 5, "to_ms": 0},  # no upper bound
        {"from_ms": 5, "to_ms": 6, "max_trade_id": INT64_MAX},
        {"from_ms": INT64_MAX},
    ],
)
def test_candle_problem_admits_the_bounds(fields: dict[str, object]) -> None:
    query = persister_pb2.CandleQuery(
        **{"symbol": BTC, "interval_ms": MINUTE, "limit": 10, **fields}  # type: ignore[arg-type]
    )
    assert candle_problem(query) == ""
