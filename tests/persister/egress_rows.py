"""What the persister should have written, computed independently from the shard's egress."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protos.oms.v1 import shard_pb2
from tests.shard_service.shard_client import ShardClient

LedgerKey = tuple[int, int, int, str, str, int, str]  # position, index, user, account, asset, ...


def ledger_rows(items: Sequence[shard_pb2.ShardEgress]) -> list[LedgerKey]:
    """Ledger items as rows keyed like the table: index counts ledger items per position."""
    rows: list[LedgerKey] = []
    position, index = 0, 0
    for item in items:
        if item.WhichOneof("egress") != "ledger":
            continue
        if item.stamp.position != position:
            position, index = item.stamp.position, 0
        entry = item.ledger
        rows.append(
            (
                position,
                index,
                entry.user_id,
                entry.account,
                entry.asset,
                entry.amount,
                entry.reference,
            )
        )
        index += 1
    return rows


async def egress_through(
    shard: ShardClient, kinds: Sequence[str], position: int
) -> list[shard_pb2.ShardEgress]:
    """Every egress item of these kinds up to `position`."""
    items = await shard.egress(kinds, through=position)
    return [item for item in items if item.stamp.position <= position]


async def table_ledger(connection: Any) -> list[LedgerKey]:
    rows = await connection.fetch(
        "SELECT position, item_index, user_id, account, asset, amount, reference FROM ledger "
        "ORDER BY position, item_index"
    )
    return [tuple(row.values()) for row in rows]
