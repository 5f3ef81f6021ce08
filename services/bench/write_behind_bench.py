"""`oms bench write-behind`: the persister's usual transaction, one call against one
statement at a time, side by side on one PostgreSQL.

Each batch is what the write-behind commits every 10 ms below saturation: `--orders`
new orders, a change of each, two ledger rows each, and the cursor. "statements" is
BEGIN, the writer fence, an INSERT per table, the UPDATE, the cursor and COMMIT (what
the persister still does for a batch holding flushes or audit rows); "one call" is
`oms_write_rows` (migration 0007), one round trip. The modes alternate, `--rounds`
times each, on one connection of an embedded PostgreSQL (fsync off: the CPU is what
is measured, not the disk); CPU is the client process's and the server backend's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from persister.cursor import write_cursor
from persister.migrations import apply_migrations
from persister.order_rows import (
    NewOrder,
    OrderChange,
    change_columns,
    insert_orders,
    order_columns,
    update_orders,
)
from persister.store import Store
from persister.trade_rows import LedgerRow, fill_columns, insert_ledger, ledger_columns
from persister.write_behind import ONE_CALL
from persister.writer_fence import claim
from services.infra.embedded_postgres import EmbeddedPostgres

SHARD = "s1"
MODES = ("statements", "one call")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=2_000, help="per mode and round")
    parser.add_argument("--orders", default="1,4,16", help="orders per batch, in turn")
    parser.add_argument("--rounds", type=int, default=2, help="of each mode, alternating")


def run(arguments: argparse.Namespace) -> int:
    sizes = [int(part) for part in arguments.orders.split(",") if part.strip()]
    with (
        tempfile.TemporaryDirectory(prefix="oms-bench-write-behind-") as folder,
        EmbeddedPostgres(Path(folder), fast_unsafe=True) as postgres,
    ):
        asyncio.run(_measure(postgres.url, sizes, arguments.batches, arguments.rounds))
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _batch(
    first_position: int, size: int
) -> tuple[list[NewOrder], list[OrderChange], list[LedgerRow]]:
    orders, changes, ledger = [], [], []
    for offset in range(size):
        position = first_position + offset
        user = offset + 1
        order_id = f"{SHARD}:{user}:{position}"
        orders.append(
            NewOrder(
                order_id, user, "BTC-USDT", 1, 1, 1, 6_500_000, 1, 0, position, 1_000,
                client_order_id=f"c-{position}",
            )
        )  # fmt: skip
        changes.append(OrderChange(order_id, 2, 0, 1, position, 1_001))
        reference = f"deposit:{position}"
        ledger.append(LedgerRow(position, 0, user, "user", "USDT", 5, reference, 1_000))
        ledger.append(LedgerRow(position, 1, 0, "external", "USDT", -5, reference, 1_000))
    return orders, changes, ledger


async def _measure(url: str, sizes: list[int], batches: int, rounds: int) -> None:
    store = await Store.open(url, pool_size=1)
    try:
        await apply_migrations(store)
        store.fence = await claim(store, SHARD, 1)
        async with store.session() as session:
            backend = int(await session.fetchval("SELECT pg_backend_pid()"))
        position = 1
        header = f"{'orders':>7} {'mode':<11}{'client µs':>11}{'server µs':>11}{'wall µs':>10}"
        print(header + "  per batch")
        for size in sizes:
            for _ in range(rounds):
                for mode in MODES:
                    client, server, wall = time.process_time(), _cpu_s(backend), time.perf_counter()
                    for _ in range(batches):
                        orders, changes, ledger = _batch(position, size)
                        position += size
                        if mode == "one call":
                            await store.one_statement(
                                ONE_CALL, SHARD, 1, position,
                                *order_columns(orders), *change_columns(changes),
                                *fill_columns([]), *ledger_columns(ledger),
                            )  # fmt: skip
                        else:
                            async with store.transaction() as session:
                                await insert_orders(session, orders, SHARD)
                                await update_orders(session, changes)
                                await insert_ledger(session, ledger, SHARD)
                                await write_cursor(session, SHARD, position)
                    print(
                        f"{size:>7} {mode:<11}"
                        f"{1e6 * (time.process_time() - client) / batches:>11,.0f}"
                        f"{1e6 * (_cpu_s(backend) - server) / batches:>11,.0f}"
                        f"{1e6 * (time.perf_counter() - wall) / batches:>10,.0f}",
                        flush=True,
                    )
    finally:
        await store.close()
