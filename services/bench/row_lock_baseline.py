"""The design the seeds reject, measured on the same PostgreSQL in the same run.

A stateless order service that admits each order with one transaction:
`SELECT … FOR UPDATE` of the user's account, `UPDATE` of its available and
reserved funds, `INSERT` of the order — synchronous commit, `clients`
concurrent connections (pgbench's default shape in DESIGN.md section 8).
Users are spread so that lock waits are rare: the figure is the database's
per-order round trips and commits, not contention.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import asyncpg

from services.bench.latency import summarize_ms

SCHEMA = """
DROP TABLE IF EXISTS baseline_orders;
DROP TABLE IF EXISTS baseline_accounts;
CREATE TABLE baseline_accounts (
    user_id bigint PRIMARY KEY,
    available bigint NOT NULL CHECK (available >= 0),
    reserved bigint NOT NULL CHECK (reserved >= 0)
);
CREATE TABLE baseline_orders (
    order_id bigserial PRIMARY KEY,
    user_id bigint NOT NULL,
    client_order_id text NOT NULL,
    price_ticks bigint NOT NULL,
    quantity_lots bigint NOT NULL,
    UNIQUE (user_id, client_order_id)
);
"""
ADMIT = (
    "SELECT available FROM baseline_accounts WHERE user_id = $1 FOR UPDATE",
    "UPDATE baseline_accounts SET available = available - $2, reserved = reserved + $2"
    " WHERE user_id = $1",
    "INSERT INTO baseline_orders (user_id, client_order_id, price_ticks, quantity_lots)"
    " VALUES ($1, $2, $3, $4)",
)
PRICE_TICKS = 6_500_000
FUNDS = 10**15


@dataclass(frozen=True)
class BaselineResult:
    clients: int
    orders: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def orders_per_s(self) -> float:
        return self.orders / self.seconds if self.seconds > 0 else 0.0


async def run_baseline(
    database_url: str, *, clients: int = 16, users: int = 10_000, seconds: float = 5.0
) -> BaselineResult:
    setup = await asyncpg.connect(database_url)
    try:
        await setup.execute(SCHEMA)
        await setup.copy_records_to_table(
            "baseline_accounts",
            records=[(user_id, FUNDS, 0) for user_id in range(1, users + 1)],
            columns=("user_id", "available", "reserved"),
        )
    finally:
        await setup.close()
    pool = await asyncpg.create_pool(database_url, min_size=clients, max_size=clients)
    sequence = itertools.count(1)
    latencies_ns: list[int] = []
    deadline = time.perf_counter() + seconds

    async def client(index: int) -> None:
        async with pool.acquire() as connection:
            select, update, insert = [await connection.prepare(sql) for sql in ADMIT]
            while time.perf_counter() < deadline:
                number = next(sequence)
                user_id = 1 + (number * 7919 + index) % users
                started = time.perf_counter_ns()
                async with connection.transaction():
                    available = await select.fetchval(user_id)
                    if available < PRICE_TICKS:
                        raise RuntimeError("baseline account ran dry")
                    await update.fetch(user_id, PRICE_TICKS)
                    await insert.fetch(user_id, f"b-{number}", PRICE_TICKS, 1)
                latencies_ns.append(time.perf_counter_ns() - started)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(client(index) for index in range(clients)))
    finally:
        elapsed = time.perf_counter() - started
        await pool.close()
    return BaselineResult(clients, len(latencies_ns), elapsed, *summarize_ms(latencies_ns))
