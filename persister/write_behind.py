"""Write-behind: the shard's order, fill, ledger and flush egress, committed in batches.

The egress follower fills the `WriteBuffer` in log order. About every
`interval_ms` (at once when a reader waits for a position, or a flush for its answer)
one transaction writes what is complete:
orders inserted, order updates, fills, ledger rows, dehydration flushes (CAS),
and the persister cursor moved to the last position written. So the cursor
passes a position only once everything at or before it is committed, and a
restart from the cursor neither loses nor doubles a row.

Flush answers go to the shard only after the commit. Reads that must see every
write before their own position wait on `wait_committed`.

A batch the database refuses (a CHECK, a value out of range) is written again
row by row, each in a savepoint: the bad rows are counted in `rejected_rows`,
logged and skipped, and the stream goes on. An unreachable database is retried
with backoff while the buffer (bounded) holds the rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from persister import answers
from persister.answers import AnswerSink
from persister.counters import Counters
from persister.cursor import write_cursor
from persister.errors import ConflictError, RowRejected, StoreUnavailable
from persister.flushes import Flush, FlushOutcome, write_flushes
from persister.operator_audit import AuditRow, insert_audit_rows
from persister.order_rows import (
    InsertReport,
    NewOrder,
    OrderChange,
    change_columns,
    classify_orders,
    insert_orders,
    order_columns,
    update_orders,
)
from persister.store import Session, Store
from persister.trade_rows import (
    FillReport,
    FillRow,
    LedgerRow,
    classify_fills,
    fill_columns,
    insert_fills,
    insert_ledger,
    ledger_columns,
)
from persister.write_buffer import Op, WriteBuffer
from persister.writer_fence import WriterFence
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)

FINAL_WRITE_S = 5.0
ONE_CALL = "SELECT * FROM oms_write_rows({})".format(
    ", ".join(f"${number}" for number in range(1, 3 + 18 + 6 + 11 + 8 + 1))
)
CURSOR_REFRESH_S = 1.0
MAX_RETRY_DELAY_S = 2.0

COUNTERS = (
    "transactions",
    "orders_inserted",
    "order_updates_written",
    "order_updates_skipped",
    "fills_inserted",
    "ledger_rows_inserted",
    "audit_rows_inserted",
    "conflicts_absorbed",
    "replayed_rows",
    "duplicate_command_reached_db",
    "duplicate_order_reached_db",
    "duplicate_fill_reached_db",
    "rejected_rows",
    "batch_fallbacks",
    "store_retries",
    "flushes_completed",
    "flushes_replayed",
    "flushes_refused",
)


@dataclass(slots=True)
class _Outcome:
    """What one transaction did, counted only once it committed."""

    counts: dict[str, int] = field(default_factory=dict)
    flushes: list[FlushOutcome] = field(default_factory=list)

    def add(self, name: str, amount: int = 1) -> None:
        if amount:
            self.counts[name] = self.counts.get(name, 0) + amount


class WriteBehind:
    def __init__(
        self,
        store: Store,
        shard_id: str,
        shard: AnswerSink,
        counters: Counters,
        buffer: WriteBuffer,
        *,
        interval_ms: int,
        max_rows_per_transaction: int,
    ) -> None:
        self.store = store
        self.shard_id = shard_id
        self.shard = shard
        self.counters = counters
        self.buffer = buffer
        self.interval_s = interval_ms / 1000
        self.max_rows_per_transaction = max_rows_per_transaction
        self._committed_through = buffer.complete_through
        self._committed = asyncio.Condition()
        self._cursor_written_at = float("-inf")
        # The cursor stored in PostgreSQL, and the last value told to the shard, which
        # logs it (`Persisted`) so its replicas keep egress after it replayable.
        self._cursor_stored = buffer.complete_through
        self._cursor_reported = 0
        self._cursor_reported_at = float("-inf")

    @property
    def committed_through(self) -> int:
        return self._committed_through

    async def wait_committed(self, position: int) -> None:
        """Until every write at or before `position` is committed; a reader waiting
        makes the next write start at once rather than on the interval."""
        if self._committed_through >= position:
            return
        self.buffer.hurry.set()
        async with self._committed:
            await self._committed.wait_for(lambda: self._committed_through >= position)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_start = 0.0
        try:
            hurry = self.buffer.hurry
            while True:
                await self.buffer.work.wait()
                wait_s = last_start + self.interval_s - loop.time()
                if wait_s > 0 and not hurry.is_set():
                    # The interval, unless a reader or a flush waits for the commit.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await hurry.wait()
                hurry.clear()
                last_start = loop.time()
                await self._write_with_retries()
        except asyncio.CancelledError:
            # Graceful stop: commit what is complete, briefly; the cursor covers the rest.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(FINAL_WRITE_S):
                    while self.buffer.complete_through > self._committed_through:
                        await self._write_once()
            raise

    async def _write_with_retries(self) -> None:
        delay_s = 0.05
        while True:
            try:
                await self._write_once()
                return
            except StoreUnavailable as error:
                self.counters.add("store_retries")
                log.warning("persister.store_unavailable", error=str(error), retry_in_s=delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, MAX_RETRY_DELAY_S)

    async def _write_once(self) -> None:
        ops, through = self.buffer.take(self.max_rows_per_transaction)
        if not ops:
            # Positions with nothing to write (timers, reads) are committed as they are. The
            # stored cursor follows at most once a second: a restart re-reads a second of
            # positions holding nothing to write, and never resumes from a position so
            # old that the shard's egress window no longer holds it.
            if through > self._committed_through:
                now = asyncio.get_running_loop().time()
                if now - self._cursor_written_at >= CURSOR_REFRESH_S:
                    async with self.store.transaction() as session:
                        await write_cursor(session, self.shard_id, through)
                    self._cursor_written_at = now
                    self._cursor_stored = through
                self._committed_through = through
                async with self._committed:
                    self._committed.notify_all()
            self.buffer.release(0, through)
            await self._report_cursor()
            return
        traced_from_ns = time.time_ns() if self.buffer.traces else 0
        try:
            outcome = await self._write_in_one_call(ops, through)
            if outcome is None:
                async with self.store.transaction() as session:
                    outcome = await self._write_batch(session, ops)
                    await write_cursor(session, self.shard_id, through)
        except (RowRejected, ConflictError) as error:
            log.warning("persister.batch_refused", error=str(error), rows=len(ops))
            async with self.store.transaction() as session:
                outcome = await self._write_rows(session, ops)
                await write_cursor(session, self.shard_id, through)
            outcome.add("batch_fallbacks")
        self.buffer.release(len(ops), through)
        self._cursor_written_at = asyncio.get_running_loop().time()
        self._cursor_stored = max(self._cursor_stored, through)
        self._committed_through = max(self._committed_through, through)
        if traced_from_ns:
            self.buffer.traces.committed(through, traced_from_ns)
        self._count(outcome)
        if outcome.flushes:
            await self.shard.send([_flush_answer(flush) for flush in outcome.flushes])
        async with self._committed:
            self._committed.notify_all()
        await self._report_cursor()

    async def _report_cursor(self) -> None:
        """Tell the shard the stored cursor, at most once a second: one log entry a
        second, and a shard restarted into leadership replays from a snapshot at or
        before it (services/runtime/core/snapshot_policy.py). A report lost on a broken
        link is made good by the next one."""
        stored = self._cursor_stored
        now = asyncio.get_running_loop().time()
        if stored <= self._cursor_reported or now - self._cursor_reported_at < CURSOR_REFRESH_S:
            return
        self._cursor_reported, self._cursor_reported_at = stored, now
        await self.shard.send([answers.persisted(stored)])

    def _count(self, outcome: _Outcome) -> None:
        self.counters.add("transactions")
        for name, amount in outcome.counts.items():
            self.counters.add(name, amount)
        for flush in outcome.flushes:
            if not flush.completed:
                self.counters.add("flushes_refused")
                log.warning(
                    "persister.flush_refused",
                    user_id=flush.flush.user_id,
                    epoch=flush.flush.epoch,
                    reason=flush.reason,
                )
            elif flush.replayed:
                self.counters.add("flushes_replayed")
            else:
                self.counters.add("flushes_completed")

    # --- one transaction ----------------------------------------------------------------

    async def _write_in_one_call(self, ops: list[Op], through: int) -> _Outcome | None:
        """The usual batch (orders, their changes, fills, ledger rows) with the fence and
        the cursor in one statement, one round trip (`oms_write_rows`, migration 0007);
        None for a batch holding flushes or audit rows, or a store with no writer token,
        which the statements one by one write instead."""
        fence = self.store.fence
        orders, changes, fills, ledger, flushes, audits = _split(ops)
        if flushes or audits or not isinstance(fence, WriterFence):
            return None
        row = await self.store.one_statement(
            ONE_CALL,
            self.shard_id,
            fence.token,
            through,
            *order_columns(orders),
            *change_columns(changes),
            *fill_columns(fills),
            *ledger_columns(ledger),
        )
        assert row is not None  # a function call returns its one row
        outcome = _Outcome()
        inserted_orders = set(row["inserted_orders"])
        inserted_fills = set(
            zip(row["inserted_fill_orders"], row["inserted_fill_trades"], strict=True)
        )
        if len(inserted_orders) < len(orders) or len(inserted_fills) < len(fills):
            # Some rows were there already (a replay after a restart, or a duplicate that
            # reached the database): what is stored says which, as in `_write_batch`.
            async with self.store.session() as session:
                if orders:
                    self._count_orders(
                        outcome, await classify_orders(session, orders, inserted_orders)
                    )
                if fills:
                    self._count_fills(outcome, await classify_fills(session, fills, inserted_fills))
        else:
            outcome.add("orders_inserted", len(orders))
            outcome.add("fills_inserted", len(fills))
        outcome.add("order_updates_written", row["changed_orders"])
        outcome.add("order_updates_skipped", len(changes) - row["changed_orders"])
        replayed = len(ledger) - row["inserted_ledger"]
        outcome.add("ledger_rows_inserted", row["inserted_ledger"])
        outcome.add("replayed_rows", replayed)
        outcome.add("conflicts_absorbed", replayed)
        return outcome

    async def _write_batch(self, session: Session, ops: list[Op]) -> _Outcome:
        outcome = _Outcome()
        orders, changes, fills, ledger, flushes, audits = _split(ops)
        if orders:
            self._count_orders(outcome, await insert_orders(session, orders, self.shard_id))
        if changes:
            written = await update_orders(session, changes)
            outcome.add("order_updates_written", written)
            outcome.add("order_updates_skipped", len(changes) - written)
        if fills:
            self._count_fills(outcome, await insert_fills(session, fills, self.shard_id))
        if ledger:
            replayed = await insert_ledger(session, ledger, self.shard_id)
            outcome.add("ledger_rows_inserted", len(ledger) - replayed)
            outcome.add("replayed_rows", replayed)
            outcome.add("conflicts_absorbed", replayed)
        if audits:
            replayed = await insert_audit_rows(session, audits, self.shard_id)
            outcome.add("audit_rows_inserted", len(audits) - replayed)
            outcome.add("replayed_rows", replayed)
        if flushes:
            outcome.flushes = await write_flushes(session, flushes, self.shard_id)
        return outcome

    async def _write_rows(self, session: Session, ops: list[Op]) -> _Outcome:
        """The batch again, one row per savepoint: refused rows are counted and skipped."""
        outcome = _Outcome()
        for op in _write_order(ops):
            try:
                async with session.savepoint():
                    single = await self._write_batch(session, [op])
            except (RowRejected, ConflictError) as error:
                outcome.add("rejected_rows")
                log.error("persister.row_rejected", row=_describe(op), error=str(error))
                if isinstance(op, Flush):
                    outcome.flushes.append(
                        FlushOutcome(op, False, 0, reason=f"the database refused it: {error}")
                    )
                continue
            for name, amount in single.counts.items():
                outcome.add(name, amount)
            outcome.flushes.extend(single.flushes)
        return outcome

    def _count_orders(self, outcome: _Outcome, report: InsertReport) -> None:
        outcome.add("orders_inserted", report.inserted)
        outcome.add("replayed_rows", report.replayed)
        conflicts = report.replayed + len(report.duplicate_orders) + len(report.duplicate_commands)
        outcome.add("conflicts_absorbed", conflicts)
        outcome.add("duplicate_order_reached_db", len(report.duplicate_orders))
        outcome.add("duplicate_command_reached_db", len(report.duplicate_commands))
        outcome.add("rejected_rows", len(report.unexplained))
        for order in report.duplicate_orders:
            log.error("persister.duplicate_order_reached_db", row=_describe(order))
        for order in report.duplicate_commands:
            log.error("persister.duplicate_command_reached_db", row=_describe(order))
        for order in report.unexplained:
            log.error("persister.row_rejected", row=_describe(order), error="conflict not found")

    def _count_fills(self, outcome: _Outcome, report: FillReport) -> None:
        outcome.add("fills_inserted", report.inserted)
        outcome.add("replayed_rows", report.replayed)
        outcome.add("conflicts_absorbed", report.replayed + len(report.duplicates))
        outcome.add("duplicate_fill_reached_db", len(report.duplicates))
        for fill in report.duplicates:
            log.error("persister.duplicate_fill_reached_db", row=_describe(fill))


def _split(
    ops: list[Op],
) -> tuple[
    list[NewOrder], list[OrderChange], list[FillRow], list[LedgerRow], list[Flush], list[AuditRow]
]:
    orders: list[NewOrder] = []
    latest: dict[str, OrderChange] = {}
    fills: list[FillRow] = []
    ledger: list[LedgerRow] = []
    flushes: list[Flush] = []
    audits: list[AuditRow] = []
    for op in ops:
        if isinstance(op, LedgerRow):
            ledger.append(op)
        elif isinstance(op, OrderChange):
            latest[op.order_id] = op  # log order: the newest change per order wins
        elif isinstance(op, NewOrder):
            orders.append(op)
        elif isinstance(op, FillRow):
            fills.append(op)
        elif isinstance(op, AuditRow):
            audits.append(op)
        else:
            flushes.append(op)
    return orders, list(latest.values()), fills, ledger, flushes, audits


def _write_order(ops: list[Op]) -> list[Op]:
    """Inserts before the updates that may touch them, as in a batch."""
    orders, changes, fills, ledger, flushes, audits = _split(ops)
    return [*orders, *changes, *fills, *ledger, *audits, *flushes]


def _flush_answer(outcome: FlushOutcome) -> shard_pb2.ShardCommand:
    flush = outcome.flush
    if outcome.completed:
        return answers.flush_complete(flush.user_id, flush.epoch, outcome.version)
    return answers.flush_refused(flush.user_id, flush.epoch, outcome.reason)


def _describe(op: Any) -> dict[str, Any]:
    fields = getattr(op, "__slots__", ())
    described = {name: getattr(op, name) for name in fields if name not in ("state",)}
    described["kind"] = type(op).__name__
    return described
