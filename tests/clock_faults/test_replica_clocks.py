"""A replicated shard whose leader's wall clock runs fast, then a failover to a true clock.

A host's wall clock that drifts (a bad oscillator, a broken NTP) moves the one thing
a leader reads from it: the consensus time it stamps on each record, which every
replica then decides by. Here the first leader runs under libfaketime with its wall
clock at twenty times real speed (monotonic clocks untouched, so leases, timeouts
and timer spacing are as real), under a deposit load; once its consensus time is
well ahead of the real time it is killed, and a replica with a true clock leads.
What the README's "Clocks" section promises, shown on a replicated group:

- the drifting leader's followers take its time as it is (they never read a clock)
  and verify its state hashes all along;
- the new leader finds its clock behind the log's time: consensus time holds (never
  goes back), it counts the step (`sequencer.clock_steps_back`), and it serves
  within one failover;
- every acknowledged deposit is there exactly once, and every replica ends at one
  position with one hash (the drifting one too, restarted as a follower).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.clients.shard_link import ShardLink
from services.coordination.addresses import LeaderAddress
from tests.clock_faults.faketime import LIBFAKETIME, needs_libfaketime
from tests.replication.replica_set import LEASE_TTL_S, ReplicaSet, status_of
from tests.shard_service.deposit_load import start_deposit_load, stop_deposit_load

pytestmark = [pytest.mark.slow, needs_libfaketime]
USERS = 8
DRIFT_RATE = 20  # the leader's wall clock: twenty seconds for every real one
AHEAD_MS = 60_000  # how far ahead of real time its consensus time gets before the kill
SERVE_AGAIN_S = LEASE_TTL_S + 6.0
WAIT_S = 30.0


@pytest.fixture
def replicas(tmp_path: Path, etcd_endpoints: tuple[str, ...]) -> Iterator[ReplicaSet]:
    group = ReplicaSet(tmp_path, etcd_endpoints, 3)
    group.replicas[0].environment.update(
        {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME": f"+0 x{DRIFT_RATE}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # the wall clock drifts; monotonic is true
        }
    )
    try:
        yield group
    finally:
        group.stop()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_a_leaders_fast_clock_then_a_failover_holds_consensus_time_and_loses_nothing(
    replicas: ReplicaSet,
) -> None:
    drifting, *others = replicas.replicas
    # The drifting replica first, alone, so it is the one that leads.
    await asyncio.to_thread(drifting.start_serving)
    assert await asyncio.to_thread(replicas.wait_leader) is drifting
    for replica in others:
        await asyncio.to_thread(replica.start_serving)
    first_term = status_of(drifting.address).term

    leader = LeaderAddress(replicas.etcd_endpoints, replicas.mesh_id, "shard", replicas.shard_id)
    link = ShardLink(leader)
    load, running = await start_deposit_load(link, range(1, USERS + 1))
    try:
        await load.wait_successes(200)
        deadline = time.monotonic() + WAIT_S
        while (ahead := status_of(drifting.address)).counters["consensus_time_ms"] < (
            now_ms() + AHEAD_MS
        ):
            assert time.monotonic() < deadline, f"consensus time never ran ahead: {ahead}"
            await asyncio.sleep(0.05)
        # Its followers decide by its time: they are there too, hashes verified.
        for replica in others:
            follower = status_of(replica.address)
            assert follower.checkpoints_verified > 0, follower
        await load.wait_successes(100)

        reached_ms = status_of(drifting.address).counters["consensus_time_ms"]
        drifting.kill()
        killed_at = time.monotonic()
        await load.wait_successes(1, timeout_s=SERVE_AGAIN_S)
        serving_again_s = load.last_success - killed_at
        successor = await asyncio.to_thread(replicas.wait_leader, other_than=first_term)
        assert successor in others
        await load.wait_successes(200)
        numbers = status_of(successor.address).counters
        # Its clock is a minute or more behind the log: time holds, the step is counted.
        assert numbers["consensus_time_ms"] >= reached_ms, (reached_ms, numbers)
        assert numbers["sequencer.clock_steps_back"] >= 1, numbers
        assert numbers["consensus_time_ms"] > now_ms() + AHEAD_MS // 2, numbers

        # The drifting replica back, as a follower (its clock no longer matters).
        await asyncio.to_thread(drifting.start_serving)
        await load.wait_successes(100)
    finally:
        await stop_deposit_load(load, running)
        await link.source.close()
    print(f"served again {serving_again_s:.2f} s after the kill; answers {dict(load.answers)}")
    assert serving_again_s < SERVE_AGAIN_S

    statuses = await replicas.check_deposits(load)
    assert len(statuses) == 3  # the drifting replica too, as a follower
