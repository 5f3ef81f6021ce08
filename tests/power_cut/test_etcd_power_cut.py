"""A power cut under a replicated shard: etcd, which holds its log, on the power-cut disk.

Three shard replicas keep their log in one etcd member whose data folder is on a
`PowerCutDisk` (fsync on, as etcd runs in production), under the deposit load of
`tests/replication/test_shard_failover.py` (callers find the leader in etcd and
retry with the same transfer ids). Twice the power goes: every replica and etcd
SIGKILLed, and every write etcd had not synced lost; then etcd and the replicas
start again on what was synced. A replica acknowledges a command only once its
record is committed in etcd, and etcd commits only what its WAL has synced: so
every acknowledged deposit must be in the balances exactly once afterwards, and the
replicas must end at one position with one state hash.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.infra.embedded_etcd import EmbeddedEtcd
from tests.power_cut.power_cut_disk import PowerCutDisk, unavailable
from tests.replication.replica_set import ReplicaSet
from tests.replication.test_shard_failover import _finish, _started_load

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"power-cut disk: {unavailable()}"),
]
POWER_CUTS = 2
BETWEEN_CUTS = 300  # deposits acknowledged before each cut, and after the last
SERVE_AGAIN_S = 60.0


def power_cut(etcd: EmbeddedEtcd, replicas: ReplicaSet, disk: PowerCutDisk) -> float:
    """Everything at once, then back on what was synced; seconds until a leader serves."""
    for replica in replicas.replicas:
        if replica.running():
            replica.kill()
    etcd.kill()
    disk.cut()
    back = time.monotonic()
    disk.mount()
    etcd.start()
    for replica in replicas.replicas:
        replica.start()
    replicas.wait_leader(SERVE_AGAIN_S)
    return time.monotonic() - back


async def test_a_power_cut_under_the_etcd_log_loses_no_acknowledged_deposit(
    tmp_path: Path,
) -> None:
    with PowerCutDisk(tmp_path / "power") as disk:
        etcd = EmbeddedEtcd(disk.root / "etcd")  # fsync on
        await asyncio.to_thread(etcd.start)
        (tmp_path / "replicas").mkdir()
        replicas = ReplicaSet(tmp_path / "replicas", (etcd.endpoint,), 3)
        try:
            await asyncio.to_thread(replicas.start)
            link, load, running = await _started_load(replicas)
            try:
                for _ in range(POWER_CUTS):
                    await load.wait_successes(BETWEEN_CUTS, timeout_s=SERVE_AGAIN_S)
                    serving_s = await asyncio.to_thread(power_cut, etcd, replicas, disk)
                    print(f"power cut: a leader serving {serving_s:.2f} s after power came back")
                await load.wait_successes(BETWEEN_CUTS, timeout_s=SERVE_AGAIN_S)
            finally:
                await _finish(link, load, running)
            print(f"deposits: {dict(load.answers)}")  # shown with -s
            await replicas.check_deposits(load)
        finally:
            await asyncio.to_thread(replicas.stop)
            etcd.stop()
        assert disk.cuts == POWER_CUTS
        assert list((disk.backing / "etcd").rglob("*.wal")), "etcd's WAL is not on the disk"
