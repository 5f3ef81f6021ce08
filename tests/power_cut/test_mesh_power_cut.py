"""A power cut of the whole mesh under a trading load: no acknowledged order is lost.

The shard's and both matchers' data folders (their logs and snapshots) are on one
`PowerCutDisk`. A load trades through the gateway (several users, orders and cancels,
every failed call retried with its client order id). Mid-load the power goes: every
process of the mesh is SIGKILLed at once and every write they had not synced is lost.
The disk comes back with what was synced, the mesh is started again on it, and the
load goes on. Then, from outside, what `tests/e2e/test_faults.py` checks after a
kill: the mesh's invariants with every acknowledged order, each acknowledged order
exactly once in the shard, PostgreSQL and its matcher, and, once every user's kill
switch has cancelled what rests, the independent auditor on the flat mesh.

PostgreSQL and etcd are not on the disk: they are the test's servers, with their
own durability; the shard's and matchers' logs are what this test cuts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.gateway_load import GatewayOrderLoad, load_accounts, run_load_until
from tests.e2e.test_faults import AFTER_FAULT, BEFORE_FAULT, LOAD_USERS, check_after_fault
from tests.full_mesh import FullMesh
from tests.power_cut.power_cut_disk import PowerCutDisk, unavailable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"power-cut disk: {unavailable()}"),
]
POWER_CUTS = 2
SEED = 7


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[PowerCutDisk]:
    with PowerCutDisk(tmp_path / "power") as disk:
        yield disk


@pytest.fixture
def mesh_on_disk(tmp_path: Path, database_url: str, disk: PowerCutDisk) -> Iterator[FullMesh]:
    """A mesh whose shard and matchers keep their logs and snapshots on `disk`."""
    mesh = FullMesh.create(
        tmp_path / "mesh", database_url, shard_environment={"OMS_SHARD_SNAPSHOT_ENTRIES": "200"}
    )
    mesh.shard.data_dir = disk.root / "shard"
    for group, matcher in mesh.matchers.items():
        matcher.data_dir = disk.root / f"matcher-{group}"
    try:
        mesh.start()
        yield mesh
    finally:
        mesh.stop()


def power_cut(mesh: FullMesh, disk: PowerCutDisk) -> None:
    """Every process and the disk at once; then the disk and the mesh come back."""
    for process in mesh.all():
        if process.running():
            process.kill()
    disk.cut()
    disk.mount()
    mesh.start()


async def test_a_power_cut_of_the_whole_mesh_loses_no_acknowledged_order(
    mesh_on_disk: FullMesh, disk: PowerCutDisk
) -> None:
    mesh = mesh_on_disk
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, LOAD_USERS)
    load = GatewayOrderLoad(mesh.gateway.address, accounts, seed=SEED)

    async def cuts() -> None:
        await load.wait_accepted(BEFORE_FAULT)
        for _ in range(POWER_CUTS):
            cut_at = time.monotonic()
            await asyncio.to_thread(power_cut, mesh, disk)
            serving_s = time.monotonic() - cut_at
            await load.wait_accepted(len(load.acknowledged) + AFTER_FAULT, timeout_s=60.0)
            print(
                f"power cut: every process serving again {serving_s:.2f} s after it, longest"
                f" wait for an accepted order {load.longest_pause_s(cut_at):.2f} s"
            )  # shown with -s

    await run_load_until(load, cuts)
    assert disk.cuts == POWER_CUTS
    assert mesh.shard.incarnations == POWER_CUTS + 1
    # The logs and snapshots really are on the disk that lost power.
    for folder in ("shard", "matcher-g1", "matcher-g2"):
        assert list((disk.backing / folder).rglob("segment-*.log")), folder
    assert list((disk.backing / "shard").rglob("*snapshot*")), "no shard snapshot"
    await check_after_fault(mesh, load)
