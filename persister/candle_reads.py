"""One symbol's candles (OHLCV) from the fills table: the taker fill of each trade, by
consensus time, in buckets of a fixed width from the epoch.

Read by the market-data service for `GetCandles` and to seed its tickers' 24 hours.
Open and close are the first and last trade of a bucket by (time, trade id); volumes
are summed as numeric and shown capped at 2^63-1, so no sum can overflow. Served by
the index migration 0009 adds (symbol, time, trade id, taker fills only).
"""

from __future__ import annotations

from persister.store import Session
from protos.oms.v1 import market_data_pb2, persister_pb2

MIN_INTERVAL_MS = 60_000
MAX_INTERVAL_MS = 86_400_000
MAX_CANDLES = 1_441  # a day of minutes, plus the one the window starts inside
INT64_MAX = (1 << 63) - 1

_CANDLES = """
SELECT (consensus_time_ms / $2::bigint) * $2::bigint AS open_time_ms,
    (array_agg(price_ticks ORDER BY consensus_time_ms, trade_id))[1] AS open_ticks,
    max(price_ticks) AS high_ticks,
    min(price_ticks) AS low_ticks,
    (array_agg(price_ticks ORDER BY consensus_time_ms DESC, trade_id DESC))[1] AS close_ticks,
    least(sum(quantity_lots), $7::numeric)::bigint AS volume_lots,
    least(sum(price_ticks::numeric * quantity_lots), $7::numeric)::bigint AS quote_volume_ticks,
    count(*) AS trades
FROM fills
WHERE symbol = $1 AND NOT maker
  AND consensus_time_ms >= $3::bigint
  AND ($4::bigint = 0 OR consensus_time_ms < $4::bigint)
  AND ($5::bigint = 0 OR trade_id <= $5::bigint)
GROUP BY 1
ORDER BY 1
LIMIT $6
"""

_STORED_MAX_TRADE_ID = """
SELECT coalesce(max(trade_id), 0) FROM fills
WHERE symbol = $1 AND NOT maker AND ($2::bigint = 0 OR trade_id <= $2::bigint)
"""

_STORED_TRADES = """
SELECT count(*) FROM fills WHERE symbol = $1 AND NOT maker AND trade_id <= $2::bigint
"""


def candle_problem(query: persister_pb2.CandleQuery) -> str:
    """Why a candle query is refused ("" if it is not)."""
    if not query.symbol:
        return "symbol is required"
    if not MIN_INTERVAL_MS <= query.interval_ms <= MAX_INTERVAL_MS:
        return f"interval_ms must be {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}, not {query.interval_ms}"
    if not 1 <= query.limit <= MAX_CANDLES:
        return f"limit must be 1..{MAX_CANDLES}, not {query.limit}"
    if query.to_ms and query.to_ms <= query.from_ms:
        return "to_ms must be after from_ms"
    if max(query.from_ms, query.to_ms, query.max_trade_id) > INT64_MAX:
        return "from_ms, to_ms and max_trade_id must fit in a signed 64-bit integer"
    return ""


async def read_candles(
    session: Session, query: persister_pb2.CandleQuery
) -> persister_pb2.CandlePage:
    rows = await session.fetch(
        _CANDLES,
        query.symbol,
        query.interval_ms,
        query.from_ms,
        query.to_ms,
        query.max_trade_id,
        query.limit + 1,
        INT64_MAX,
    )
    stored = await session.fetchval(_STORED_MAX_TRADE_ID, query.symbol, query.max_trade_id)
    # Counted only when asked (a bound given): one index range, of the symbol's trades.
    count = 0
    if query.max_trade_id:
        count = await session.fetchval(_STORED_TRADES, query.symbol, query.max_trade_id)
    return persister_pb2.CandlePage(
        candles=[market_data_pb2.Candle(**row) for row in rows[: query.limit]],
        more=len(rows) > query.limit,
        stored_max_trade_id=int(stored or 0),
        stored_trades=int(count or 0),
    )
