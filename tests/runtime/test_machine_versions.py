"""State-machine versions in the log: a VERSION entry switches every replica at one
position; a build that does not implement the log's version stops before applying it.

The reference `CounterMachine` decides differently at version 2 (an increment adds
twice its delta), and implements version 2 only when built to.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.log_batch import (
    LogBatch,
    RecordCorruptedError,
    decode_batch_at,
    decode_version,
    encode_batch,
    encode_version,
)
from services.runtime.core.replica import Replica, UnsupportedVersionError
from services.runtime.core.state_machine import EntryKind
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle

COMMAND = int(EntryKind.COMMAND)
VERSION = int(EntryKind.VERSION)
BOTH = frozenset({1, 2})


def _increment(key: int, delta: int) -> tuple[int, bytes]:
    return COMMAND, encode_increment(key, delta)


def _log() -> list[LogBatch]:
    """Three records: increments, the switch to version 2 between two increments, more."""
    return [
        LogBatch(1, 1_000, [_increment(1, 5), _increment(2, 1)]),
        LogBatch(3, 1_001, [_increment(1, 5), (VERSION, encode_version(2)), _increment(1, 5)]),
        LogBatch(6, 1_002, [_increment(1, 5)]),
    ]


def test_a_version_entry_survives_the_record_format() -> None:
    batch = _log()[1]
    decoded, _ = decode_batch_at(encode_batch(batch))
    assert decoded == batch
    assert decode_version(encode_version(7)) == 7
    with pytest.raises(RecordCorruptedError):
        decode_version(b"\x01\x00")
    with pytest.raises(ValueError, match="positive"):
        encode_version(0)


def test_the_decision_changes_exactly_at_the_version_entry_on_every_replica() -> None:
    replicas = [Replica(CounterMachine(BOTH), 2) for _ in range(2)]
    outputs = [[replica.apply_batch(batch) for batch in _log()] for replica in replicas]
    assert outputs[0] == outputs[1]
    # Position 3 adds 5 (version 1), position 4 switches, position 5 adds 10, then 6.
    assert [list(out) for out in outputs[0][1]] == [[(1, 10)], [], [(1, 20)]]
    assert [list(out) for out in outputs[0][2]] == [[(1, 30)]]
    first, second = (replica.machine for replica in replicas)
    assert first.version == second.version == 2
    assert first.state_hash() == second.state_hash()
    # The version is state: a replica restored from the snapshot decides at version 2.
    restored = Replica(CounterMachine(BOTH), 2)
    restored.restore(first.snapshot(), 6, 1_002)
    assert restored.machine.version == 2
    assert restored.machine.state_hash() == first.state_hash()


def test_the_same_commands_at_version_1_hash_differently_from_version_2() -> None:
    machine_1, machine_2 = CounterMachine(BOTH), CounterMachine(BOTH)
    Replica(machine_1, 2).apply_batch(LogBatch(1, 1_000, [_increment(1, 5)]))
    Replica(machine_2, 2).apply_batch(LogBatch(1, 1_000, [(VERSION, encode_version(2))]))
    machine_2.counters = dict(machine_1.counters)  # the same counters, other rules
    assert machine_1.state_hash() != machine_2.state_hash()


def test_a_build_without_the_logs_version_stops_before_applying_it() -> None:
    machine = CounterMachine()  # implements version 1 only
    old = Replica(machine, 2)
    old.apply_batch(_log()[0])
    with pytest.raises(UnsupportedVersionError) as raised:
        old.apply_batch(_log()[1])
    message = str(raised.value)
    assert "version 2 at position 4" in message and "implements versions 1" in message
    # The entry before the switch was applied under version 1; nothing at or after it.
    assert machine.counters == {1: 10, 2: 1} and machine.version == 1


def test_a_build_without_the_snapshots_version_refuses_to_restore_it() -> None:
    new = Replica(CounterMachine(BOTH), 2)
    for batch in _log():
        new.apply_batch(batch)
    old = Replica(CounterMachine(), 2)
    with pytest.raises(UnsupportedVersionError, match="snapshot at position 6 is at state-mac"):
        old.restore(new.machine.snapshot(), 6, 1_002)


def test_an_activation_logged_twice_changes_nothing_the_second_time() -> None:
    replica = Replica(CounterMachine(BOTH), 2)
    for batch in _log():
        replica.apply_batch(batch)
    before = replica.machine.state_hash()
    replica.apply_batch(LogBatch(7, 1_003, [(VERSION, encode_version(2))]))
    replica.apply_batch(LogBatch(8, 1_003, [(VERSION, encode_version(1))]))
    assert replica.machine.version == 2 and replica.versions_repeated == 2
    assert replica.machine.state_hash() == before


def _node(data_dir: Path, implemented: frozenset[int]) -> RuntimeNode[tuple[int, int | None]]:
    settings = NodeSettings(
        data_dir=data_dir,
        checkpoint_interval_entries=2,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=0),
    )
    log_store = FileLogStore(data_dir / "log", segment_bytes=64 * 1024)
    return RuntimeNode(
        CounterMachine(implemented), settings, log_store=log_store, clock_ms=lambda: 5_000
    )


async def test_a_leader_logs_the_switch_and_a_replay_of_its_log_decides_alike(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path, BOTH)
    await node.recover()
    task = asyncio.create_task(node.run())
    try:
        sequencer = node.sequencer
        await settle(sequencer.submit_many([encode_increment(1, 5)]), task)
        with pytest.raises(ValueError, match="does not implement"):
            await sequencer.propose_version(3)
        position = await settle(asyncio.ensure_future(sequencer.propose_version(2)), task)
        receipt = await settle(sequencer.submit_many([encode_increment(1, 5)]), task)
        assert position == 2 and receipt.first_position == 3
        assert [list(out) for out in receipt.outputs] == [[(1, 15)]]
        digest = node.replica.machine.state_hash()
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()
    task.result()
    replay = _node(tmp_path, BOTH)
    await replay.recover()
    assert replay.replica.machine.version == 2
    assert replay.replica.machine.state_hash() == digest
    await replay.close()
    # A build that implements version 1 only stops in its recovery, at the entry.
    old = _node(tmp_path, frozenset({1}))
    with pytest.raises(UnsupportedVersionError, match="at position 2"):
        await old.recover()
    await old.close()
