"""The etcd log stays bounded: the leader deletes what every live replica has
snapshotted and compacts etcd's history; a replica that comes back with nothing on
its disk installs a peer's snapshot and follows from it to the leader's hash."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable

import pytest

from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import GroupKeys
from tests.replication.replica_set import ReplicaSet, status_of
from tests.replication.test_shard_failover import _finish, _started_load

pytestmark = pytest.mark.slow
# Snapshots every 100 entries (a few seconds of this load), compaction every second.
FREQUENT = {"OMS_SHARD_SNAPSHOT_ENTRIES": "100", "OMS_ETCD_COMPACT_INTERVAL_S": "1"}


async def _log_keys(replicas: ReplicaSet) -> tuple[int, int]:
    """(record keys stored, first position stored) of the group's log."""
    keys = GroupKeys.of(replicas.mesh_id, "shard", replicas.shard_id)
    async with EtcdSession(replicas.etcd_endpoints) as session:
        stored = await session.range(keys.records, keys.records_end, keys_only=True)
        chunks = await session.range(keys.chunks, prefix_end(keys.chunks), keys_only=True)
    first = keys.position_of(stored[0].key) if stored else 0
    return len(stored) + len(chunks), first


async def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_the_log_stays_bounded_and_a_wiped_follower_installs_a_snapshot(
    replica_set: Callable[..., ReplicaSet],
) -> None:
    replicas = replica_set(3, FREQUENT)
    link, load, running = await _started_load(replicas)
    try:
        leader = await asyncio.to_thread(replicas.wait_leader)
        sizes = []
        for _ in range(4):
            await load.wait_successes(1500)
            sizes.append((await _log_keys(replicas))[0])
        counters = status_of(leader.address).counters
        print(f"log keys after each 1,500 deposits: {sizes}; leader {counters}")
        assert counters["truncated_through"] > 0 and counters["compactions"] > 0, counters
        # Flat: each sample holds about one snapshot interval and a half of records,
        # however long the load has run.
        assert max(sizes) < 400, sizes

        follower = next(replica for replica in replicas.replicas if replica is not leader)
        follower.kill()
        shutil.rmtree(follower.data_dir)
        # Once its registry entry has expired, the log is truncated past what it had.
        await load.wait_successes(300)
        before = (await _log_keys(replicas))[1]
        deadline = time.monotonic() + 60
        while (await _log_keys(replicas))[1] <= max(before, 1):
            assert time.monotonic() < deadline, "the log was never truncated"
            await load.wait_successes(100)
        await asyncio.to_thread(follower.start_serving)
        assert status_of(follower.address).counters["installed_snapshot"] > 0
        await load.wait_successes(300)
    finally:
        await _finish(link, load, running)
    await replicas.check_deposits(load)
