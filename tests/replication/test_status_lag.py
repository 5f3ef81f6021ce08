"""`oms status`'s lag against real replicas: a follower whose etcd link is frozen (its
watch brings nothing more, as behind a dead NAT mapping) keeps answering its status
but stops applying; the table shows it behind its leader, in entries and in the log's
clock, while the leader goes on writing (its timer entries), and flags nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from services.mesh.status_probe import probe_all
from services.mesh.status_rows import ProcessTarget, StatusRow, rows_of
from tests.replication.replica_set import ReplicaSet
from tests.sharding.freezing_proxy import FreezingProxy

LAG_TIMEOUT_S = 30.0


async def test_a_follower_cut_from_etcd_shows_its_lag(
    tmp_path: Path, etcd_endpoints: tuple[str, ...]
) -> None:
    proxy = FreezingProxy(etcd_endpoints[0])
    await proxy.start()
    replicas = ReplicaSet(tmp_path, etcd_endpoints, 3)
    behind = replicas.replicas[2]
    behind.environment["OMS_ETCD_ENDPOINTS"] = proxy.endpoint
    try:
        # Two replicas first, so the one behind the proxy starts as a follower.
        for replica in replicas.replicas[:2]:
            replica.start()
        for replica in replicas.replicas[:2]:
            await asyncio.to_thread(replica.wait_serving)
        await asyncio.to_thread(replicas.wait_leader)
        behind.start()
        await asyncio.to_thread(behind.wait_serving)
        targets = [
            ProcessTarget("shard", replicas.shard_id, index, replica.address)
            for index, replica in enumerate(replicas.replicas)
        ]
        caught_up = await _rows_until(targets, lambda row: row.lag_entries == 0)
        assert caught_up.role == "follower" and caught_up.hash_check in ("ok", ""), caught_up

        assert proxy.freeze() >= 1
        lagging = await _rows_until(
            targets,
            lambda row: (row.lag_entries or 0) >= 2 and (row.lag_ms or 0) >= 1_000,
        )
        assert lagging.role == "follower" and lagging.health == "ok", lagging
        assert lagging.hash_check in ("ok", ""), lagging  # behind, not diverged
    finally:
        await asyncio.to_thread(replicas.stop)
        await proxy.close()


async def _rows_until(
    targets: list[ProcessTarget], wanted: Callable[[StatusRow], bool]
) -> StatusRow:
    """The row of the last target (the replica behind the proxy) once `wanted` holds."""
    deadline = time.monotonic() + LAG_TIMEOUT_S
    while True:
        rows = rows_of(await probe_all(targets, timeout_s=1.0))
        row = rows[-1]
        if row.role and wanted(row):
            return row
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.1)
