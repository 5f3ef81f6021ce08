"""The etcd log backend against a real etcd: fenced appends, split records, truncation,
and a runtime node that recovers from it.

Each test writes under a prefix of its own on the session's etcd.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import GroupKeys
from services.runtime.core.counter_machine import COMMAND, CounterMachine, encode_increment
from services.runtime.core.log_batch import LogBatch, encode_batch
from services.runtime.core.replica import DivergenceError, Replica
from services.runtime.core.state_machine import ApplyContext, EntryKind
from services.runtime.errors import LogFencedError
from services.runtime.etcd_log import EtcdLogStore, read_records
from services.runtime.log_follower import LogFollower
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle

_prefixes = itertools.count(1)


@pytest.fixture
async def session(etcd_endpoints: tuple[str, ...]) -> AsyncIterator[EtcdSession]:
    async with EtcdSession(etcd_endpoints) as opened:
        yield opened


@pytest.fixture
def keys() -> GroupKeys:
    return GroupKeys.of("test", "etcd-log", str(next(_prefixes)))


async def lead(session: EtcdSession, keys: GroupKeys) -> int:
    """Take the leader key (no lease: these tests end terms by hand); the term."""
    created, entry = await session.create(keys.leader, b"test", lease=0)
    assert created and entry is not None
    return entry.create_revision


def batch_at(position: int, *payloads: bytes, time_ms: int = 1_000) -> LogBatch:
    return LogBatch(position, time_ms, [(int(EntryKind.COMMAND), p) for p in payloads])


async def append(store: EtcdLogStore, batch: LogBatch) -> None:
    await store.append(batch, encode_batch(batch))


async def test_appended_records_read_back_in_order_and_big_ones_come_back_whole(
    session: EtcdSession, keys: GroupKeys
) -> None:
    term = await lead(session, keys)
    store = EtcdLogStore(session, keys, term, chunk_bytes=4_096)
    tail = await store.open()
    assert (tail.first_position, tail.last_position) == (1, 0)
    big = batch_at(3, *(bytes([n]) * 1_000 for n in range(20)))  # about 20 KiB: 5 chunks
    batches = [batch_at(1, b"a", b"b"), big, batch_at(23, b"c", time_ms=2_000)]
    for batch in batches:
        await append(store, batch)
    assert [b async for b in store.read_from(1)] == batches
    assert [b async for b in store.read_from(10)] == batches[1:]  # inside the big record
    assert [b async for b in store.read_from(23)] == batches[2:]
    assert [b async for b in store.read_from(24)] == []

    reopened = await EtcdLogStore(session, keys, term).open()
    assert (reopened.first_position, reopened.last_position) == (1, 23)
    assert reopened.consensus_time_ms == 2_000

    await store.truncate_before(23)
    assert [b async for b in read_records(session, keys, 1)] == batches[2:]
    assert await session.range(keys.chunks, prefix_end(keys.chunks)) == []
    assert (await EtcdLogStore(session, keys, term).open()).first_position == 23


async def test_a_deposed_leader_cannot_append_and_a_retry_never_writes_twice(
    session: EtcdSession, keys: GroupKeys
) -> None:
    term = await lead(session, keys)
    store = EtcdLogStore(session, keys, term)
    await store.open()
    first = batch_at(1, b"x")
    await append(store, first)
    # The same record again (an answer lost, retried): recognised, not written twice.
    await append(store, first)
    with pytest.raises(LogFencedError):
        await append(store, batch_at(1, b"not the same"))

    # A new term: the leader key is deleted and taken again.
    await session.delete(keys.leader)
    new_term = await lead(session, keys)
    assert new_term > term
    with pytest.raises(LogFencedError):
        await append(store, batch_at(2, b"late"))
    successor = EtcdLogStore(session, keys, new_term)
    assert (await successor.open()).last_position == 1
    await append(successor, batch_at(2, b"y"))
    assert [b.first_position async for b in read_records(session, keys, 1)] == [1, 2]


async def test_chunks_of_a_record_without_its_manifest_are_removed_on_open(
    session: EtcdSession, keys: GroupKeys
) -> None:
    term = await lead(session, keys)
    store = EtcdLogStore(session, keys, term, chunk_bytes=1_024)
    await store.open()
    await append(store, batch_at(1, b"kept"))
    # A leader that died between a big record's chunks and its manifest.
    await session.put(keys.chunk(2, 0), b"half")
    await session.put(keys.chunk(2, 1), b"of it")
    tail = await EtcdLogStore(session, keys, term).open()
    assert tail.last_position == 1
    assert await session.range(keys.chunk_prefix(2), prefix_end(keys.chunk_prefix(2))) == []


async def test_a_runtime_node_on_the_etcd_log_recovers_what_it_acknowledged(
    session: EtcdSession, keys: GroupKeys, tmp_path: Path
) -> None:
    term = await lead(session, keys)
    settings = NodeSettings(
        data_dir=tmp_path,
        checkpoint_interval_entries=10,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=0),
    )

    def node() -> RuntimeNode[tuple[int, int | None]]:
        return RuntimeNode(
            CounterMachine(), settings, log_store=EtcdLogStore(session, keys, term, chunk_bytes=512)
        )

    first = node()
    await first.recover()
    task = asyncio.create_task(first.run())
    try:
        for n in range(40):
            await settle(
                first.sequencer.submit_many([encode_increment(n % 4, 1)] * (1 + n % 7)), task
            )
    finally:
        first.stop()
        await asyncio.wait({task}, timeout=10)
    task.result()
    # Stopping appends the last checkpoint: everything the node applied was durable.
    acknowledged_hash = first.replica.machine.state_hash()
    acknowledged_position = first.replica.applied_position
    second = node()
    report = await second.recover()
    assert report.applied_position == acknowledged_position
    assert second.replica.machine.state_hash() == acknowledged_hash


class SkewedCounterMachine(CounterMachine):
    """A determinism bug on purpose: key 3 counts double here (on one replica only)."""

    def apply(self, command: bytes, context: ApplyContext) -> Sequence[tuple[int, int | None]]:
        key, delta = COMMAND.unpack(command)
        return super().apply(encode_increment(key, delta * 2 if key == 3 else delta), context)


async def test_a_follower_that_computes_another_state_stops_with_the_position_and_both_hashes(
    session: EtcdSession, keys: GroupKeys, tmp_path: Path
) -> None:
    term = await lead(session, keys)
    settings = NodeSettings(
        data_dir=tmp_path / "leader",
        checkpoint_interval_entries=10,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=0),
    )
    leader: RuntimeNode[tuple[int, int | None]] = RuntimeNode(
        CounterMachine(), settings, log_store=EtcdLogStore(session, keys, term)
    )
    await leader.recover()
    honest = Replica(CounterMachine(), checkpoint_interval_entries=10)
    skewed = Replica(SkewedCounterMachine(), checkpoint_interval_entries=10)
    followers = [LogFollower(session, keys, replica) for replica in (honest, skewed)]
    following = [asyncio.create_task(follower.run()) for follower in followers]
    task = asyncio.create_task(leader.run())
    try:
        for n in range(30):  # keys 0..2 only: every replica agrees so far
            await settle(leader.sequencer.submit_many([encode_increment(n % 3, 1)] * 3), task)
        for n in range(30):
            await settle(leader.sequencer.submit_many([encode_increment(n % 4, 1)] * 3), task)
        done, _ = await asyncio.wait({following[1]}, timeout=10)
        assert done, "the skewed follower never noticed"
        with pytest.raises(DivergenceError) as raised:
            following[1].result()
        text = str(raised.value)
        assert "on the leader" in text and "state hash at position" in text
        # The honest follower keeps up, verifying the same checkpoints.
        deadline = asyncio.get_running_loop().time() + 10
        while honest.applied_position < leader.replica.applied_position:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert honest.checkpoints_verified > 0
        assert honest.machine.state_hash() == leader.replica.machine.state_hash()
    finally:
        for running in following:
            running.cancel()
        leader.stop()
        await asyncio.wait({task, *following}, timeout=10)
