"""Faults under a running load: SIGKILL of the bridge, of a matcher and of the shard.

After each: the shard's in-flight sagas drain to 0, every order the shard
accepted is known to its matcher exactly once and ends in the same state on
both sides, and the mesh invariants hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.bridge.mesh import SHARD_ID, MeshClients, MeshProcesses, mesh_clients
from tests.bridge.mesh_checks import check_invariants, check_orders_agree, wait_quiet
from tests.bridge.order_load import ShardOrderLoad, funding
from tests.service_process import ServiceProcess
from tests.shard_service.shard_client import eventually

pytestmark = pytest.mark.slow
USERS = (31, 32, 33, 34)
BEFORE_FAULT = 150
DURING_FAULT = 60
AFTER_FAULT = 150


@pytest.fixture
async def running(
    new_mesh: Callable[..., MeshProcesses],
) -> AsyncIterator[tuple[MeshProcesses, MeshClients]]:
    processes = new_mesh()
    await asyncio.to_thread(processes.start)
    async with mesh_clients(processes) as mesh:
        await mesh.wait_bridge_connected()
        await mesh.shard.run(*funding(USERS))
        yield processes, mesh


async def _run_with_fault(
    mesh: MeshClients,
    process: ServiceProcess,
    address: str,
    seed: int,
    while_down: Callable[[], Awaitable[None]] | None = None,
) -> ShardOrderLoad:
    """Kill `process` mid-load, keep the load going while it is gone, restart it."""
    load = ShardOrderLoad(address, USERS, seed=seed)
    running = asyncio.create_task(load.run())
    try:
        await load.wait_accepted(BEFORE_FAULT)
        process.kill()
        if process.subcommand == "shard":
            await load.wait_retries(DURING_FAULT)  # nothing is accepted while it is gone
        else:
            await load.wait_accepted(len(load.accepted) + DURING_FAULT)
        if while_down is not None:
            await while_down()
        await asyncio.to_thread(process.start_serving)
        await load.wait_accepted(len(load.accepted) + AFTER_FAULT)
    finally:
        load.stop.set()
        await running
    await wait_quiet(mesh)
    assert not load.refused, load.refused[:3]
    await check_orders_agree(mesh, sorted(load.accepted.items()))
    await check_invariants(mesh)
    return load


async def test_bridge_kill_9_redrives_and_loses_or_doubles_nothing(
    running: tuple[MeshProcesses, MeshClients],
) -> None:
    processes, mesh = running
    await _run_with_fault(mesh, processes.bridge, processes.shard.address, seed=1)
    status = await mesh.bridge_status()
    # Orders accepted while the bridge was down were in flight when it came back.
    assert status.counters["redriven"] >= DURING_FAULT, status
    assert status.counters["submits_forwarded"] >= status.counters["redriven"], status


async def test_matcher_kill_9_resumes_from_sequence(
    running: tuple[MeshProcesses, MeshClients],
) -> None:
    processes, mesh = running
    g2 = mesh.matchers["g2"]

    async def g2_keeps_trading() -> None:
        # g1 is down: only its lane waits; SOL-USDT orders still reach g2 and come back.
        assert not processes.matchers["g1"].running()
        before = await g2.last_sequence(SHARD_ID)
        await eventually(lambda: g2.last_sequence(SHARD_ID), lambda last: last > before + 10)
        assert not processes.matchers["g1"].running()

    await _run_with_fault(
        mesh, processes.matchers["g1"], processes.shard.address, 2, g2_keeps_trading
    )
    status = await mesh.bridge_status()
    assert status.counters["reconnects"] >= 1, status
    assert status.counters["redriven"] >= 1, status
    assert status.counters["sequence_out_of_range"] == 0, status


async def test_shard_kill_9_restarts_the_session_from_in_flight(
    running: tuple[MeshProcesses, MeshClients],
) -> None:
    processes, mesh = running
    load = await _run_with_fault(mesh, processes.shard, processes.shard.address, seed=3)
    assert load.retries >= 1, "the load saw the shard go away"
    status = await mesh.bridge_status()
    assert status.counters["reconnects"] >= 1, status
