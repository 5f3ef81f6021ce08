"""Fills and ledger rows, written behind the shard, append-only.

A ledger row's key is its place in the shard's egress: (shard, log position,
index among the ledger items of that position), so writing a position twice can
only ever hit the same keys. A fill's key is (order id, trade id); a conflicting
fill from another position means the shard settled one trade twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from persister.store import Session

_INSERT_FILLS = """
INSERT INTO fills (order_id, trade_id, user_id, symbol, side, price_ticks, quantity_lots,
    fee, maker, shard_id, position, consensus_time_ms)
SELECT f.order_id, f.trade_id, f.user_id, f.symbol, f.side, f.price_ticks, f.quantity_lots,
    f.fee, f.maker, $10::text, f.position, f.consensus_time_ms
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::smallint[],
            $6::bigint[], $7::bigint[], $8::bigint[], $9::boolean[], $11::bigint[],
            $12::bigint[])
     AS f(order_id, trade_id, user_id, symbol, side, price_ticks, quantity_lots, fee, maker,
          position, consensus_time_ms)
ON CONFLICT DO NOTHING
RETURNING order_id, trade_id
"""
_EXISTING_FILLS = """
SELECT order_id, trade_id, position FROM fills
WHERE (order_id, trade_id) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))
"""
_INSERT_LEDGER = """
INSERT INTO ledger (shard_id, position, item_index, user_id, account, asset, amount,
    reference, consensus_time_ms)
SELECT $1::text, l.* FROM unnest($2::bigint[], $3::integer[], $4::bigint[], $5::text[],
    $6::text[], $7::bigint[], $8::text[], $9::bigint[])
    AS l(position, item_index, user_id, account, asset, amount, reference, consensus_time_ms)
ON CONFLICT DO NOTHING
RETURNING position
"""


@dataclass(frozen=True, slots=True)
class FillRow:
    order_id: str
    trade_id: int
    user_id: int
    symbol: str
    side: int
    price_ticks: int
    quantity_lots: int
    fee: int
    maker: bool
    position: int
    consensus_time_ms: int


@dataclass(frozen=True, slots=True)
class LedgerRow:
    position: int
    item_index: int
    user_id: int
    account: str
    asset: str
    amount: int
    reference: str
    consensus_time_ms: int


@dataclass(slots=True)
class FillReport:
    inserted: int = 0
    replayed: int = 0
    duplicates: list[FillRow] = field(default_factory=list)


async def insert_fills(session: Session, fills: Sequence[FillRow], shard_id: str) -> FillReport:
    columns = fill_columns(fills)
    rows = await session.fetch(_INSERT_FILLS, *columns[:9], shard_id, *columns[9:])
    return await classify_fills(
        session, fills, {(row["order_id"], row["trade_id"]) for row in rows}
    )


def fill_columns(fills: Sequence[FillRow]) -> list[list[object]]:
    """The fills as the columns `oms_write_rows` takes (migration 0007), in order."""
    return [
        [f.order_id for f in fills],
        [f.trade_id for f in fills],
        [f.user_id for f in fills],
        [f.symbol for f in fills],
        [f.side for f in fills],
        [f.price_ticks for f in fills],
        [f.quantity_lots for f in fills],
        [f.fee for f in fills],
        [f.maker for f in fills],
        [f.position for f in fills],
        [f.consensus_time_ms for f in fills],
    ]


def ledger_columns(rows: Sequence[LedgerRow]) -> list[list[object]]:
    return [
        [r.position for r in rows],
        [r.item_index for r in rows],
        [r.user_id for r in rows],
        [r.account for r in rows],
        [r.asset for r in rows],
        [r.amount for r in rows],
        [r.reference for r in rows],
        [r.consensus_time_ms for r in rows],
    ]


async def classify_fills(
    session: Session, fills: Sequence[FillRow], written: set[tuple[str, int]]
) -> FillReport:
    """Fills not inserted: a replay (stored from the same position) or a duplicate."""
    report = FillReport(inserted=len(written))
    refused = [f for f in fills if (f.order_id, f.trade_id) not in written]
    if not refused:
        return report
    existing = await session.fetch(
        _EXISTING_FILLS, [f.order_id for f in refused], [f.trade_id for f in refused]
    )
    stored_at = {(row["order_id"], row["trade_id"]): row["position"] for row in existing}
    for fill in refused:
        if stored_at.get((fill.order_id, fill.trade_id)) == fill.position:
            report.replayed += 1
        else:
            report.duplicates.append(fill)
    return report


async def insert_ledger(session: Session, rows: Sequence[LedgerRow], shard_id: str) -> int:
    """Insert the rows; how many were already there (a replay of their positions)."""
    inserted = await session.fetch(_INSERT_LEDGER, shard_id, *ledger_columns(rows))
    return len(rows) - len(inserted)
