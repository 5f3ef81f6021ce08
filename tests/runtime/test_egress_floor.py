"""The egress floor: a replica keeps, and restarts from, a snapshot at or before the
position its lagging consumer (the persister) resumes after (`core/snapshot_policy.py`).

`oms sim --seed 80` found the defect these guard against: PostgreSQL down, the
persister's cursor behind; a shard replica snapshots past it, restarts from that
snapshot and leads; its egress starts after the snapshot, and the persister, which
will not skip rows, stops for good.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.log_batch import LogBatch
from services.runtime.core.snapshot_policy import (
    EMPTY_STATE,
    floor_snapshot,
    log_needed_after,
    replay_again_from,
    snapshots_to_keep,
)
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle

SEGMENT_BYTES = 16 * 1024
RECORDS_BETWEEN_SNAPSHOTS = 30


def test_the_newest_are_kept_and_the_one_at_or_before_the_floor() -> None:
    positions = [100, 200, 300, 400]
    assert snapshots_to_keep(positions, 2, None) == [300, 400]  # no consumer (a matcher)
    assert snapshots_to_keep(positions, 2, 0) == [300, 400]  # none old enough: the log is
    assert snapshots_to_keep(positions, 2, 250) == [200, 300, 400]
    assert snapshots_to_keep(positions, 2, 99) == [300, 400]  # none old enough to help
    assert snapshots_to_keep(positions, 2, 350) == [300, 400]  # already among the newest
    assert snapshots_to_keep(positions, 1, 10_000) == [400]
    assert snapshots_to_keep([], 2, 50) == []
    assert floor_snapshot(positions, 200) == 200
    assert log_needed_after([200, 300, 400], 250) == 200
    assert log_needed_after([300, 400], 250) == EMPTY_STATE  # the whole log, from its start
    assert log_needed_after([300, 400], None) == 300
    assert log_needed_after([], None) == EMPTY_STATE
    with pytest.raises(ValueError):
        snapshots_to_keep(positions, 0, 0)


def test_a_restart_replays_again_only_when_an_older_snapshot_covers_the_floor() -> None:
    kept = [200, 300, 400]
    assert replay_again_from(400, 450, kept, 201) is None  # the floor is past it: once
    assert replay_again_from(400, 400, kept, 201) is None
    assert replay_again_from(400, 250, kept, 201) == 200
    assert replay_again_from(400, 250, kept, 202) is None  # the log no longer reaches back
    assert replay_again_from(400, 150, kept, 1) == EMPTY_STATE  # the whole log, from its start
    assert replay_again_from(400, 150, kept, 201) is None  # nothing old enough any more
    assert replay_again_from(0, 0, [], 1) is None  # no snapshot at all


class Floor:
    """What the machine would say: the consumer's cursor as the log last heard it."""

    def __init__(self) -> None:
        self.position = 0

    def __call__(self) -> int:
        return self.position


def node_at(data_dir: Path, floor: Floor) -> RuntimeNode[object]:
    return RuntimeNode(
        CounterMachine(),
        NodeSettings(
            data_dir=data_dir,
            checkpoint_interval_entries=10,
            snapshot_interval_entries=0,
            snapshots_retained=1,
            sequencer=SequencerSettings(timer_interval_ms=0),
        ),
        log_store=FileLogStore(data_dir / "log", segment_bytes=SEGMENT_BYTES),
        egress_floor=floor,
    )


async def write_records(node: RuntimeNode[object], task: asyncio.Task[None], count: int) -> None:
    for index in range(count):
        await settle(node.sequencer.submit_many([encode_increment(index % 7, 1)]), task)


async def build(data_dir: Path, floor: Floor, floor_past_first: int | None) -> list[int]:
    """Three snapshots RECORDS_BETWEEN_SNAPSHOTS records apart, the floor moved to
    `floor_past_first` past the first before the second and third are published (None:
    left at 0); then more records, and the process ends. Returns the positions taken."""
    node = node_at(data_dir, floor)
    await node.recover()
    task = asyncio.create_task(node.run())
    taken: list[int] = []
    try:
        for round_index in range(3):
            await write_records(node, task, RECORDS_BETWEEN_SNAPSHOTS)
            if round_index == 1 and floor_past_first is not None:
                floor.position = taken[0] + floor_past_first
            taken.append(await settle(asyncio.ensure_future(node.snapshot_now()), task))
        await write_records(node, task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await node.close()
    return taken


class FeedProbe:
    def __init__(self) -> None:
        self.feed: DurableEgressFeed[object] = DurableEgressFeed()
        self.rewinds = 0

    def publish(self, batch: LogBatch, outputs: list[Sequence[object]]) -> None:
        self.feed.publish(batch, outputs)

    def rewound(self) -> None:
        self.rewinds += 1
        self.feed.clear()


async def test_a_restart_behind_the_floor_replays_from_the_snapshot_kept_for_it(
    tmp_path: Path,
) -> None:
    floor = Floor()
    first, second, third = await build(tmp_path, floor, floor_past_first=None)
    floor.position = first + 3  # the persister's cursor: past the first snapshot only
    # The floor stood at 0 (nothing persisted) when each snapshot was published: with one
    # retained, none older was kept, but neither was the log truncated: the restart
    # replays it all, from the state before its first entry.
    node = node_at(tmp_path, floor)
    probe = FeedProbe()
    try:
        assert node.snapshots.positions() == [third]
        report = await node.recover(probe.publish, on_rewound=probe.rewound)
        assert report.snapshot_position == EMPTY_STATE and probe.rewinds == 1
        assert probe.feed.oldest_position == 1
        assert node.replica.applied_position == probe.feed.durable_position
    finally:
        await node.close()

    floor2 = Floor()
    folder = tmp_path / "held"
    first, second, third = await build(folder, floor2, floor_past_first=3)
    assert first < second < third
    # The floor stood before `second` when it and `third` were published: `first` is
    # the newest at or before it, and stays beside the newest.
    node = node_at(folder, floor2)
    probe = FeedProbe()
    try:
        assert node.snapshots.positions() == [first, third]
        floor2.position = first + 3
        report = await node.recover(probe.publish, on_rewound=probe.rewound)
        assert probe.rewinds == 1
        assert report.snapshot_position == first
        # The consumer resumes after its cursor, and finds it.
        assert probe.feed.oldest_position == first + 1 <= floor2.position + 1
        assert node.replica.applied_position == probe.feed.durable_position
    finally:
        await node.close()

    # Once the floor is past the newest snapshot, a restart replays once, from it.
    node = node_at(folder, floor2)
    probe = FeedProbe()
    floor2.position = third + 1
    try:
        report = await node.recover(probe.publish, on_rewound=probe.rewound)
        assert report.snapshot_position == third and probe.rewinds == 0
    finally:
        await node.close()
