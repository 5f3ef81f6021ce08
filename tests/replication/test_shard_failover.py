"""A shard replicated over the etcd log, under a deposit load, through its replicas' faults.

The load reaches the leader through a `ShardLink` that finds it in etcd, so every
failover is also the callers' own: they are refused or time out, re-resolve, and
retry with the same transfer ids. What must hold: every acknowledged deposit is in
the balances exactly once, a new leader serves within seconds, and at the end
every replica is at the same position with the same state hash (followers having
verified the leader's logged hashes all along).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from services.clients.shard_link import ShardLink
from services.coordination.addresses import LeaderAddress
from tests.replication.replica_set import LEASE_TTL_S, ReplicaSet, status_of
from tests.shard_service.deposit_load import DepositLoad, start_deposit_load, stop_deposit_load

pytestmark = pytest.mark.slow
USERS = 16
KILLS = 3
# A lease of 2 s expires, a follower wins and reads the log's end, the callers find it.
SERVE_AGAIN_S = LEASE_TTL_S + 6.0


async def _started_load(
    replicas: ReplicaSet,
) -> tuple[ShardLink, DepositLoad, asyncio.Task[None]]:
    leader = LeaderAddress(replicas.etcd_endpoints, replicas.mesh_id, "shard", replicas.shard_id)
    link = ShardLink(leader)
    load, running = await start_deposit_load(link, range(1, USERS + 1))
    return link, load, running


async def _finish(link: ShardLink, load: DepositLoad, running: asyncio.Task[None]) -> None:
    await stop_deposit_load(load, running)
    await link.source.close()  # the link does not close a source it was given


async def test_killing_the_leader_under_load_loses_nothing_and_the_replicas_agree(
    replica_set: Callable[[int], ReplicaSet],
) -> None:
    replicas = replica_set(3)
    link, load, running = await _started_load(replicas)
    failovers = []
    try:
        for _ in range(KILLS):
            await load.wait_successes(400)
            leader = await asyncio.to_thread(replicas.wait_leader)
            term = status_of(leader.address).term
            leader.kill()
            killed_at = time.monotonic()
            await load.wait_successes(1, timeout_s=SERVE_AGAIN_S)
            failovers.append(load.last_success - killed_at)
            new_leader = await asyncio.to_thread(replicas.wait_leader, other_than=term)
            assert new_leader is not leader
            # Back as a follower: it replays its snapshot and the log, then follows.
            await asyncio.to_thread(leader.start_serving)
        await load.wait_successes(400)
    finally:
        await _finish(link, load, running)
    print(f"failovers {[f'{s:.2f}' for s in failovers]} s, answers {dict(load.answers)}")
    assert max(failovers) < SERVE_AGAIN_S
    await replicas.check_deposits(load)


async def test_a_leader_stopped_past_its_lease_is_fenced_and_leaves(
    replica_set: Callable[[int], ReplicaSet],
) -> None:
    replicas = replica_set(2)
    link, load, running = await _started_load(replicas)
    try:
        await load.wait_successes(300)
        leader = await asyncio.to_thread(replicas.wait_leader)
        term = status_of(leader.address).term
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            await asyncio.to_thread(replicas.wait_leader, other_than=term)
            await load.wait_successes(300, timeout_s=SERVE_AGAIN_S + 30)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        # It finds its lease gone (or its append fenced or timed out) and ends: crash-only.
        deadline = time.monotonic() + 3 * LEASE_TTL_S + 10
        while leader.running():
            assert time.monotonic() < deadline, leader.log_tail()
            await asyncio.sleep(0.05)
        assert leader.process is not None and leader.process.returncode != 0
        # Why it ended: its lease was found gone, its next append was refused, or the
        # append it had in flight when stopped outlived its deadline (the clock ran
        # while it was stopped: whichever timer fires first on SIGCONT decides which).
        tail = leader.log_tail(60)
        reasons = ("leadership.lost", "LogFencedError", "LogUnavailableError")
        assert any(reason in tail for reason in reasons), tail
        await asyncio.to_thread(leader.start_serving)
        await load.wait_successes(300)
    finally:
        await _finish(link, load, running)
    await replicas.check_deposits(load)


async def test_a_restarted_follower_catches_up_to_the_leaders_hash(
    replica_set: Callable[[int], ReplicaSet],
) -> None:
    replicas = replica_set(2)
    link, load, running = await _started_load(replicas)
    try:
        await load.wait_successes(300)
        leader = await asyncio.to_thread(replicas.wait_leader)
        follower = next(replica for replica in replicas.replicas if replica is not leader)
        follower.kill()
        await load.wait_successes(1000)
        await asyncio.to_thread(follower.start_serving)
        await load.wait_successes(300)
    finally:
        await _finish(link, load, running)
    await replicas.check_deposits(load)
