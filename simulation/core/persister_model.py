"""The persister of one shard: the write-behind over the simulated PostgreSQL.

As `persister/` does: it follows the shard leader's durable egress from the cursor
stored in the database, writes each batch's rows and the new cursor in one
transaction, then answers the shard on its stream: flushes (after the commit),
hydrations and dedup lookups (reads after every earlier write committed). A commit
whose outcome is unknown is resolved by reading the cursor back: moved, the batch
is in, and each flush is answered by whether the row carries it (the replay rule);
not moved, the batch is written again. A cursor that left the shard's window is the
real persister's `EgressGapError`: it stops, and the simulation calls that a
violation. What it wrote is what a trader reads of the egress: the world checks it
(`cancel_all_check.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from auditor.core.rows import FillRow, LedgerItem
from services.shard.core.codec import command_to_protobuf
from services.shard.core.commands import (
    DedupAnswer,
    FlushComplete,
    FlushRefused,
    HydrateUser,
    Persisted,
)
from services.shard.core.egress import (
    BeginDehydrate,
    DedupLookup,
    FillRecord,
    HydrateRequest,
    LedgerPosting,
    OperatorAudit,
    OrderUpdate,
    SubmitToMatcher,
)
from services.shard.core.user_state import RecentResult
from services.shard.core.vocabulary import PENDING
from simulation.core.defects import PERSISTER_TRUSTS_UNKNOWN
from simulation.core.links import Stream
from simulation.core.process import SimProcess
from simulation.core.store_model import (
    COMMITTED,
    UNKNOWN,
    FlushAnswer,
    FlushWrite,
    StoredOrder,
    Transaction,
)

if TYPE_CHECKING:
    from simulation.core.replica_node import ShardReplica
    from simulation.core.world import SimWorld

TICK_MS = 5
RECORDS_PER_TRANSACTION = 256
# Row index within a log position: one egress item's ledger rows side by side.
ROWS_PER_ITEM = 64
# Flush answers sent again on a new stream (`persister/` does the same).
RECENT_FLUSH_ANSWERS = 256
CURSOR_REPORT_INTERVAL_MS = 1_000  # `persister/write_behind.py`: CURSOR_REFRESH_S


class SimPersister(SimProcess):
    def __init__(self, world: SimWorld, shard_id: str) -> None:
        super().__init__(world, f"persister {shard_id}", TICK_MS)
        self.shard_id = shard_id
        self.boot()

    def boot(self) -> None:
        self.cursor: int | None = None  # read from the database first
        self.stream = Stream(self.world.network, f"persister→{self.shard_id}")
        self.target = ""
        self.recent_flush_answers: deque[FlushComplete | FlushRefused] = deque(
            maxlen=RECENT_FLUSH_ANSWERS
        )
        self.cursor_reported_at_ms = -CURSOR_REPORT_INTERVAL_MS
        super().boot()

    def step(self) -> None:
        world = self.world
        store = world.store
        if self.cursor is None:
            self.cursor = store.cursor(self.shard_id)
            if self.cursor is None:
                return
        leader = world.leading_replica(self.shard_id)
        if leader is None:
            return
        if self.stream.broken or self.target != leader.name:
            self.stream.reopen()
            self.target = leader.name
            if self.recent_flush_answers:  # as the real one: the shard drops stale ones
                self._send(leader, list(self.recent_flush_answers))
        entries = leader.window_from(self.cursor + 1)
        if entries is None:
            self.stopped = (
                f"egress gap: cursor {self.cursor}, {leader.name} kept from {leader.window_start}"
            )
            world.violation("egress-gap", f"persister {self.shard_id}: {self.stopped}")
            return
        entries = entries[:RECORDS_PER_TRANSACTION]
        if not entries:
            # Positions with no egress: the cursor follows the applied position lazily.
            return
        transaction, reads = self._transaction(entries)
        outcome, answers = store.commit(transaction)
        if outcome == UNKNOWN and world.config.defect == PERSISTER_TRUSTS_UNKNOWN:
            outcome, answers = COMMITTED, []
        if outcome == UNKNOWN:
            resolved = store.cursor(self.shard_id)
            world.figures["unknown_commits_resolved"] += resolved is not None
            if resolved is None:
                self.cursor = None  # read again when the database answers
                return
            if resolved < transaction.cursor:
                return  # not written: the same rows again next tick
            outcome = COMMITTED
            answers = [store.flush_replayed(self.shard_id, f) for f in transaction.flushes]
            world.figures["unknown_commits_found_committed"] += 1
        if outcome != COMMITTED:
            return
        self.cursor = transaction.cursor
        world.egress_written(self.shard_id, entries)
        commands: list[Any] = [self._flush_answer(answer) for answer in answers]
        self.recent_flush_answers.extend(commands)
        commands.extend(self._read(read) for read in reads)
        now = world.scheduler.now_ms
        if now - self.cursor_reported_at_ms >= CURSOR_REPORT_INTERVAL_MS:
            # The stored cursor, logged by the shard: its replicas keep a snapshot at or
            # before it and replay from there (`persister/write_behind.py` does the same).
            self.cursor_reported_at_ms = now
            commands.append(Persisted(world.new_correlation(), self.cursor))
        if commands:
            self._send(leader, commands)

    def _send(self, leader: ShardReplica, commands: Sequence[Any]) -> None:
        messages = [command_to_protobuf(command) for command in commands]

        def arrive() -> None:
            if leader.leading:
                leader.pending.extend(messages)
            else:
                self.stream.break_now()

        self.stream.send(arrive)

    def _flush_answer(self, answer: FlushAnswer) -> FlushComplete | FlushRefused:
        correlation = self.world.new_correlation()
        if answer.completed:
            return FlushComplete(correlation, answer.user_id, answer.epoch, answer.version)
        return FlushRefused(correlation, answer.user_id, answer.epoch, "version conflict")

    def _read(self, item: HydrateRequest | DedupLookup) -> HydrateUser | DedupAnswer:
        store = self.world.store
        correlation = self.world.new_correlation()
        if isinstance(item, HydrateRequest):
            stored = store.user(item.user_id)
            if stored is None:
                return HydrateUser(correlation, item.user_id, item.epoch, False, None)
            return HydrateUser(correlation, item.user_id, item.epoch, True, stored.state)
        order_id = store.client_ids.get((item.user_id, item.client_order_id))
        original = None
        if order_id is not None:
            row = store.orders[order_id]
            original = RecentResult(item.client_order_id, order_id, 0, row.accepted_at_ms)
        return DedupAnswer(
            correlation, item.user_id, item.client_order_id, original is not None, original
        )

    def _transaction(
        self, entries: Sequence[tuple[int, int, Sequence[Any]]]
    ) -> tuple[Transaction, list[HydrateRequest | DedupLookup]]:
        shard = self.shard_id
        transaction = Transaction(shard, entries[-1][0])
        reads: list[HydrateRequest | DedupLookup] = []
        for position, consensus_ms, items in entries:
            for index, item in enumerate(items):
                kind = type(item)
                if kind is SubmitToMatcher:
                    request = item.request
                    transaction.inserts.append(
                        StoredOrder(
                            item.order_id,
                            request.user_id,
                            request.client_order_id,
                            request.symbol,
                            request.side,
                            request.order_type,
                            request.price_ticks,
                            request.quantity_lots,
                            PENDING,
                            0,
                            request.quantity_lots,
                            shard,
                            position,
                            position,
                            consensus_ms,
                        )
                    )
                elif kind is OrderUpdate:
                    transaction.updates.append(
                        (
                            item.order_id,
                            item.status,
                            item.filled_lots,
                            item.remaining_lots,
                            position,
                            index,
                        )
                    )
                elif kind is LedgerPosting:
                    for row_index, (user_id, account, asset, amount) in enumerate(item.rows):
                        transaction.ledger.append(
                            LedgerItem(
                                shard,
                                position,
                                index * ROWS_PER_ITEM + row_index,
                                user_id,
                                account,
                                asset,
                                amount,
                                item.reference,
                            )
                        )
                elif kind is FillRecord:
                    transaction.fills.append(
                        FillRow(
                            item.order_id,
                            item.trade_id,
                            item.user_id,
                            item.symbol,
                            item.side,
                            item.price_ticks,
                            item.quantity_lots,
                            item.fee,
                            item.maker,
                            shard,
                            position,
                            None,
                        )
                    )
                elif kind is BeginDehydrate:
                    transaction.flushes.append(
                        FlushWrite(item.user_id, item.epoch, item.state, position)
                    )
                elif kind is OperatorAudit:
                    transaction.audits.append(((shard, position, index), item))
                elif kind is HydrateRequest or kind is DedupLookup:
                    reads.append(item)
        return transaction, reads
