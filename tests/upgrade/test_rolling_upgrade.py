"""A replicated shard rolled to new code one replica at a time under a deposit load,
then switched to the new state-machine version: no divergence, nothing lost.

Three `oms shard` replicas over the session's etcd (`tests/replication/replica_set.py`)
take a deposit load through a `ShardLink` that follows the leader. Each replica in
turn, followers first, is stopped and started again on the next release
(`tests/upgrade/next_release.py`: its shard version refuses a deposit above a cap).
While one replica still runs the old build the switch is refused; once all run the new one,
the old decisions hold until `oms upgrade activate` logs the VERSION entry, and the
new rule applies from there on, on every replica alike. A replica started on the old
build afterwards stops at the entry (exit 3) instead of applying it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import ShardLink
from services.command_line import EXIT_UNSUPPORTED_VERSION, main
from services.coordination.addresses import LeaderAddress
from services.routing import omsctl
from services.runtime.core.replica import describe_versions
from tests.replication.replica_set import LEASE_TTL_S, ReplicaProcess, ReplicaSet, status_of
from tests.shard_service.deposit_load import DepositLoad, start_deposit_load, stop_deposit_load
from tests.shard_service.shard_client import USDT, ShardClient, balance, deposit
from tests.shard_service.shard_process import aio_channel
from tests.upgrade.next_release import DEPOSIT_CAP, SHARD_VERSION, THIS_BUILD_SHARD_VERSIONS

pytestmark = pytest.mark.slow
NEXT_RELEASE = "tests.upgrade.next_release"
USERS = 8
BIG = 2 * DEPOSIT_CAP
SERVE_AGAIN_S = LEASE_TTL_S + 6.0
EXIT_WAIT_S = 60.0
NEW = str(SHARD_VERSION)
THIS_BUILD = describe_versions(THIS_BUILD_SHARD_VERSIONS)


def _ready(versions: frozenset[int]) -> str:
    """What `upgrade status` says a group at version 1 can switch to."""
    newer = sorted(version for version in versions if version > 1)
    return f"can activate {','.join(map(str, newer))}" if newer else "nothing newer"


def _oms(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    code = main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _omsctl(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    code = omsctl.main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


async def _roll(replica: ReplicaProcess, load: DepositLoad) -> float:
    """Stop `replica` gracefully, start it on the next release; the longest the load went
    without an accepted deposit meanwhile (the callers' unavailability, in seconds)."""
    load.longest_gap_s = 0.0
    await asyncio.to_thread(replica.terminate)
    await load.wait_successes(1, timeout_s=SERVE_AGAIN_S)
    replica.entry_module = NEXT_RELEASE
    await asyncio.to_thread(replica.start_serving)
    await load.wait_successes(50)
    return load.longest_gap_s


async def _big_deposit(link: ShardLink, transfer_id: str) -> shard_pb2.ShardResult:
    return await link.execute(deposit(1, BIG, transfer_id=transfer_id), timeout_s=10.0)


async def test_a_shard_rolled_replica_by_replica_switches_version_at_one_position(
    replica_set: Callable[..., ReplicaSet], capsys: pytest.CaptureFixture[str]
) -> None:
    # A mesh of its own: `upgrade status` reports every group of the mesh it is asked.
    # Started at version 1 (as a group made by a release before the newest versions):
    # the roll goes from there.
    replicas = replica_set(
        3, {"OMS_MESH_ID": f"roll-{os.getpid()}", "OMS_SHARD_VERSION_AT_START": "1"}
    )
    where = ("--etcd", ",".join(replicas.etcd_endpoints), "--mesh-id", replicas.mesh_id)
    group = f"shard/{replicas.shard_id}"
    leader_address = LeaderAddress(
        replicas.etcd_endpoints, replicas.mesh_id, "shard", replicas.shard_id
    )
    link = ShardLink(leader_address)
    load, running = await start_deposit_load(link, range(1, USERS + 1))
    unavailable: list[float] = []
    try:
        await load.wait_successes(200)
        code, out = await asyncio.to_thread(_oms, capsys, "upgrade", "status", *where)
        ready = _ready(THIS_BUILD_SHARD_VERSIONS)
        assert code == 0 and f"{group}: version 1 in force; {ready}" in out, out
        leader = await asyncio.to_thread(replicas.wait_leader)
        order = [replica for replica in replicas.replicas if replica is not leader] + [leader]
        unavailable.append(await _roll(order[0], load))
        # One replica on the new build, two on the old (the leader among them): refused.
        code, out = await asyncio.to_thread(_oms, capsys, "upgrade", "activate", group, NEW, *where)
        assert code == 1 and "refused" in out and f"implements versions {THIS_BUILD}," in out, out
        for replica in order[1:]:
            unavailable.append(await _roll(replica, load))
        omsctl = ("--etcd", ",".join(replicas.etcd_endpoints), "--mesh", replicas.mesh_id)
        code, out = await asyncio.to_thread(_omsctl, capsys, *omsctl, "upgrade", "status")
        ready = _ready(THIS_BUILD_SHARD_VERSIONS | {SHARD_VERSION})
        assert code == 0 and f"{group}: version 1 in force; {ready}" in out, out
        # A replica that is down cannot say what it runs: refused when one is missing.
        code, out = await asyncio.to_thread(
            _oms, capsys, "upgrade", "activate", group, NEW, "--replicas", "4", *where
        )
        assert code == 1 and "3 of 4 replicas registered" in out, out
        # Every replica runs the new build, and still decides as version 1 did.
        before = await _big_deposit(link, "big-before")
        assert before.accepted, before
        code, out = await asyncio.to_thread(_oms, capsys, "upgrade", "activate", group, NEW, *where)
        assert code == 0 and f"version {NEW} in force from position" in out, out
        position = int(out.strip().rsplit(" ", 1)[1])
        after = await _big_deposit(link, "big-after")
        assert after.reject_reason == shard_pb2.SHARD_REJECT_REASON_INVALID_AMOUNT, after
        again = await _big_deposit(link, "big-before")  # a retry: answered as decided
        assert again.accepted and again.duplicate, again
        code, out = await asyncio.to_thread(_oms, capsys, "upgrade", "activate", group, NEW, *where)
        assert code == 0 and "already in force" in out, out
        await load.wait_successes(200)
    finally:
        await stop_deposit_load(load, running)
        await leader_address.close()
    print(f"unavailable per replica rolled (s): {[f'{s:.2f}' for s in unavailable]}")
    assert max(unavailable) < SERVE_AGAIN_S
    leader = await asyncio.to_thread(replicas.wait_leader)
    async with aio_channel(leader.address) as channel:
        shard = ShardClient(channel)
        for user_id in load.users:
            expected = load.accepted[user_id] + (BIG if user_id == 1 else 0)
            view = await shard.actor(user_id)
            assert balance(view, USDT).total == expected, user_id
    statuses = await replicas.wait_agreed()
    assert len({status.state_hash for status in statuses}) == 1, statuses
    assert all(status.counters["machine_version"] == SHARD_VERSION for status in statuses), statuses
    assert all(status.applied_position > position for status in statuses)

    # A replica started on the old build stops at the VERSION entry, before applying it.
    follower = next(r for r in replicas.replicas if not status_of(r.address).leading)
    await asyncio.to_thread(follower.terminate)
    follower.entry_module = "services.command_line"
    follower.start()
    process = follower.process
    assert process is not None
    code = await asyncio.to_thread(process.wait, EXIT_WAIT_S)
    tail = follower.log_tail(5)
    assert code == EXIT_UNSUPPORTED_VERSION, tail
    assert f"version {NEW}" in tail and f"implements versions {THIS_BUILD}:" in tail, tail
    # Back on the new build it catches up and agrees.
    follower.entry_module = NEXT_RELEASE
    await asyncio.to_thread(follower.start_serving)
    statuses = await replicas.wait_agreed()
    assert len({status.state_hash for status in statuses}) == 1, statuses
