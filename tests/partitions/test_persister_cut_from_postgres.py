"""A persister cut from PostgreSQL by the kernel, under a trading load: nothing lost.

The persister's packets to PostgreSQL's port are dropped by nftables (`LinkCut`), for
longer than its lock check: its connections stay up and hear nothing, unlike a
crashed server, which refuses. Trading goes on (nothing on the hot path reads the
database) while the write-behind waits. Healed, the persister writes on, or, if it
stopped (crash-only: it cannot know its lock's connection survived), its supervisor
starts it again, as here. Then the mesh's invariants with every acknowledged order,
each acknowledged order exactly once, and the auditor on the flat mesh.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import pytest

from tests.e2e.gateway_load import GatewayOrderLoad, load_accounts, run_load_until
from tests.e2e.test_database_crash import restart_if_stopped
from tests.e2e.test_faults import (
    AFTER_FAULT,
    BEFORE_FAULT,
    LOAD_USERS,
    check_after_fault,
    persister_counters,
)
from tests.full_mesh import FullMesh
from tests.partitions.nft_partition import LinkCut, unavailable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"partitions: {unavailable()}"),
]
CUT_S = 5.0  # past the persister's lock check (every second) several times
WAIT_S = 60.0


async def test_a_persister_cut_from_postgres_loses_and_doubles_nothing(mesh: FullMesh) -> None:
    port = urlsplit(mesh.database_url).port
    assert port is not None
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, LOAD_USERS)
    load = GatewayOrderLoad(mesh.gateway.address, accounts, seed=23)
    with LinkCut([port]) as cut:
        await asyncio.to_thread(cut.restart_inside, mesh.persister)

        async def partition() -> None:
            await load.wait_accepted(BEFORE_FAULT)
            incarnations = mesh.persister.incarnations
            cut.drop()
            cut_at = time.monotonic()
            await load.wait_accepted(len(load.acknowledged) + 20, timeout_s=WAIT_S)
            # What it had committed a moment into the cut: nothing more until healed.
            stalled_at = (await persister_counters(mesh))["committed_position"]
            while time.monotonic() - cut_at < CUT_S:
                await load.wait_accepted(len(load.acknowledged) + 20, timeout_s=WAIT_S)
            still = (await persister_counters(mesh))["committed_position"]
            cut.heal()
            # Its lock check runs every second: a broken lock connection shows within three.
            await asyncio.to_thread(restart_if_stopped, mesh.persister, 3.0)
            await load.wait_accepted(len(load.acknowledged) + AFTER_FAULT, timeout_s=WAIT_S)
            after = (await persister_counters(mesh))["committed_position"]
            print(
                f"persister cut {CUT_S:g} s: committed position {stalled_at} a moment in,"
                f" {still} at the end, {after} after; restarted"
                f" {mesh.persister.incarnations - incarnations} time(s); longest wait for an"
                f" accepted order {load.longest_pause_s(cut_at):.2f} s"
            )  # shown with -s
            assert still <= stalled_at + 1 < after, (stalled_at, still, after)

        await run_load_until(load, partition)
        await check_after_fault(mesh, load)
