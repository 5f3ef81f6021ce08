"""Scaling under a steady order load: two clusters to three and back, and a tier change.

Real processes (three clusters' shards, persisters, bridges and reconcilers, two
matcher groups, a gateway routing by the document in etcd, PostgreSQL), driven by the
operator's handler with OmsCluster resource bodies, as `kubectl scale` and `kubectl
apply` would have kopf call it (the same wave code `omsctl` runs), the clusters'
processes being there already (`OMS_OPERATOR_WORKLOADS=external`). While the load runs,
a monitor samples every shard's residents: no user is ever resident in two. Then:
the users that moved are exactly the ones the hash gives the new cluster (about a
third), every acknowledged order is in PostgreSQL once and in its user's history once
(order sequences 1..n per user across clusters), and money is conserved over all
three shards and PostgreSQL (tests/e2e/invariants.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import pytest

from k8s.operator import handlers
from k8s.operator.handlers import OperatorContext
from k8s.operator.mesh_reconciler import MeshReconciler
from k8s.operator.workloads import ExternalWorkloads
from services.coordination.etcd_session import EtcdSession
from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import first_document
from services.routing.core.routing_document import RoutingDocument
from services.routing.routing_store import RoutingStore
from services.routing.wave_controller import WaveController
from tests.e2e.gateway_load import run_load_until
from tests.e2e.invariants import check_mesh_invariants
from tests.sharded_mesh import ShardedMesh
from tests.sharding.residency_monitor import ResidencyMonitor
from tests.sharding.scaling_audit import audit_histories, current_document, open_traders

MAKERS = 3
TAKERS = 45
ORDERS_PER_PHASE = 250
CLUSTERS = ("s1", "s2", "s3")


def oms_cluster(shards: int, pins: dict[int, str], generation: int) -> kopf.Body:
    """An OmsCluster resource as the API server hands it to the operator."""
    raw: dict[str, Any] = {
        "apiVersion": "oms.mesh.io/v1alpha1",
        "kind": "OmsCluster",
        "metadata": {"name": "main", "namespace": "oms", "generation": generation},
        "spec": {
            "shards": shards,
            "pins": {str(user): cluster for user, cluster in pins.items()},
            "waveSize": 8,
            "quiesceSeconds": 10,
        },
    }
    return kopf.Body(raw)  # type: ignore[arg-type]  # RawBody's metadata omits generation


async def handle(memo: kopf.Memo, body: kopf.Body) -> dict[str, Any]:
    """The operator's handler on `body`, as kopf calls it; the status it patched."""
    patch = kopf.Patch()
    await handlers.reconcile(
        spec=body.spec,
        name=body.metadata.name or "",
        namespace=body.metadata.namespace,
        meta=body.metadata,
        patch=patch,
        memo=memo,
        logger=logging.getLogger("test.operator"),
    )
    status: dict[str, Any] = dict(patch.status)
    return status


async def test_scale_out_to_three_clusters_and_back_and_a_tier_change_under_load(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    mesh = await new_sharded_mesh(first_document(["s1", "s2"]), cluster_ids=CLUSTERS)
    probe = mesh.probe()
    published: list[dict[str, Any]] = []

    async def publish(status: dict[str, Any]) -> None:
        published.append(status)

    async with EtcdSession(mesh.etcd_endpoints) as session:
        store = RoutingStore(session, mesh.mesh_id)
        reconciler = MeshReconciler(store, probe, ExternalWorkloads(probe))
        memo = kopf.Memo(context=OperatorContext(reconciler, lambda namespace, name: publish))
        traders = await open_traders(
            mesh, WaveController(store, probe), makers=MAKERS, takers=TAKERS
        )
        makers, takers = traders.makers, traders.takers
        pins = {
            maker.user_id: (await current_document(store)).owner_of(maker.user_id) or ""
            for maker in makers
        }
        start = await current_document(store)
        load = traders.load(mesh.gateway.address)
        monitor = ResidencyMonitor(probe, CLUSTERS)
        outcomes: dict[str, dict[str, Any]] = {}
        owners: dict[str, RoutingDocument] = {}
        whale = next(t.user_id for t in takers if start.owner_of(t.user_id) == "s1")

        async def steps() -> None:
            outcomes["start"] = await handle(memo, oms_cluster(2, pins, 1))
            await load.wait_accepted(ORDERS_PER_PHASE)
            # kubectl scale omscluster/main --replicas 3
            outcomes["activate"] = await handle(memo, oms_cluster(3, pins, 2))
            owners["three"] = await current_document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE)
            # A tier change: the user pinned as a whale to s2 (kubectl apply of the spec).
            outcomes["tier"] = await handle(memo, oms_cluster(3, {**pins, whale: "s2"}, 3))
            owners["tiered"] = await current_document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE // 2)
            # The whale a normal user again: unpinned, back where the hash puts it.
            outcomes["untier"] = await handle(memo, oms_cluster(3, pins, 4))
            owners["untiered"] = await current_document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE // 2)
            # Back to two clusters.
            outcomes["remove"] = await handle(memo, oms_cluster(2, pins, 5))
            owners["two"] = await current_document(store)
            await load.wait_accepted(len(load.accepted) + ORDERS_PER_PHASE)

        async with monitor.sampling():
            await run_load_until(load, steps)
        # A spec that cannot be done fails the handler and says why, changing nothing.
        with pytest.raises(kopf.PermanentError, match="s9"):
            await handle(memo, oms_cluster(2, {**pins, whale: "s9"}, 6))
        assert (await current_document(store)).epoch == owners["two"].epoch
        await probe.close()

    users = [t.user_id for t in takers]
    three = owners["three"]
    expected = {u for u in users if rendezvous_owner(u, ["s1", "s2", "s3"]) == "s3"}
    assert outcomes["start"]["phase"] == "Ready" and outcomes["start"]["shards"] == 2
    activated = outcomes["activate"]
    assert activated["phase"] == "Ready" and activated["shards"] == 3, activated
    assert activated["epoch"] == three.epoch and activated["observedGeneration"] == 2
    assert activated["wave"]["operation"] == "activate s3", activated
    assert not activated["wave"]["returned"] and not activated["wave"]["held"], activated
    assert [c["id"] for c in activated["clusters"]] == list(CLUSTERS)
    # While the wave ran, the status said so.
    scaling = [s for s in published if s.get("phase") == "Scaling"]
    assert scaling and any(s["wave"]["operation"] == "activate s3" for s in scaling)
    assert [c.cluster_id for c in three.clusters] == ["s1", "s2", "s3"]
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
    assert outcomes["tier"]["pins"][str(whale)] == "s2"
    # Unpinned, it went back where the hash puts it, and nobody else moved.
    untiered = owners["untiered"]
    assert whale not in untiered.pins and untiered.owner_of(whale) == three.owner_of(whale)
    assert all(untiered.owner_of(u) == three.owner_of(u) for u in users)
    assert outcomes["untier"]["wave"]["operation"] == f"unpin {whale}"
    two = owners["two"]
    assert [c.cluster_id for c in two.clusters] == ["s1", "s2"]
    assert all(two.owner_of(u) == start.owner_of(u) for u in users)
    assert not two.moves and not two.transit and set(two.pins) == {m.user_id for m in makers}
    assert outcomes["remove"]["shards"] == 2 and outcomes["remove"]["wave"]["operation"] == (
        "remove s3"
    )

    await check_mesh_invariants(mesh.addresses(), mesh.database_url, load.accepted)
    await audit_histories(mesh, load, [*makers, *takers])
    print(
        f"scaling: {len(load.accepted)} orders accepted, retries {dict(load.retries)}, "
        f"monitor {monitor.samples} samples ({monitor.handovers} handovers seen), "
        + "; ".join(
            f"{name}: {o['wave']['moved']} moved in {o['wave']['waves']} waves, "
            f"{o['wave']['seconds']:.2f} s"
            for name, o in outcomes.items()
            if "wave" in o
        )
    )
