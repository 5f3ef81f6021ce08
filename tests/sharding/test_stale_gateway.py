"""A gateway held on a stale epoch is corrected by the shards' NOT_OWNER, losing nothing.

A second gateway reaches etcd through a proxy whose connections are then frozen: its
watch stays open but brings nothing more, so it keeps routing with the epoch it had.
A trading load runs through that gateway alone while `omsctl tier USER whale
--cluster s2` pins one user to the other cluster (two epochs: in transit, landed).
The user's next orders reach its old shard, which refuses them with NOT_OWNER and its
newer epoch; the gateway reads etcd anew (a new connection, not frozen), routes again
with the same ids, and the orders land on the new shard. Nothing the clients were
told is lost or doubled: every acknowledged order is in its user's history once, and
money is conserved over both shards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from protos.oms.v1 import common_pb2
from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_changes import first_document
from services.routing.routing_store import RoutingStore
from services.routing.wave_controller import WaveController
from tests.e2e.gateway_load import FUNDS, run_load_until
from tests.e2e.invariants import check_mesh_invariants
from tests.full_mesh import gateway_counters
from tests.gateway.accounts import buy, eventually, open_account
from tests.gateway.gateway_process import GatewayProcess
from tests.sharded_mesh import ShardedMesh
from tests.sharding.freezing_proxy import FreezingProxy
from tests.sharding.omsctl_process import run_to_the_end, start_omsctl
from tests.sharding.scaling_audit import audit_histories, current_document, open_traders

MAKERS = 2
TAKERS = 12
ORDERS = 200
MOVED_ORDERS = 20  # the moved user's orders accepted on its new shard
IOC = common_pb2.TIME_IN_FORCE_IOC  # never rests: the user stays flat, free to move


@contextlib.asynccontextmanager
async def stale_gateway(mesh: ShardedMesh) -> AsyncIterator[tuple[GatewayProcess, FreezingProxy]]:
    """A second gateway whose etcd connections go through a proxy the test can freeze."""
    proxy = FreezingProxy(mesh.etcd_endpoints[0])
    await proxy.start()
    try:
        stale = mesh.new_gateway("gateway-stale", {"OMS_ETCD_ENDPOINTS": proxy.endpoint})
        await asyncio.to_thread(mesh.start, stale)
        yield stale, proxy
    finally:
        await proxy.close()


async def test_a_gateway_on_a_stale_epoch_is_corrected_by_not_owner_and_loses_nothing(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    mesh = await new_sharded_mesh(first_document(["s1", "s2"]))
    async with stale_gateway(mesh) as (stale, proxy):
        async with EtcdSession(mesh.etcd_endpoints) as session:
            store = RoutingStore(session, mesh.mesh_id)
            controller = WaveController(store, mesh.probe())
            traders = await open_traders(mesh, controller, makers=MAKERS, takers=TAKERS)
            before = await current_document(store)
            await eventually(
                lambda: gateway_counters(stale.address),
                lambda counters: counters["routing_epoch"] == before.epoch,
            )
            moved = next(u for u in traders.taker_ids if before.owner_of(u) == "s1")
            load = traders.load(stale.address)

            def on_s2(ack_order_id: str) -> bool:
                return ack_order_id.startswith("s2:")

            async def moved_orders_on_s2() -> int:
                return sum(
                    1
                    for client_order_id, ack in load.acks.items()
                    if ack.accepted
                    and load.users_of[client_order_id] == moved
                    and on_s2(ack.order_id)
                )

            async def steps() -> None:
                await load.wait_accepted(ORDERS)
                assert proxy.freeze() >= 1  # the stale gateway's watch, at least
                tier = await start_omsctl(mesh, "tier", str(moved), "whale", "--cluster", "s2")
                await run_to_the_end(tier)
                await eventually(
                    moved_orders_on_s2, lambda count: count >= MOVED_ORDERS, timeout_s=60
                )
                await load.wait_accepted(len(load.accepted) + ORDERS)

            await run_load_until(load, steps)
            after = await current_document(store)
            await controller.shards.close()
        counters = await gateway_counters(stale.address)

    assert after.epoch == before.epoch + 2 and after.owner_of(moved) == "s2"
    assert all(after.owner_of(u) == before.owner_of(u) for u in traders.taker_ids if u != moved)
    # Corrected by the shards, not by its watch: NOT_OWNER, then a read of etcd of its own.
    assert counters["shard_not_owner"] >= 1, counters
    assert counters["routing_reads"] >= 1, counters
    assert counters["routing_epoch"] == after.epoch, counters
    assert counters.get("routing_watch_breaks", 0) == 0, counters
    await check_mesh_invariants(mesh.addresses(), mesh.database_url, load.accepted)
    await audit_histories(mesh, load, [*traders.makers, *traders.takers])
    print(
        f"stale gateway: {len(load.accepted)} orders accepted, retries {dict(load.retries)}, "
        f"not-owner answers {counters['shard_not_owner']}, etcd reads {counters['routing_reads']}"
    )


async def test_a_trade_stream_order_meeting_not_owner_is_routed_again_on_its_stream(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    """On the Trade stream an order goes straight into its shard's link
    (gateway/direct_orders.py); a NOT_OWNER answer hands it to the routed path, which
    reads etcd and sends it again to the new owner, the client seeing one answer."""
    mesh = await new_sharded_mesh(first_document(["s1", "s2"]))
    async with stale_gateway(mesh) as (stale, proxy), EtcdSession(mesh.etcd_endpoints) as session:
        store = RoutingStore(session, mesh.mesh_id)
        before = await current_document(store)
        async with mesh.admin() as admin:
            accounts = [await open_account(admin, FUNDS) for _ in range(6)]
        account = next(a for a in accounts if before.owner_of(a.user_id) == "s1")
        await eventually(
            lambda: gateway_counters(stale.address),
            lambda counters: counters["routing_epoch"] == before.epoch,
        )
        async with account.client(stale.address) as client, client.trade() as stream:
            [first] = await stream.submit([buy(client, "before-move", 1, time_in_force=IOC)])
            assert first.place.accepted and first.place.order_id.startswith("s1:"), first
            assert proxy.freeze() >= 1
            tier = await start_omsctl(
                mesh, "tier", str(account.user_id), "whale", "--cluster", "s2"
            )
            lines = await run_to_the_end(tier)
            assert (await current_document(store)).owner_of(account.user_id) == "s2", lines
            [moved] = await stream.submit([buy(client, "after-move", 1, time_in_force=IOC)])
            assert stream.answers[moved.request_id] == 1
        assert moved.place.accepted and moved.place.order_id.startswith("s2:"), moved
        counters = await gateway_counters(stale.address)
    assert counters["shard_not_owner"] >= 1, counters
    assert counters["routing_epoch"] == before.epoch + 2, counters
