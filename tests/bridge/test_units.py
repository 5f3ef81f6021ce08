"""The bridge's pure parts: event commands under the shard's byte cap, the work queue's order."""

from __future__ import annotations

import asyncio

from bridge.event_delivery import EventDelivery
from bridge.matcher_streams import oldest_retained
from bridge.saga_commands import Work, add_command, saga_work
from bridge.statistics import BridgeStatistics
from bridge.work_queue import WorkQueue
from protos.oms.v1 import matcher_pb2, shard_pb2
from services.clients.shard_link import MAX_COMMANDS_PER_BATCH, ShardLink

SHARD_BATCH_BYTES = 3 * 1024 * 1024


def _event(sequence: int) -> matcher_pb2.MatcherEvent:
    event = matcher_pb2.MatcherEvent(
        sequence=sequence, oms_shard="s1", order_id=f"s1:7:{sequence}", user_id=7
    )
    order = event.accepted.order.order
    order.order_id = event.order_id
    order.symbol = "BTC-USDT"
    order.price_ticks = 6_500_000
    order.quantity_lots = 3
    return event


def test_event_commands_keep_order_and_a_full_batch_fits_the_shard_cap() -> None:
    delivery = EventDelivery(
        ShardLink("127.0.0.1:1"), BridgeStatistics(), shard_batch_bytes=SHARD_BATCH_BYTES
    )
    events = [_event(sequence) for sequence in range(1, 20_001)]
    commands = delivery.commands("g1", events)
    assert len(commands) > 1
    delivered = [e for c in commands for e in c.matcher_events.events]
    assert delivered == events
    assert {c.matcher_events.matcher_group for c in commands} == {"g1"}
    largest = max(command.ByteSize() for command in commands)
    assert largest <= delivery.command_bytes
    full = shard_pb2.ShardCommandBatch(commands=[commands[0]] * MAX_COMMANDS_PER_BATCH)
    assert full.ByteSize() <= SHARD_BATCH_BYTES
    assert delivery.commands("g1", events[:1])[0].matcher_events.events[0] == events[0]


def test_oldest_retained_is_read_from_the_matcher_status_details() -> None:
    details = "events of OMS shard 's1' from sequence 2 are gone; the oldest retained is 5"
    assert oldest_retained(details) == 5
    assert oldest_retained("something else") is None
    assert oldest_retained(None) is None


def _submit(order_id: str) -> Work:
    item = shard_pb2.ShardEgress()
    item.submit.matcher_group = "g1"
    item.submit.order.order_id = order_id
    routed = saga_work(item)
    assert routed is not None and routed[0] == "g1"
    return routed[1]


def _cancel(order_id: str) -> Work:
    item = shard_pb2.ShardEgress()
    item.cancel.matcher_group = "g1"
    item.cancel.order_id = order_id
    item.cancel.user_id = 7
    routed = saga_work(item)
    assert routed is not None
    return routed[1]


def _ids(work: list[Work]) -> list[tuple[str, str]]:
    batch = matcher_pb2.MatcherCommandBatch()
    submits = [add_command(batch, item, number) for number, item in enumerate(work, 1)]
    assert [c.correlation_id for c in batch.commands] == list(range(1, len(work) + 1))
    ids: list[tuple[str, str]] = []
    for command, submit in zip(batch.commands, submits, strict=True):
        kind = command.WhichOneof("command")
        assert (kind == "submit") == submit
        ids.append((kind or "", command.submit.order.order_id or command.cancel.order_id))
    return ids


async def test_redriven_sagas_go_before_fresh_ones_and_a_closed_queue_sheds() -> None:
    queue = WorkQueue("g1", capacity=2)
    assert await queue.offer([_submit("x")]) == 1, "closed: shed"
    await queue.open()
    assert await queue.offer([_cancel("a")]) == 0  # fresh, arrived before the re-drive
    await queue.redrive([_submit("a"), _submit("b")])
    assert _ids(await queue.take(10)) == [("submit", "a"), ("submit", "b"), ("cancel", "a")]
    assert saga_work(shard_pb2.ShardEgress(result=shard_pb2.ShardResult())) is None

    blocked = asyncio.create_task(queue.offer([_submit(name) for name in "cdef"]))
    await asyncio.sleep(0)
    assert not blocked.done(), "full after c and d: the egress reader waits"
    assert _ids(await queue.take(1)) == [("submit", "c")]
    await asyncio.sleep(0)
    assert not blocked.done()
    assert _ids(await queue.take(3)) == [("submit", "d"), ("submit", "e")]
    assert await blocked == 0
    assert _ids(await queue.take(3)) == [("submit", "f")]
    await queue.offer([_submit("g")])
    await queue.close()
    assert len(queue) == 0
    waiting = asyncio.create_task(queue.take(10))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
