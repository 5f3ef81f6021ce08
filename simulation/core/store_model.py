"""PostgreSQL as the persister uses it: its tables as rows, transactions that commit,
abort, or end with an outcome the caller does not know.

The rows are the auditor's own row types (`auditor/core/rows.py`), so the
independent money audit reads this store as it reads the real tables. A flush is the
real persister's version-checked write (`persister/flushes.py`): it lands only where
the row's version is the state's, bumps it, and a replay of the very same flush (same
shard and epoch, version one past) is answered complete again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from auditor.core.rows import FillRow, LedgerItem, OrderOfFill
from services.shard.core.egress import OperatorAudit
from services.shard.core.user_state import UserState
from simulation.core.faults import STORE_ABORT, STORE_UNKNOWN, FaultLog, FaultPlan
from simulation.core.scheduler import Scheduler

COMMITTED = "committed"
ABORTED = "aborted"
UNKNOWN = "unknown"
DOWN = "down"


@dataclass(slots=True)
class StoredUser:
    state: UserState  # its db_version is the row's version
    flush_epoch: int = 0
    flushed_by: str = ""


@dataclass(slots=True)
class StoredOrder:
    order_id: str
    user_id: int
    client_order_id: str
    symbol: str
    side: int
    order_type: int
    price_ticks: int
    quantity_lots: int
    status: int
    filled_lots: int
    remaining_lots: int
    shard_id: str
    created_position: int
    updated_position: int
    accepted_at_ms: int
    update_key: tuple[int, int] = (0, 0)  # (position, item index) of the newest update


FINAL_STATUSES = frozenset({4, 5, 6, 7})  # FILLED, CANCELLED, EXPIRED, REJECTED


@dataclass(frozen=True, slots=True)
class FlushWrite:
    user_id: int
    epoch: int
    state: UserState
    position: int


@dataclass(frozen=True, slots=True)
class FlushAnswer:
    user_id: int
    epoch: int
    completed: bool
    version: int


@dataclass(slots=True)
class Transaction:
    """One persister batch: rows of positions up to `cursor`, written with the cursor."""

    shard_id: str
    cursor: int
    ledger: list[LedgerItem] = field(default_factory=list)
    fills: list[FillRow] = field(default_factory=list)
    inserts: list[StoredOrder] = field(default_factory=list)
    updates: list[tuple[str, int, int, int, int, int]] = field(default_factory=list)
    flushes: list[FlushWrite] = field(default_factory=list)
    audits: list[tuple[tuple[str, int, int], OperatorAudit]] = field(default_factory=list)


class SimPostgres:
    def __init__(
        self, scheduler: Scheduler, rng: random.Random, plan: FaultPlan, log: FaultLog
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.plan = plan
        self.log = log
        self.users: dict[int, StoredUser] = {}
        self.ledger: dict[tuple[str, int, int], LedgerItem] = {}  # its primary key
        self.fills: dict[tuple[str, int, str], FillRow] = {}
        self.audits: dict[tuple[str, int, int], OperatorAudit] = {}  # admin_audit's key
        self.orders: dict[str, StoredOrder] = {}
        self.client_ids: dict[tuple[int, str], str] = {}
        self.cursors: dict[str, int] = {}
        self.down_until_ms = 0
        self.outcomes: dict[str, int] = {COMMITTED: 0, ABORTED: 0, UNKNOWN: 0, DOWN: 0}
        self.unknown_committed = 0
        self.duplicate_rows = 0  # inserts that met a row already there: replays absorbed
        self.lifecycle_breaks: list[str] = []  # an order that left a final status, or unfilled

    @property
    def up(self) -> bool:
        return self.scheduler.now_ms >= self.down_until_ms

    def cursor(self, shard_id: str) -> int | None:
        return self.cursors.get(shard_id, 0) if self.up else None

    def user(self, user_id: int) -> StoredUser | None:
        return self.users.get(user_id)

    def commit(self, transaction: Transaction) -> tuple[str, list[FlushAnswer]]:
        if not self.up:
            self.outcomes[DOWN] += 1
            return DOWN, []
        roll = self.rng.randrange(1_000_000)
        if self.plan.on(STORE_ABORT) and roll < self.plan.store_abort_ppm:
            self.outcomes[ABORTED] += 1
            self.log.note(self.scheduler.now_ms, STORE_ABORT, transaction.shard_id)
            return ABORTED, []
        roll -= self.plan.store_abort_ppm if self.plan.on(STORE_ABORT) else 0
        if self.plan.on(STORE_UNKNOWN) and 0 <= roll < self.plan.store_unknown_ppm:
            self.outcomes[UNKNOWN] += 1
            self.log.note(self.scheduler.now_ms, STORE_UNKNOWN, transaction.shard_id)
            if self.rng.randrange(2):
                self.unknown_committed += 1
                self._apply(transaction)
            return UNKNOWN, []
        self.outcomes[COMMITTED] += 1
        return COMMITTED, self._apply(transaction)

    def flush_replayed(self, shard_id: str, flush: FlushWrite) -> FlushAnswer:
        """After an unknown commit found committed: was this flush the one stored?"""
        stored = self.users.get(flush.user_id)
        version = flush.state.db_version + 1
        carried = (
            stored is not None
            and stored.flushed_by == shard_id
            and stored.flush_epoch == flush.epoch
            and stored.state.db_version == version
        )
        return FlushAnswer(flush.user_id, flush.epoch, carried, version if carried else 0)

    def _apply(self, transaction: Transaction) -> list[FlushAnswer]:
        shard_id = transaction.shard_id
        for order in transaction.inserts:
            existing = self.orders.get(order.order_id)
            if existing is not None:
                self.duplicate_rows += 1
                continue
            self.orders[order.order_id] = order
            self.client_ids.setdefault((order.user_id, order.client_order_id), order.order_id)
        for order_id, status, filled, remaining, position, index in transaction.updates:
            row = self.orders.get(order_id)
            if row is None or (position, index) <= row.update_key:
                continue
            if row.status in FINAL_STATUSES and status != row.status:
                self.lifecycle_breaks.append(f"{order_id}: {row.status} then {status}")
            if filled < row.filled_lots:
                self.lifecycle_breaks.append(f"{order_id}: filled {row.filled_lots} then {filled}")
            row.status, row.filled_lots, row.remaining_lots = status, filled, remaining
            row.updated_position, row.update_key = position, (position, index)
        for item in transaction.ledger:
            key = (item.shard_id, item.position, item.item_index)
            if key in self.ledger:
                self.duplicate_rows += 1
            else:
                self.ledger[key] = item
        for fill in transaction.fills:
            fill_key = (fill.symbol, fill.trade_id, fill.order_id)
            if fill_key in self.fills:
                self.duplicate_rows += 1
            else:
                self.fills[fill_key] = fill
        for key, audit in transaction.audits:
            if key in self.audits:
                self.duplicate_rows += 1
            else:
                self.audits[key] = audit
        answers = []
        for flush in transaction.flushes:
            stored = self.users.get(flush.user_id)
            if stored is not None and stored.state.db_version == flush.state.db_version:
                version = flush.state.db_version + 1
                self.users[flush.user_id] = StoredUser(
                    replace(flush.state, db_version=version), flush.epoch, shard_id
                )
                answers.append(FlushAnswer(flush.user_id, flush.epoch, True, version))
            else:
                answers.append(self.flush_replayed(shard_id, flush))
        self.cursors[shard_id] = transaction.cursor
        return answers

    # --- what the auditor reads ------------------------------------------------------

    def fill_rows(self) -> list[FillRow]:
        """Fills in (symbol, trade id) order, each with its order's row as it stands."""
        rows = []
        for key in sorted(self.fills):
            fill = self.fills[key]
            order = self.orders.get(fill.order_id)
            of = (
                OrderOfFill(
                    order.user_id, order.symbol, order.side, order.order_type, order.price_ticks
                )
                if order is not None
                else None
            )
            rows.append(replace(fill, order=of))
        return rows
