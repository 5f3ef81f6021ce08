"""Scaling under a steady order load: two clusters to three and back, and a tier change.

Real processes (three clusters' shards, persisters, bridges and reconcilers, two
matcher groups, a gateway routing by the document in etcd, PostgreSQL), driven by the
wave controller as `omsctl activate / remove / tier` drives it. While the load runs,
a monitor samples every shard's residents: no user is ever resident in two. Then:
the users that moved are exactly the ones the hash gives the new cluster (about a
third), every acknowledged order is in PostgreSQL once and in its user's history once
(order sequences 1..n per user across clusters), and money is conserved over all
three shards and PostgreSQL (tests/e2e/invariants.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.coordination.etcd_session import EtcdSession
from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import first_document
from services.routing.core.routing_document import RoutingDocument
from services.routing.routing_store import RoutingStore
from services.routing.shard_probe import ShardProbe
from services.routing.wave_controller import WaveController, WaveProgress, WaveSettings
from tests.e2e.gateway_load import FUNDS, LOAD_TIER
from tests.e2e.invariants import MeshAddresses, ShardAddresses, check_mesh_invariants
from tests.gateway.accounts import Account, open_account
from tests.sharded_mesh import ShardedMesh
from tests.sharding.residency_monitor import ResidencyMonitor
from tests.sharding.scaling_load import ScalingLoad, run_during

MAKERS = 3
TAKERS = 45
ORDERS_PER_PHASE = 250
CLUSTERS = ("s1", "s2", "s3")


def addresses(mesh: ShardedMesh) -> MeshAddresses:
    return MeshAddresses(
        tuple(
            ShardAddresses(cluster_id, c.shard.address, c.persister.address)
            for cluster_id, c in mesh.clusters.items()
        ),
        {group: process.address for group, process in mesh.matchers.items()},
    )


def probe_of(mesh: ShardedMesh) -> ShardProbe:
    return ShardProbe(
        {cluster_id: c.shard.address for cluster_id, c in mesh.clusters.items()},
        etcd_endpoints=mesh.etcd_endpoints,
        mesh_id=mesh.mesh_id,
    )


async def audit_histories(mesh: ShardedMesh, load: ScalingLoad, accounts: list[Account]) -> None:
    """Each user's history holds each accepted order once, numbered 1..n across clusters."""
    accepted: dict[int, list[str]] = {}
    for client_order_id, ack in load.acks.items():
        if ack.accepted:
            accepted.setdefault(load.users_of[client_order_id], []).append(ack.order_id)
    for account in accounts:
        async with account.client(mesh.gateway.address) as client:
            history = await client.order_history(limit=1_000)
        ids = sorted(order.order_id for order in history)
        assert ids == sorted(accepted.get(account.user_id, [])), account.user_id
        sequences = sorted(int(order_id.rsplit(":", 1)[1]) for order_id in ids)
        assert sequences == list(range(1, len(ids) + 1)), (account.user_id, ids[:5])


async def test_scale_out_to_three_clusters_and_back_and_a_tier_change_under_load(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    mesh = await new_sharded_mesh(first_document(["s1", "s2"]), cluster_ids=CLUSTERS)
    async with mesh.admin() as admin:
        makers = [await open_account(admin, FUNDS, tier=LOAD_TIER) for _ in range(MAKERS)]
        takers = [await open_account(admin, FUNDS) for _ in range(TAKERS)]
    probe = probe_of(mesh)
    progress: list[WaveProgress] = []
    async with EtcdSession(mesh.etcd_endpoints) as session:
        store = RoutingStore(session, mesh.mesh_id)
        controller = WaveController(store, probe, WaveSettings(wave_size=8), progress.append)
        start = await document(store)
        for maker in makers:  # whales, pinned where they are: the hash never moves them
            await controller.move(maker.user_id, start.owner_of(maker.user_id), pin=True)
        load = ScalingLoad(mesh.gateway.address, makers, takers)
        monitor = ResidencyMonitor(probe, CLUSTERS)
        outcomes: dict[str, WaveProgress] = {}
        owners: dict[str, RoutingDocument] = {}
        whale = next(t.user_id for t in takers if start.owner_of(t.user_id) == "s1")

        async def steps() -> None:
            await load.wait_accepted(ORDERS_PER_PHASE)
            outcomes["activate"] = await controller.activate("s3")
            owners["three"] = await document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE)
            outcomes["tier"] = await controller.move(whale, "s2", pin=True)
            owners["tiered"] = await document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE // 2)
            outcomes["normal"] = await controller.move(whale, None, pin=False)
            outcomes["remove"] = await controller.remove("s3")
            owners["two"] = await document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE)

        watching = asyncio.create_task(monitor.run())
        try:
            await run_during(load, steps())
        finally:
            monitor.stop.set()
            await watching
            await probe.close()

    users = [t.user_id for t in takers]
    three = owners["three"]
    expected = {u for u in users if rendezvous_owner(u, ["s1", "s2", "s3"]) == "s3"}
    assert [c.cluster_id for c in three.clusters] == ["s1", "s2", "s3"]
    assert not outcomes["activate"].returned and not outcomes["activate"].held, outcomes
    assert {u for u in users if three.owner_of(u) == "s3"} == expected
    assert 0.15 < len(expected) / len(users) < 0.55  # about a third
    assert all(three.owner_of(u) == start.owner_of(u) for u in users if u not in expected)
    # Only users the hash gives s3 were ever resident there; nobody was ever in two.
    assert monitor.ever.get("s3", set()) <= expected | {whale}
    assert monitor.samples >= 50 and not monitor.doubles, (monitor.samples, monitor.doubles[:5])
    # The tier change moved that one user and nobody else.
    tiered = owners["tiered"]
    assert tiered.owner_of(whale) == "s2" and tiered.pins.get(whale) == "s2"
    assert all(tiered.owner_of(u) == three.owner_of(u) for u in users if u != whale)
    two = owners["two"]
    assert [c.cluster_id for c in two.clusters] == ["s1", "s2"]
    assert all(two.owner_of(u) == start.owner_of(u) for u in users)
    assert not two.moves and not two.transit and set(two.pins) == {m.user_id for m in makers}

    await check_mesh_invariants(addresses(mesh), mesh.database_url, load.accepted)
    await audit_histories(mesh, load, [*makers, *takers])
    print(
        f"scaling: {len(load.accepted)} orders accepted, retries {dict(load.retries)}, "
        f"monitor {monitor.samples} samples ({monitor.handovers} handovers seen), "
        + "; ".join(
            f"{name}: {p.moved} moved in {p.waves} waves, {p.seconds:.2f} s"
            for name, p in outcomes.items()
        )
    )


async def document(store: RoutingStore) -> RoutingDocument:
    stored = await store.read()
    assert stored is not None
    return stored.document
