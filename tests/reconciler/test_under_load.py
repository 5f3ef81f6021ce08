"""The reconciler never heals what is only in transit: under a trading load it closes nothing.

With a report every few milliseconds of some users' state, a reconciler that
reported disagreements caused by orders and events in flight would have the
shard close live orders (a report is judged against the shard's index when it
is applied). Only disagreements that stay still between two looks are reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.bridge.bridge_process import service_status
from tests.bridge.mesh import mesh_clients
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.bridge.order_load import ShardOrderLoad, funding
from tests.reconciler.conftest import ReconciledMesh

pytestmark = pytest.mark.slow
USERS = (71, 72, 73, 74)
ORDERS = 1_500


async def test_a_trading_load_is_never_mistaken_for_drift(
    new_reconciled_mesh: Callable[..., ReconciledMesh],
) -> None:
    made = new_reconciled_mesh(reconciler_environment={"OMS_RECONCILER_INTERVAL_MS": "50"})
    await asyncio.to_thread(made.processes.start)
    async with mesh_clients(made.processes) as mesh:
        await mesh.wait_bridge_connected()
        await mesh.shard.run(*funding(USERS))
        load = ShardOrderLoad(made.processes.shard.address, USERS, seed=7, workers=12, pause_s=0)
        running = asyncio.create_task(load.run())
        try:
            await load.wait_accepted(ORDERS, timeout_s=60)
        finally:
            load.stop.set()
            await running
        await wait_quiet(mesh)
        report = await service_status(made.reconciler.address)
        assert report.counters["rounds"] >= 10, report
        assert report.counters["users_drifting"] >= 1, "it saw orders in transit"
        counters = (await mesh.shard.status()).counters
        for healed in (
            "reconcile_phantoms_closed",
            "reconcile_impossible_states",
            "reconcile_reservations_released",
            "orphan_fills_settled",
        ):
            assert counters[healed] == 0, (healed, dict(counters), dict(report.counters))
        await check_invariants(mesh)
