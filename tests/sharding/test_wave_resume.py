"""A wave controller killed mid-wave, under a trading load, and the next one run after it.

`omsctl activate s3` runs as the operator runs it (a process, waves of 3 users) and is
killed with SIGKILL just after its second wave put users in transit: etcd holds a
document in which those users are owned by nobody. The mesh keeps trading meanwhile
(their orders are retried by the clients, everyone else's go through). Running
`omsctl activate s3` again settles what the first left in transit and finishes the
scale-out. Throughout, a monitor finds nobody resident in two shards; at the end the
users on s3 are exactly the ones the hash gives it, every acknowledged order is in
its user's history once, and money is conserved over the three shards and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from services.coordination.etcd_session import EtcdSession
from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import first_document
from services.routing.core.routing_document import ClusterState, RoutingDocument
from services.routing.routing_store import RoutingStore
from services.routing.wave_controller import WaveController
from tests.e2e.gateway_load import run_load_until
from tests.e2e.invariants import check_mesh_invariants
from tests.sharded_mesh import ShardedMesh
from tests.sharding.omsctl_process import kill_at, run_to_the_end, start_omsctl
from tests.sharding.residency_monitor import ResidencyMonitor
from tests.sharding.scaling_audit import audit_histories, current_document, open_traders

CLUSTERS = ("s1", "s2", "s3")
MAKERS = 3
TAKERS = 30
ORDERS = 200


@dataclass
class Observed:
    killed_output: list[str] = field(default_factory=list)  # the first run's, to its kill
    left: RoutingDocument | None = None  # what the killed controller left in etcd
    resumed_output: Sequence[str] = ()  # the second run's


async def test_a_wave_controller_killed_mid_wave_is_rolled_forward_by_the_next(
    new_sharded_mesh: Callable[..., Awaitable[ShardedMesh]],
) -> None:
    mesh = await new_sharded_mesh(first_document(["s1", "s2"]), cluster_ids=CLUSTERS)
    probe = mesh.probe()
    async with EtcdSession(mesh.etcd_endpoints) as session:
        store = RoutingStore(session, mesh.mesh_id)
        traders = await open_traders(
            mesh, WaveController(store, probe), makers=MAKERS, takers=TAKERS
        )
        start = await current_document(store)
        load = traders.load(mesh.gateway.address)
        monitor = ResidencyMonitor(probe, CLUSTERS)
        seen = Observed()

        async def steps() -> None:
            await load.wait_accepted(ORDERS)
            first = await start_omsctl(mesh, "activate", "s3", "--wave-size", "3")
            seen.killed_output = await kill_at(first, ": in transit,", occurrence=2)
            seen.left = await current_document(store)
            # Trading goes on with users owned by nobody: their orders wait and are retried.
            await load.wait_accepted(len(load.accepted) + ORDERS // 2)
            second = await start_omsctl(mesh, "activate", "s3", "--wave-size", "3")
            seen.resumed_output = await run_to_the_end(second)
            await load.wait_accepted(len(load.accepted) + ORDERS)

        try:
            async with monitor.sampling():
                await run_load_until(load, steps)
        finally:
            await probe.close()
        end = await current_document(store)

    left = seen.left
    assert left is not None
    # The first controller died mid-wave: users in transit, s3 still receiving.
    assert left.transit, seen.killed_output
    joining = left.cluster("s3")
    assert joining is not None and joining.state == ClusterState.RECEIVING
    # The second one finished the job: s3 active, nobody in transit, nothing held.
    assert [(c.cluster_id, c.state) for c in end.clusters] == [
        (cluster_id, ClusterState.ACTIVE) for cluster_id in CLUSTERS
    ]
    assert not end.transit and not end.moves, end
    users = traders.taker_ids
    expected = {u for u in users if rendezvous_owner(u, CLUSTERS) == "s3"}
    assert {u for u in users if end.owner_of(u) == "s3"} == expected
    assert all(end.owner_of(u) == start.owner_of(u) for u in users if u not in expected)
    assert monitor.ever.get("s3", set()) <= expected
    assert monitor.samples >= 50 and not monitor.doubles, (monitor.samples, monitor.doubles[:5])

    await check_mesh_invariants(mesh.addresses(), mesh.database_url, load.accepted)
    await audit_histories(mesh, load, [*traders.makers, *traders.takers])
    done = [line for line in seen.resumed_output if "done in" in line]
    print(
        f"wave resume: {len(load.accepted)} orders accepted, retries {dict(load.retries)}, "
        f"{len(left.transit)} user(s) left in transit by the killed controller; "
        f"the next run: {done[-1] if done else seen.resumed_output}"
    )
