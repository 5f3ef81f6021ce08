"""The bridge cut by the kernel from the shard, then from matcher `g1`, under a load.

Its packets to the shard's port, or to `g1`'s, are dropped by nftables (`LinkCut`) for
a few seconds while the clients trade: the shard still takes orders (they wait as
sagas), the bridge's streams hear nothing, nothing fails fast. Healed, the bridge
carries on (or, stopped, is started again as its supervisor would), and every order
goes through exactly once: the mesh's invariants (no saga left, matcher and shard
agreeing), each acknowledged order once in the shard, PostgreSQL and its matcher,
and the auditor on the flat mesh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.bridge.bridge_process import service_status
from tests.e2e.gateway_load import GatewayOrderLoad, load_accounts, run_load_until
from tests.e2e.test_database_crash import restart_if_stopped
from tests.e2e.test_faults import AFTER_FAULT, BEFORE_FAULT, LOAD_USERS, check_after_fault
from tests.full_mesh import FullMesh
from tests.partitions.nft_partition import LinkCut, unavailable
from tests.service_process import aio_channel
from tests.shard_service.shard_client import ShardClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"partitions: {unavailable()}"),
]
CUT_S = 4.0
WAIT_S = 60.0


async def sagas_in_flight(mesh: FullMesh) -> int:
    async with aio_channel(mesh.shard.address) as channel:
        return int((await ShardClient(channel).status()).in_flight_sagas)


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.mark.parametrize(
    "target",
    [pytest.param(lambda m: m.shard.address, id="shard"),
     pytest.param(lambda m: m.matchers["g1"].address, id="matcher-g1")],
)  # fmt: skip
async def test_a_bridge_cut_from_its_peer_loses_and_doubles_nothing(
    mesh: FullMesh, target: Callable[[FullMesh], str]
) -> None:
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, LOAD_USERS)
    load = GatewayOrderLoad(mesh.gateway.address, accounts, seed=29)
    with LinkCut([port_of(target(mesh))]) as cut:
        await asyncio.to_thread(cut.restart_inside, mesh.bridge)

        async def partition() -> None:
            await load.wait_accepted(BEFORE_FAULT)
            incarnations = mesh.bridge.incarnations
            cut.drop()
            cut_at = time.monotonic()
            while time.monotonic() - cut_at < CUT_S:
                await load.wait_accepted(len(load.acknowledged) + 20, timeout_s=WAIT_S)
            # The cut bit: orders the shard took wait as sagas, the bridge unable to move them.
            waiting = await sagas_in_flight(mesh)
            assert waiting >= 20, waiting
            cut.heal()
            await asyncio.to_thread(restart_if_stopped, mesh.bridge, 3.0)
            await load.wait_accepted(len(load.acknowledged) + AFTER_FAULT, timeout_s=WAIT_S)
            counters = (await service_status(mesh.bridge.address)).counters
            print(
                f"bridge cut {CUT_S:g} s: restarted {mesh.bridge.incarnations - incarnations}"
                f" time(s), longest wait for an accepted order"
                f" {load.longest_pause_s(cut_at):.2f} s, {waiting} sagas waiting at the end of"
                f" the cut, reconnects {counters['reconnects']}"
            )  # shown with -s

        await run_load_until(load, partition)
        await check_after_fault(mesh, load)
