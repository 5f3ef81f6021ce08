"""The write-behind buffer: write egress turned into rows, in log order, until committed.

The egress follower `add`s items as they arrive and says how far the egress is
complete (`mark_complete`: every item at or before that position is here). The
writer `take`s a prefix of complete, whole positions for one transaction and
`release`s it once committed. An order update whose order is still buffered (and
not taken) merges into the insert, so an order admitted and updated within one
batch costs one row; the PENDING update of the admitting position is what brings
the client order id. After a broken stream, `discard_incomplete` forgets what
came past the complete position: the follower resubscribes right after it.

Bounded: at `max_rows` the follower waits (`wait_for_room`) and with it the
shard's egress stream; the shard keeps its egress for a window, so nothing is lost.
"""

from __future__ import annotations

import asyncio

from persister.flushes import Flush
from persister.operator_audit import AuditRow
from persister.order_rows import NewOrder, OrderChange
from persister.trade_rows import FillRow, LedgerRow
from persister.write_traces import WriteTraces
from protos.oms.v1 import shard_pb2

Op = NewOrder | OrderChange | FillRow | LedgerRow | Flush | AuditRow
WRITE_KINDS = ("submit", "order_update", "fill", "ledger", "begin_dehydrate", "operator_audit")


class WriteBuffer:
    def __init__(self, start_position: int, max_rows: int) -> None:
        self.max_rows = max_rows
        self.full_waits = 0
        self._ops: list[Op] = []
        self._taken = 0  # ops at the front that a transaction in progress writes
        self._open_orders: dict[str, NewOrder] = {}  # buffered and not taken
        self._last_position = start_position
        self._ledger_index = 0  # of the next ledger item at _last_position
        self._audit_index = 0  # of the next operator audit item at _last_position
        self._complete_through = start_position
        self.work = asyncio.Event()  # set while complete positions await a write
        # A flush was buffered: its user's eviction (or an operator's restart) waits on
        # the commit, so the write-behind writes at once instead of on its interval.
        self.hurry = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.traces = WriteTraces()  # sampled orders' rows, for their write's span

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def complete_through(self) -> int:
        return self._complete_through

    # --- filling (the egress follower) ------------------------------------------------

    async def wait_for_room(self) -> None:
        if not self._room.is_set():
            self.full_waits += 1
            await self._room.wait()

    def add(self, item: shard_pb2.ShardEgress) -> None:
        """Buffer one write egress item; items arrive in log position order."""
        position = item.stamp.position
        if position < self._last_position or position <= self._complete_through:
            raise RuntimeError(
                f"egress position {position} after {self._last_position} "
                f"(complete through {self._complete_through}): out of order"
            )
        if position != self._last_position:
            self._last_position = position
            self._ledger_index = 0
            self._audit_index = 0
        time_ms = item.stamp.consensus_time_ms
        kind = item.WhichOneof("egress")
        if kind == "ledger":
            e = item.ledger
            index = self._ledger_index
            self._ledger_index += 1
            self._append(
                LedgerRow(
                    position, index, e.user_id, e.account, e.asset, e.amount, e.reference, time_ms
                )
            )
        elif kind == "order_update":
            self._add_update(item.order_update, position, time_ms)
        elif kind == "submit":
            o = item.submit.order
            new = NewOrder(
                o.order_id,
                o.user_id,
                o.symbol,
                int(o.side),
                int(o.order_type),
                int(o.time_in_force),
                o.price_ticks,
                o.quantity_lots,
                o.quote_amount,
                position,
                time_ms,
                remaining_lots=o.quantity_lots,
                updated_position=position,
                updated_at_ms=time_ms,
            )
            self._open_orders[new.order_id] = new
            self._append(new)
        elif kind == "fill":
            f = item.fill
            self._append(
                FillRow(
                    f.order_id,
                    f.trade_id,
                    f.user_id,
                    f.symbol,
                    int(f.side),
                    f.price_ticks,
                    f.quantity_lots,
                    f.fee,
                    f.maker,
                    position,
                    time_ms,
                )
            )
        elif kind == "begin_dehydrate":
            self._append(Flush.from_egress(item.begin_dehydrate, position))
            self.hurry.set()
        elif kind == "operator_audit":
            self._append(AuditRow.from_egress(item, self._audit_index))
            self._audit_index += 1
        else:
            raise ValueError(f"not a write-behind egress kind: {kind}")

    def mark_complete(self, position: int) -> None:
        """Every item at or before `position` has been added."""
        if position > self._complete_through:
            self._complete_through = position
            self.work.set()

    def discard_incomplete(self) -> None:
        """After a broken stream: forget items past the complete position (they come again)."""
        keep = len(self._ops)
        while keep > self._taken and self._ops[keep - 1].position > self._complete_through:
            keep -= 1
        for op in self._ops[keep:]:
            if isinstance(op, NewOrder):
                self._open_orders.pop(op.order_id, None)
        del self._ops[keep:]
        self._last_position = self._complete_through
        self._ledger_index = 0
        self._audit_index = 0
        self._update_room()

    # --- draining (the writer) ----------------------------------------------------------

    def take(self, max_rows: int) -> tuple[list[Op], int]:
        """The next transaction's rows (whole, complete positions) and the position they
        complete; the same rows again (and maybe more) until `release`."""
        ops = self._ops
        through = self._complete_through
        count = self._taken
        while count < len(ops) and ops[count].position <= through:
            if count >= max_rows and ops[count].position != ops[count - 1].position:
                through = ops[count - 1].position  # capped: the rest goes next
                break
            op = ops[count]
            if isinstance(op, NewOrder):
                self._open_orders.pop(op.order_id, None)  # in a transaction: no more merging
            count += 1
        self._taken = count
        return ops[:count], through

    def release(self, count: int, through: int) -> None:
        """The first `count` rows are committed, and with them every position to `through`."""
        del self._ops[:count]
        self._taken = 0
        if through >= self._complete_through:
            self.work.clear()
        self._update_room()

    def _append(self, op: Op) -> None:
        self._ops.append(op)
        self._update_room()

    def _add_update(self, update: shard_pb2.OrderUpdate, position: int, time_ms: int) -> None:
        order = self._open_orders.get(update.order_id)
        if order is not None:
            if not order.client_order_id:
                order.client_order_id = update.client_order_id
            order.status = int(update.status)
            order.filled_lots = update.filled_lots
            order.remaining_lots = update.remaining_lots
            order.updated_position = position
            order.updated_at_ms = time_ms
            return
        self._append(
            OrderChange(
                update.order_id,
                int(update.status),
                update.filled_lots,
                update.remaining_lots,
                position,
                time_ms,
            )
        )

    def _update_room(self) -> None:
        if len(self._ops) >= self.max_rows:
            self._room.clear()
        else:
            self._room.set()
