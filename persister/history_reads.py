"""A user's order and fill history, read from the write-behind tables in keyset pages.

Pages run oldest first: orders by (accepted_at_ms, user_seq), fills by
(time, order_id, trade_id), the keys of the indexes migration 0002 adds. A page
starts after the last row of the previous one, so rows written meanwhile never
shift a page (an offset would skip or repeat rows). One row more than asked is
read to tell whether another page follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from persister.order_rows import STORED_ORDER_COLUMNS
from persister.store import Row, Session
from protos.oms.v1 import persister_pb2

MAX_PAGE = 1_000

_ORDER_PAGE = f"""
SELECT {STORED_ORDER_COLUMNS} FROM orders
WHERE user_id = $1
  AND ($2::text = '' OR symbol = $2::text)
  AND (cardinality($3::smallint[]) = 0 OR status = ANY($3::smallint[]))
  AND accepted_at_ms >= $4::bigint
  AND ($5::bigint = 0 OR accepted_at_ms < $5::bigint)
  AND (accepted_at_ms, user_seq) > ($6::bigint, $7::bigint)
ORDER BY accepted_at_ms, user_seq
LIMIT $8
"""

_FILL_PAGE = """
SELECT f.order_id, coalesce(o.client_order_id, '') AS client_order_id, f.trade_id, f.symbol,
    f.side, f.price_ticks, f.quantity_lots, f.fee, f.maker, f.consensus_time_ms AS time_ms
FROM fills AS f LEFT JOIN orders AS o ON o.order_id = f.order_id
WHERE f.user_id = $1
  AND ($2::text = '' OR f.symbol = $2::text)
  AND f.consensus_time_ms >= $3::bigint
  AND ($4::bigint = 0 OR f.consensus_time_ms < $4::bigint)
  AND (f.consensus_time_ms, f.order_id, f.trade_id) > ($5::bigint, $6::text, $7::bigint)
ORDER BY f.consensus_time_ms, f.order_id, f.trade_id
LIMIT $8
"""


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Row]
    more: bool


def page_problem(user_id: int, limit: int, from_ms: int, to_ms: int) -> str:
    """Why a page query is refused ("" if it is not)."""
    if user_id <= 0:
        return "user_id is required"
    if not 1 <= limit <= MAX_PAGE:
        return f"limit must be 1..{MAX_PAGE}, not {limit}"
    if to_ms and to_ms <= from_ms:
        return "to_ms must be after from_ms"
    return ""


async def read_order_page(session: Session, query: persister_pb2.OrderPageQuery) -> Page:
    rows = await session.fetch(
        _ORDER_PAGE,
        query.user_id,
        query.symbol,
        [int(status) for status in query.statuses],
        query.from_ms,
        query.to_ms,
        query.after_accepted_at_ms,
        query.after_user_seq,
        query.limit + 1,
    )
    return Page(rows[: query.limit], len(rows) > query.limit)


async def read_fill_page(session: Session, query: persister_pb2.FillPageQuery) -> Page:
    rows = await session.fetch(
        _FILL_PAGE,
        query.user_id,
        query.symbol,
        query.from_ms,
        query.to_ms,
        query.after_time_ms,
        query.after_order_id,
        query.after_trade_id,
        query.limit + 1,
    )
    return Page(rows[: query.limit], len(rows) > query.limit)


def stored_fill(row: Row) -> persister_pb2.StoredFill:
    return persister_pb2.StoredFill(**row)
