"""Two bridges and two reconcilers for one shard, each pair under one etcd lease:
exactly one of each acts at a time; killing the active bridge under load hands
over to the standby without a lost or doubled matcher command."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import pytest

from protos.oms.v1 import status_pb2
from tests.bridge.bridge_process import BridgeProcess, status_or_none
from tests.bridge.mesh import MeshProcesses, mesh_clients
from tests.bridge.mesh_checks import check_invariants, check_orders_agree, wait_quiet
from tests.bridge.order_load import ShardOrderLoad, funding
from tests.reconciler.reconciler_process import ReconcilerProcess
from tests.service_process import ShardFollowerProcess

pytestmark = pytest.mark.slow
USERS = (41, 42, 43, 44)


async def _roles(processes: Sequence[ShardFollowerProcess]) -> list[status_pb2.StatusReport]:
    reports = await asyncio.gather(*(status_or_none(p.address) for p in processes))
    return [report for report in reports if report is not None]


async def _one_active(
    processes: Sequence[ShardFollowerProcess], *, after_term: int = 0, timeout_s: float = 20.0
) -> tuple[ShardFollowerProcess, int]:
    """The one active instance (newer than `after_term`) once the others are standbys."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = await asyncio.gather(*(status_or_none(p.address) for p in processes))
        active = [
            (process, report)
            for process, report in zip(processes, reports, strict=True)
            if report is not None and report.counters["leading"]
        ]
        standbys = [r for r in reports if r is not None and r.info.get("role") == "standby"]
        if len(active) == 1 and active[0][1].counters["term"] > after_term:
            assert len(active) + len(standbys) == len([r for r in reports if r is not None])
            return active[0][0], int(active[0][1].counters["term"])
        assert len(active) <= 1, [r.info for r in reports if r is not None]
        assert time.monotonic() < deadline, [r for r in reports if r is not None]
        await asyncio.sleep(0.05)


async def test_one_bridge_and_one_reconciler_act_and_a_standby_takes_over(
    new_mesh: Callable[..., MeshProcesses], etcd_endpoints: tuple[str, ...]
) -> None:
    leased = {"OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints), "OMS_BRIDGE_LEADER_LEASE": "1"}
    processes = new_mesh(bridge_environment=leased)
    folder = processes.shard.data_dir.parent
    second = BridgeProcess(
        folder / "bridge-2",
        shard_address=processes.shard.address,
        matchers=processes.matcher_addresses,
        environment=leased,
    )
    reconciler_environment = {
        "OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints),
        "OMS_RECONCILER_LEADER_LEASE": "1",
    }
    reconcilers = [
        ReconcilerProcess(
            folder / f"reconciler-{index}",
            shard_address=processes.shard.address,
            matchers=processes.matcher_addresses,
            environment=reconciler_environment,
        )
        for index in (1, 2)
    ]
    processes.extra += [second, *reconcilers]
    await asyncio.to_thread(processes.start)
    bridges = [processes.bridge, second]
    async with mesh_clients(processes) as mesh:
        await mesh.shard.run(*funding(USERS))
        active, term = await _one_active(bridges)
        mesh.bridge_address = active.address
        await mesh.wait_bridge_connected()
        active_reconciler, _ = await _one_active(reconcilers)
        standby = next(r for r in reconcilers if r is not active_reconciler)
        standby_report = await status_or_none(standby.address)
        assert standby_report is not None and standby_report.counters.get("rounds", 0) == 0

        async def standby_took_over() -> None:
            new_active, _ = await _one_active(bridges, after_term=term)
            assert new_active is not active
            mesh.bridge_address = new_active.address

        # The active bridge is SIGKILLed mid-load: its lease expires, the standby takes
        # over from the shard's in-flight sagas; the killed one comes back as a standby.
        load = ShardOrderLoad(processes.shard.address, USERS, seed=7)
        running = asyncio.create_task(load.run())
        try:
            await load.wait_accepted(150)
            active.kill()
            await standby_took_over()
            await load.wait_accepted(len(load.accepted) + 60)
            await asyncio.to_thread(active.start_serving)
            await load.wait_accepted(len(load.accepted) + 150)
        finally:
            load.stop.set()
            await running
        await wait_quiet(mesh)
        assert not load.refused, load.refused[:3]
        await check_orders_agree(mesh, sorted(load.accepted.items()))
        await check_invariants(mesh)
        roles = await _roles(bridges)
        assert sorted(report.info["role"] for report in roles) == ["active", "standby"], roles

        # The reconcilers: the active one stops, the other takes its place.
        active_reconciler.kill()
        replacement, _ = await _one_active(reconcilers)
        assert replacement is standby
