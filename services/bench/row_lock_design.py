"""The design the seeds reject, measured with pgbench on the mesh's own PostgreSQL.

A stateless order service over row locks: every order is one transaction that
locks the user's balance row, reserves the order's funds and inserts the order;
every fill is one transaction that locks both users' balance rows (in one global
order, so two fills never deadlock), moves base and quote with the fees, closes
both orders, and inserts the fill and its ledger rows. PostgreSQL runs as the
mesh runs it (fsync and synchronous commit on); pgbench is its C client, shipped
in the pgserver wheel beside `postgres`, so the client costs almost nothing and
the figure is the database's.

Jobs (one pgbench script each):
- `full`: two orders that cross (a buyer's and a seller's) and their fill:
  three transactions, two orders;
- `reserve`: one order's reservation transaction alone.

Workloads, over the same users as the mesh's load:
- `uniform`: every user as likely as any other;
- `hot`: `hot_users` whales carry `hot_percent` of the orders, the others the
  rest; the design serializes on the whales' rows.

Each run is measured at every client count asked for and the best is kept, as a
user tuning this design would. Latency is per script execution (the full job's
three transactions together). After each run the books must balance: each
asset's total over all users plus its fees equals what was deposited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

from services.bench.latency import percentile
from services.infra.postgres_binaries import postgres_binary

PRICE_TICKS = 6_500_000  # quote units per lot at the reference price
FUNDS = 10**15  # per user and asset: never runs dry in a run
TAKER_FEE_PPM = 2_000
MAKER_FEE_PPM = 1_000
JOBS = ("full", "reserve")
WORKLOADS = ("uniform", "hot")
PGBENCH_THREADS = 2  # the machine's cores; pgbench's own CPU is small beside the server's

SCHEMA = """
DROP TABLE IF EXISTS rl_ledger, rl_fills, rl_orders, rl_balances;
CREATE TABLE rl_balances (
    user_id bigint NOT NULL,
    asset text NOT NULL,
    total bigint NOT NULL,
    reserved bigint NOT NULL CHECK (reserved >= 0 AND reserved <= total),
    PRIMARY KEY (user_id, asset)
);
CREATE TABLE rl_orders (
    order_id bigserial PRIMARY KEY,
    user_id bigint NOT NULL,
    side char(1) NOT NULL,
    price_ticks bigint NOT NULL,
    quantity_lots bigint NOT NULL,
    remaining_lots bigint NOT NULL
);
CREATE TABLE rl_fills (
    fill_id bigserial PRIMARY KEY,
    buy_order_id bigint NOT NULL,
    sell_order_id bigint NOT NULL,
    price_ticks bigint NOT NULL,
    quantity_lots bigint NOT NULL
);
CREATE TABLE rl_ledger (
    entry_id bigserial PRIMARY KEY,
    fill_id bigint NOT NULL,
    user_id bigint NOT NULL,
    asset text NOT NULL,
    delta bigint NOT NULL
);
"""

# Who trades: a buyer and a distinct seller, drawn by the workload.
_PICK_UNIFORM = """
\\set buyer random(1, :users)
\\set seller random(1, :users - 1)
\\if :seller >= :buyer
\\set seller :seller + 1
\\endif
"""
_PICK_HOT = """
\\set draw random(1, 100)
\\if :draw <= :hot_percent
\\set buyer random(1, :hot_users)
\\else
\\set buyer random(:hot_users + 1, :users)
\\endif
\\set draw random(1, 100)
\\if :draw <= :hot_percent
\\set seller random(1, :hot_users)
\\else
\\set seller random(:hot_users + 1, :users)
\\endif
\\if :seller = :buyer
\\set seller (:buyer % :users) + 1
\\endif
"""

_RESERVE_BUY = """
BEGIN;
SELECT total - reserved FROM rl_balances WHERE user_id = :buyer AND asset = 'USDT' FOR UPDATE;
UPDATE rl_balances SET reserved = reserved + :notional WHERE user_id = :buyer AND asset = 'USDT';
INSERT INTO rl_orders (user_id, side, price_ticks, quantity_lots, remaining_lots)
    VALUES (:buyer, 'B', :price, 1, 1) RETURNING order_id AS buy_order \\gset
COMMIT;
"""
_RESERVE_SELL = """
BEGIN;
SELECT total - reserved FROM rl_balances WHERE user_id = :seller AND asset = 'BTC' FOR UPDATE;
UPDATE rl_balances SET reserved = reserved + 1 WHERE user_id = :seller AND asset = 'BTC';
INSERT INTO rl_orders (user_id, side, price_ticks, quantity_lots, remaining_lots)
    VALUES (:seller, 'S', :price, 1, 1) RETURNING order_id AS sell_order \\gset
COMMIT;
"""
# The seller's order rested first (maker), the buyer's crossed it (taker).
_SETTLE = """
\\set buyer_quote -(:notional + :taker_fee)
\\set seller_quote :notional - :maker_fee
\\set fees :taker_fee + :maker_fee
BEGIN;
SELECT total FROM rl_balances WHERE user_id IN (:buyer, :seller)
    ORDER BY user_id, asset FOR UPDATE;
UPDATE rl_balances SET total = total - :notional - :taker_fee, reserved = reserved - :notional
    WHERE user_id = :buyer AND asset = 'USDT';
UPDATE rl_balances SET total = total + 1 WHERE user_id = :buyer AND asset = 'BTC';
UPDATE rl_balances SET total = total - 1, reserved = reserved - 1
    WHERE user_id = :seller AND asset = 'BTC';
UPDATE rl_balances SET total = total + :notional - :maker_fee
    WHERE user_id = :seller AND asset = 'USDT';
UPDATE rl_orders SET remaining_lots = 0 WHERE order_id IN (:buy_order, :sell_order);
INSERT INTO rl_fills (buy_order_id, sell_order_id, price_ticks, quantity_lots)
    VALUES (:buy_order, :sell_order, :price, 1) RETURNING fill_id \\gset
INSERT INTO rl_ledger (fill_id, user_id, asset, delta) VALUES
    (:fill_id, :buyer, 'USDT', :buyer_quote), (:fill_id, :buyer, 'BTC', 1),
    (:fill_id, :seller, 'BTC', -1), (:fill_id, :seller, 'USDT', :seller_quote),
    (:fill_id, 0, 'USDT', :fees);
COMMIT;
"""
# The reservation alone: a buyer's order or a seller's, as the draw says.
_RESERVE_ONE = (
    """
\\set side random(0, 1)
\\if :side = 0
"""
    + _RESERVE_BUY.replace(" \\gset", ";")
    + """
\\else
"""
    + _RESERVE_SELL.replace(" \\gset", ";")
    + """
\\endif
"""
)


def script(job: str, workload: str) -> str:
    pick = _PICK_HOT if workload == "hot" else _PICK_UNIFORM
    if job == "full":
        return pick + _RESERVE_SELL + _RESERVE_BUY + _SETTLE
    if job == "reserve":
        return pick + _RESERVE_ONE
    raise ValueError(f"unknown job {job!r}; one of {', '.join(JOBS)}")


def orders_per_execution(job: str) -> int:
    return 2 if job == "full" else 1


@dataclass(frozen=True)
class DesignResult:
    job: str
    workload: str
    clients: int
    orders_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int  # script executions pgbench reports as failed (lock waits time out, ...)


@dataclass(frozen=True)
class Workload:
    name: str
    users: int
    hot_users: int = 4
    hot_percent: int = 80

    def variables(self) -> dict[str, int]:
        return {
            "users": self.users,
            "hot_users": self.hot_users,
            "hot_percent": self.hot_percent,
            "price": PRICE_TICKS,
            "notional": PRICE_TICKS,
            "taker_fee": PRICE_TICKS * TAKER_FEE_PPM // 1_000_000,
            "maker_fee": PRICE_TICKS * MAKER_FEE_PPM // 1_000_000,
        }


async def prepare(database_url: str, users: int) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(SCHEMA)
        await connection.copy_records_to_table(
            "rl_balances",
            records=[
                (user_id, asset, FUNDS, 0)
                for user_id in range(1, users + 1)
                for asset in ("USDT", "BTC")
            ],
            columns=("user_id", "asset", "total", "reserved"),
        )
    finally:
        await connection.close()


async def books_balance(database_url: str, users: int) -> None:
    """Each asset's total over every user plus its fees equals what was deposited."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT b.asset, sum(b.total) AS held, coalesce(("
            " SELECT sum(delta) FROM rl_ledger l WHERE l.user_id = 0 AND l.asset = b.asset"
            "), 0) AS fees FROM rl_balances b GROUP BY b.asset"
        )
    finally:
        await connection.close()
    for row in rows:
        if int(row["held"]) + int(row["fees"]) != FUNDS * users:
            raise AssertionError(
                f"row-lock design lost money in {row['asset']}: held {row['held']},"
                f" fees {row['fees']}, deposited {FUNDS * users}"
            )


def run_pgbench(
    database_url: str,
    job: str,
    workload: Workload,
    *,
    clients: int,
    seconds: float,
) -> DesignResult:
    """One pgbench run of `job` at `clients` connections (the tables prepared)."""
    with tempfile.TemporaryDirectory(prefix="oms-rowlock-") as folder:
        script_path = Path(folder) / f"{job}.sql"
        script_path.write_text(script(job, workload.name))
        command = [
            str(postgres_binary("pgbench")),
            *_connection_arguments(database_url),
            "--no-vacuum",
            "--protocol=prepared",
            f"--client={clients}",
            f"--jobs={min(clients, PGBENCH_THREADS)}",
            f"--time={max(1, round(seconds))}",
            "--log",
            f"--log-prefix={Path(folder) / 'latency'}",
            f"--file={script_path}",
            *(f"--define={name}={value}" for name, value in workload.variables().items()),
        ]
        completed = subprocess.run(
            command, capture_output=True, text=True, check=False, env=_environment(database_url)
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"pgbench failed ({completed.returncode}): {completed.stderr.strip()[-2000:]}"
            )
        latencies_us = sorted(_logged_latencies_us(Path(folder)))
    executions_per_s = _tps(completed.stdout)
    return DesignResult(
        job=job,
        workload=workload.name,
        clients=clients,
        orders_per_s=executions_per_s * orders_per_execution(job),
        p50_ms=percentile(latencies_us, 0.50) / 1e3,
        p99_ms=percentile(latencies_us, 0.99) / 1e3,
        failed=_failed(completed.stdout),
    )


def best_of(
    database_url: str,
    job: str,
    workload: Workload,
    *,
    client_counts: Sequence[int],
    seconds: float,
) -> DesignResult:
    """The best orders/s over `client_counts`, each run on freshly prepared tables."""
    results = []
    for clients in client_counts:
        asyncio.run(prepare(database_url, workload.users))
        results.append(run_pgbench(database_url, job, workload, clients=clients, seconds=seconds))
        asyncio.run(books_balance(database_url, workload.users))
    return max(results, key=lambda result: result.orders_per_s)


def _connection_arguments(database_url: str) -> list[str]:
    parts = urlsplit(database_url)
    arguments = [f"--host={parts.hostname or '127.0.0.1'}"]
    if parts.port:
        arguments.append(f"--port={parts.port}")
    if parts.username:
        arguments.append(f"--username={parts.username}")
    arguments.append(parts.path.lstrip("/") or "postgres")
    return arguments


def _environment(database_url: str) -> dict[str, str]:
    environment = dict(os.environ)
    password = urlsplit(database_url).password
    if password:
        environment["PGPASSWORD"] = password
    return environment


def _tps(output: str) -> float:
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
    if match is None:
        raise RuntimeError(f"no tps in pgbench's output:\n{output}")
    return float(match.group(1))


def _failed(output: str) -> int:
    match = re.search(r"number of failed transactions: (\d+)", output)
    return int(match.group(1)) if match else 0


def _logged_latencies_us(folder: Path) -> Iterator[int]:
    """Per-execution latencies from pgbench's `--log` files (the third field, in µs)."""
    for path in sorted(folder.glob("latency.*")):
        with path.open() as lines:
            for line in lines:
                fields = line.split()
                with contextlib.suppress(IndexError, ValueError):
                    yield int(fields[2])
