"""The write-behind buffer on its own: rows per position, merges, whole-position batches,
and what a broken stream throws away."""

from __future__ import annotations

import pytest

from persister.order_rows import NewOrder, OrderChange
from persister.trade_rows import LedgerRow
from persister.write_buffer import WriteBuffer
from protos.oms.v1 import common_pb2, shard_pb2


def _ledger(position: int, amount: int) -> shard_pb2.ShardEgress:
    item = shard_pb2.ShardEgress()
    item.stamp.position = position
    item.ledger.user_id = 7
    item.ledger.account = "user"
    item.ledger.asset = "USDT"
    item.ledger.amount = amount
    item.ledger.reference = f"t-{position}"
    return item


def _submit(position: int, order_id: str) -> shard_pb2.ShardEgress:
    item = shard_pb2.ShardEgress()
    item.stamp.position = position
    item.stamp.consensus_time_ms = 1_000 + position
    item.submit.order.order_id = order_id
    item.submit.order.user_id = 7
    item.submit.order.quantity_lots = 5
    return item


def _update(position: int, order_id: str, status: int, filled: int) -> shard_pb2.ShardEgress:
    item = shard_pb2.ShardEgress()
    item.stamp.position = position
    update = item.order_update
    update.order_id = order_id
    update.client_order_id = f"c-{order_id}"
    update.status = status  # type: ignore[assignment]
    update.filled_lots = filled
    update.remaining_lots = 5 - filled
    return item


def test_ledger_items_are_numbered_within_their_position() -> None:
    buffer = WriteBuffer(start_position=0, max_rows=100)
    for position, amount in ((3, 1), (3, -1), (4, 2), (4, -2), (4, 0)):
        buffer.add(_ledger(position, amount))
    buffer.mark_complete(4)
    ops, through = buffer.take(100)
    assert through == 4
    assert [(op.position, op.item_index) for op in ops if isinstance(op, LedgerRow)] == [
        (3, 0), (3, 1), (4, 0), (4, 1), (4, 2),
    ]  # fmt: skip


def test_updates_merge_into_a_buffered_insert_and_follow_a_taken_one() -> None:
    buffer = WriteBuffer(start_position=0, max_rows=100)
    buffer.add(_submit(5, "s1:7:1"))
    buffer.add(_update(5, "s1:7:1", common_pb2.ORDER_STATUS_PENDING, 0))
    buffer.add(_update(6, "s1:7:1", common_pb2.ORDER_STATUS_PARTIALLY_FILLED, 2))
    buffer.mark_complete(6)
    ops, _ = buffer.take(100)
    (order,) = ops
    assert isinstance(order, NewOrder)
    assert order.client_order_id == "c-s1:7:1" and order.filled_lots == 2
    assert (order.position, order.updated_position, order.accepted_at_ms) == (5, 6, 1_005)
    # Taken by a transaction: a later update is a row of its own, written after it.
    buffer.add(_update(7, "s1:7:1", common_pb2.ORDER_STATUS_FILLED, 5))
    assert order.status == common_pb2.ORDER_STATUS_PARTIALLY_FILLED
    buffer.release(1, 6)
    buffer.mark_complete(7)
    (change,), _ = buffer.take(100)
    assert change == OrderChange("s1:7:1", common_pb2.ORDER_STATUS_FILLED, 5, 0, 7, 0)


def test_a_capped_batch_ends_on_a_whole_position() -> None:
    buffer = WriteBuffer(start_position=0, max_rows=100)
    for position in (1, 1, 1, 2, 2, 3):
        buffer.add(_ledger(position, 1))
    buffer.mark_complete(3)
    ops, through = buffer.take(2)
    assert (len(ops), through) == (3, 1)  # position 1 stays whole
    buffer.release(len(ops), through)
    assert buffer.work.is_set()
    ops, through = buffer.take(2)
    assert (len(ops), through) == (2, 2)
    buffer.release(len(ops), through)
    ops, through = buffer.take(2)
    assert (len(ops), through) == (1, 3)
    buffer.release(len(ops), through)
    assert not buffer.work.is_set() and len(buffer) == 0


def test_a_broken_stream_drops_only_what_came_past_the_complete_position() -> None:
    buffer = WriteBuffer(start_position=10, max_rows=3)
    buffer.add(_ledger(11, 1))
    buffer.add(_ledger(12, 1))
    buffer.mark_complete(11)
    buffer.add(_ledger(12, 2))  # position 12 may go on in the next message
    assert len(buffer) == 3
    buffer.discard_incomplete()
    assert len(buffer) == 1 and buffer.complete_through == 11
    # The stream resumes at 12, from its first item: numbering starts again.
    buffer.add(_ledger(12, 1))
    buffer.mark_complete(12)
    ops, through = buffer.take(10)
    assert through == 12
    assert [(op.position, op.item_index) for op in ops if isinstance(op, LedgerRow)] == [
        (11, 0), (12, 0),
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="out of order"):
        buffer.add(_ledger(12, 9))


async def test_a_full_buffer_holds_the_follower_until_rows_are_committed() -> None:
    buffer = WriteBuffer(start_position=0, max_rows=2)
    buffer.add(_ledger(1, 1))
    buffer.add(_ledger(1, -1))
    buffer.mark_complete(1)
    ops, through = buffer.take(10)
    buffer.release(len(ops), through)
    await buffer.wait_for_room()  # returns at once: room again
    assert buffer.full_waits == 0
