"""One audit of a mesh, and audits repeated until the answer holds still.

The write-behind lands after the shard (about 10 ms; longer after a fault), and the
two sides of a trade between users of two shards are written by two persisters, so
an audit of a mesh that is still settling can find a difference that the next one
does not. `audit_until_settled` repeats the audit until one is clean or its deadline
passes: what the last audit found is the answer, a violation that stayed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from auditor.core.findings import AuditReport
from auditor.core.money_audit import MoneyAudit
from auditor.core.rows import AcknowledgedOrder, AcknowledgedTransfer, MarketUnits
from auditor.database_reads import read_database
from auditor.public_answers import answered_users
from gateway.client import AdminClient
from services.markets.catalog import MarketCatalog

RETRY_PAUSE_S = 0.2


@dataclass(frozen=True)
class AuditInputs:
    """What an audit reads and what it is told to expect."""

    database_url: str
    markets: tuple[MarketUnits, ...]
    admin: AdminClient | None = None  # None: PostgreSQL alone
    acknowledged_orders: Sequence[AcknowledgedOrder] = ()
    acknowledged_transfers: Sequence[AcknowledgedTransfer] = ()
    flat: bool = False  # every order was cancelled or finished: nothing live, nothing reserved


def market_units(catalog: MarketCatalog) -> tuple[MarketUnits, ...]:
    return tuple(MarketUnits.of(market) for market in catalog.markets)


async def audit_once(inputs: AuditInputs) -> AuditReport:
    audit = MoneyAudit(inputs.markets, acknowledged_transfers=inputs.acknowledged_transfers)
    # The answers first: a user not resident then was flushed before, so the snapshot
    # read after holds its stored balances.
    answers = await answered_users(inputs.admin) if inputs.admin is not None else []
    connection = await asyncpg.connect(inputs.database_url)
    try:
        await read_database(
            connection,
            audit,
            flat=inputs.flat,
            stored_users=[a.user_id for a in answers if not a.resident],
            acknowledged=inputs.acknowledged_orders,
        )
    finally:
        await connection.close()
    if inputs.admin is not None:
        audit.compare_answers(answers, flat=inputs.flat)
    report = audit.report()
    report.figures["audits"] = 1
    return report


async def audit_until_settled(
    inputs: AuditInputs, *, settle_s: float, expected: Mapping[str, int] | None = None
) -> AuditReport:
    """Audits until one is clean (or finds exactly the `expected` violations, by check)
    or the deadline passes; the last report, with the number of audits it took in
    `figures["audits"]`."""
    expected = dict(expected or {})
    deadline = time.monotonic() + settle_s
    audits = 0
    while True:
        report = await audit_once(inputs)
        audits += 1
        report.figures["audits"] = audits
        if report.counts == expected or time.monotonic() >= deadline:
            return report
        await asyncio.sleep(RETRY_PAUSE_S)
