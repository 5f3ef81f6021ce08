"""Egress resume without gap or duplicate, and recovery after SIGKILL from snapshot + log."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import grpc
import pytest

from protos.oms.v1 import shard_pb2
from services.runtime.snapshot_files import FileSnapshotStore
from tests.shard_service.shard_client import (
    POLL_S,
    WAIT_S,
    ShardClient,
    accepted_event,
    deposit,
    fill_event,
    hydrate,
    limit_order,
    matcher_events,
)
from tests.shard_service.shard_process import ShardProcess, aio_channel

USERS = (11, 12, 13)
PRICE = 6_500_000
# Entries between snapshots: more than everything logged after the first one, so the
# log after the newest snapshot always holds a tail to replay.
SNAPSHOT_ENTRIES = 30
CONCURRENT_ATTEMPTS = 2
BURST = 6
# Timer entries off: positions move only with commands, so "the same position" is exact.
ENVIRONMENT = {"OMS_SHARD_TIMER_MS": "0", "OMS_SHARD_SNAPSHOT_ENTRIES": str(SNAPSHOT_ENTRIES)}


def _wire(items: list[shard_pb2.ShardEgress]) -> list[bytes]:
    return [item.SerializeToString(deterministic=True) for item in items]


def _reaches(position: int) -> Callable[[list[shard_pb2.ShardEgress]], bool]:
    return lambda items: bool(items) and items[-1].stamp.position >= position


async def _snapshot_position(shard: ShardClient, store: FileSnapshotStore) -> int:
    """Keep applying small batches until a snapshot is published; its position."""
    deadline = time.monotonic() + WAIT_S
    while not store.positions():
        if time.monotonic() >= deadline:
            raise AssertionError("no snapshot published")
        (funded,) = await shard.run(deposit(USERS[0], 1))
        assert funded.accepted
        await asyncio.sleep(POLL_S)
    return max(store.positions())


async def _state(shard: ShardClient) -> tuple[int, list[shard_pb2.ActorView]]:
    status = await shard.status()
    return status.applied_position, [await shard.actor(user) for user in USERS]


async def _work_before_snapshot(shard: ShardClient) -> None:
    for user in USERS:
        (funded,) = await shard.run(hydrate(user), deposit(user, 10_000_000_000))
        assert funded.accepted
        (placed,) = await shard.run(limit_order(user, "r-1", price_ticks=PRICE, quantity_lots=1))
        assert placed.accepted


async def _work_after_snapshot(shard: ShardClient) -> int:
    """Orders, matcher events and transfers after the snapshot; the last result's position."""
    user = USERS[1]
    (placed,) = await shard.run(limit_order(user, "r-2", price_ticks=PRICE, quantity_lots=2))
    assert placed.accepted
    await shard.run(matcher_events([accepted_event(1, placed.order_id, user)]))
    fill = fill_event(
        2, placed.order_id, user, price_ticks=PRICE, quantity_lots=1, remaining_lots=1, trade_id=1
    )
    await shard.run(matcher_events([fill]))
    (last,) = await shard.run(deposit(USERS[2], 5))
    assert last.accepted
    return last.stamp.position


async def _one_record_of_two_entries(shard: ShardClient) -> tuple[int, int, int]:
    """Bursts of one-command batches until the sequencer logs two of them in one record.

    Returns the two positions and the last position of the burst.
    """
    for _ in range(CONCURRENT_ATTEMPTS):
        async with shard.execute() as stream:
            commands = [deposit(USERS[2], 1) for _ in range(BURST)]
            for command in commands:
                stream.send(command)
            results = [await stream.wait_final(command.correlation_id) for command in commands]
        stamps = sorted((r.stamp.position, r.stamp.consensus_time_ms) for r in results)
        for (first, first_time), (second, second_time) in itertools.pairwise(stamps):
            # One record: consecutive positions at one consensus time.
            if second == first + 1 and first_time == second_time:
                return first, second, stamps[-1][0]
    raise AssertionError("batches sent in a burst never shared a record")


@pytest.mark.slow
async def test_resume_has_no_gap_and_recovery_replays_the_tail(
    new_shard: Callable[..., ShardProcess],
) -> None:
    process = new_shard(environment=ENVIRONMENT)
    store = FileSnapshotStore(process.data_dir / "snapshots")
    process.start_serving()
    async with aio_channel(process.address) as channel:
        shard = ShardClient(channel)
        await _work_before_snapshot(shard)
        first_snapshot = await _snapshot_position(shard, store)
        last = await _work_after_snapshot(shard)
        assert last > first_snapshot

        everything = await shard.egress(until=_reaches(last))
        positions = [item.stamp.position for item in everything]
        assert positions == sorted(positions)
        # Resume: read part, disconnect, resubscribe after the last position kept. A
        # caught-up subscriber gets everything in one message, so "part" is what a
        # consumer processed of it: the positions before the middle one.
        resume_at = positions[len(positions) // 2]
        assert resume_at > positions[0]
        read = await shard.egress(until=_reaches(last))
        first = [item for item in read if item.stamp.position < resume_at]
        second = await shard.egress(from_position=resume_at, until=_reaches(last))
        assert all(item.stamp.position >= resume_at for item in second)
        assert _wire(first + second) == _wire(everything)

        # Resuming at a position inside a multi-entry record skips its earlier entries.
        head, resume_in_record, last = await _one_record_of_two_entries(shard)
        inside = await shard.egress(
            ["result"], from_position=resume_in_record, until=_reaches(resume_in_record)
        )
        inside_positions = [item.stamp.position for item in inside]
        assert inside_positions[0] == resume_in_record, (head, inside_positions)
        assert min(inside_positions) == resume_in_record
        everything = await shard.egress(until=_reaches(last))
        before = await _state(shard)
        assert before[0] >= last

    process.kill()
    # Recovery starts from the newest snapshot published before the kill.
    snapshot_at = max(store.positions())
    assert first_snapshot <= snapshot_at < last
    tail = [item for item in everything if item.stamp.position > snapshot_at]
    assert tail, "the log after the snapshot carries egress"
    process.start_serving()
    async with aio_channel(process.address) as channel:
        shard = ShardClient(channel)
        replayed = await shard.egress(from_position=snapshot_at + 1, until=_reaches(last))
        assert _wire(replayed) == _wire(tail)
        assert await _state(shard) == before
        # Egress older than the snapshot is not retained after a restart.
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await shard.egress(from_position=1, until=bool, timeout_s=WAIT_S)
        assert error.value.code() == grpc.StatusCode.OUT_OF_RANGE
