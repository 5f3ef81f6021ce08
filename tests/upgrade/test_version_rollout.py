"""The OmsCluster operator's `spec.stateMachineVersion` (`k8s/operator/version_rollout.py`)
against three real shard replicas over the session's etcd: it waits while a replica's
build lacks the version, switches the group once every replica has it, and never logs
the switch twice nor lowers a version."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from k8s.operator.version_rollout import VersionNotReadyError, VersionRollout
from services.coordination.etcd_session import EtcdSession
from tests.replication.replica_set import ReplicaProcess, ReplicaSet
from tests.upgrade.next_release import SHARD_VERSION, THIS_BUILD_SHARD_VERSIONS
from tests.upgrade.test_rolling_upgrade import NEXT_RELEASE

pytestmark = pytest.mark.slow


async def _on_next_release(replica: ReplicaProcess) -> None:
    await asyncio.to_thread(replica.terminate)
    replica.entry_module = NEXT_RELEASE
    await asyncio.to_thread(replica.start_serving)


async def test_the_operator_switches_a_group_once_every_replica_runs_the_version(
    replica_set: Callable[..., ReplicaSet], etcd_endpoints: tuple[str, ...]
) -> None:
    mesh_id = f"rollout-{os.getpid()}"  # this group alone: nothing else to switch
    replicas = replica_set(3, {"OMS_MESH_ID": mesh_id})
    group = f"shard/{replicas.shard_id}"
    first, second, third = replicas.replicas
    for replica in (first, second):
        await _on_next_release(replica)
    async with EtcdSession(etcd_endpoints) as session:
        rollout = VersionRollout(session, mesh_id)
        with pytest.raises(VersionNotReadyError) as waiting:
            await rollout.ensure(SHARD_VERSION)
        this_build = ",".join(map(str, sorted(THIS_BUILD_SHARD_VERSIONS)))
        assert f"{third.address} implements {this_build}" in str(waiting.value), waiting.value
        statuses = await replicas.wait_agreed()
        # A new group starts at the newest version its build implements.
        newest = max(THIS_BUILD_SHARD_VERSIONS)
        assert all(status.counters["machine_version"] == newest for status in statuses)

        await _on_next_release(third)
        assert await rollout.ensure(SHARD_VERSION) == {group: SHARD_VERSION}
        statuses = await replicas.wait_agreed()
        assert all(status.counters["machine_version"] == SHARD_VERSION for status in statuses)
        assert len({status.state_hash for status in statuses}) == 1, statuses
        # Reconciled again (the operator restarted, the spec re-applied): nothing logged.
        assert await rollout.ensure(SHARD_VERSION) == {group: SHARD_VERSION}
        assert await rollout.ensure(1) == {group: SHARD_VERSION}  # never lowered
        statuses = await replicas.wait_agreed()
        assert all(status.counters["versions_repeated"] == 0 for status in statuses)
