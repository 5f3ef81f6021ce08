"""A mesh of several user-shard clusters as real processes, routed by the document in etcd.

Each cluster is a shard with its own persister, bridge and reconciler (the shard's id
is the cluster's id); the matcher groups, the database and the gateway are shared.
The routing document is written to etcd (under a mesh id of the test's own) before
anything starts, so every shard logs it first and the gateway routes by it from its
first request. `ShardedMesh` always reaps what it started and drops its database.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.client import AdminClient
from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_document import RoutingDocument
from services.routing.routing_store import RoutingStore, StoredRouting
from services.routing.shard_probe import ShardProbe
from tests.bridge.bridge_process import BridgeProcess
from tests.databases import drop_database, fresh_database
from tests.e2e.invariants import MeshAddresses, ShardAddresses
from tests.full_mesh import GROUPS
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET, GatewayProcess
from tests.matcher_service.matcher_process import MatcherProcess
from tests.persister.persister_process import PersisterProcess
from tests.reconciler.reconciler_process import ReconcilerProcess
from tests.service_process import ServiceProcess, start_together
from tests.shard_service.shard_process import ShardProcess


@dataclass
class ClusterProcesses:
    cluster_id: str
    shard: ShardProcess
    persister: PersisterProcess
    bridge: BridgeProcess
    reconciler: ReconcilerProcess

    def all(self) -> list[ServiceProcess]:
        return [self.shard, self.persister, self.bridge, self.reconciler]


@dataclass
class ShardedMesh:
    folder: Path
    server_url: str
    database_url: str
    etcd_endpoints: tuple[str, ...]
    mesh_id: str
    matchers: dict[str, MatcherProcess]
    clusters: dict[str, ClusterProcesses]
    gateway: GatewayProcess
    extra: list[ServiceProcess] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        folder: Path,
        server_url: str,
        etcd_endpoints: Sequence[str],
        cluster_ids: Sequence[str],
        *,
        shard_environment: Mapping[str, str] | None = None,
        gateway_environment: Mapping[str, str] | None = None,
    ) -> ShardedMesh:
        """Processes not yet started, for clusters `cluster_ids` (some may join later: the
        gateway knows every one's addresses, the routing document says which serve)."""
        folder.mkdir(parents=True, exist_ok=True)
        database_url = fresh_database(server_url)
        mesh_id = "test-" + secrets.token_hex(4)
        etcd = {"OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints), "OMS_MESH_ID": mesh_id}
        matchers = {
            group: MatcherProcess(folder / f"matcher-{group}", group=group) for group in GROUPS
        }
        addresses = {group: process.address for group, process in matchers.items()}
        clusters: dict[str, ClusterProcesses] = {}
        for cluster_id in cluster_ids:
            shard = ShardProcess(
                folder / f"shard-{cluster_id}",
                shard_id=cluster_id,
                environment={**etcd, **(shard_environment or {})},
            )
            clusters[cluster_id] = ClusterProcesses(
                cluster_id,
                shard,
                PersisterProcess(
                    folder / f"persister-{cluster_id}",
                    shard_address=shard.address,
                    shard_id=cluster_id,
                    database_url=database_url,
                    environment=etcd,
                ),
                BridgeProcess(
                    folder / f"bridge-{cluster_id}",
                    shard_address=shard.address,
                    shard_id=cluster_id,
                    matchers=addresses,
                ),
                ReconcilerProcess(
                    folder / f"reconciler-{cluster_id}",
                    shard_address=shard.address,
                    shard_id=cluster_id,
                    matchers=addresses,
                ),
            )
        gateway = _routed_gateway(
            folder / "gateway", etcd, matchers, clusters, gateway_environment or {}
        )
        return cls(
            folder,
            server_url,
            database_url,
            tuple(etcd_endpoints),
            mesh_id,
            matchers,
            clusters,
            gateway,
        )

    def new_gateway(
        self, name: str, environment: Mapping[str, str] | None = None
    ) -> GatewayProcess:
        """Another gateway routing by the document (not started; reaped with the mesh)."""
        etcd = {"OMS_ETCD_ENDPOINTS": ",".join(self.etcd_endpoints), "OMS_MESH_ID": self.mesh_id}
        gateway = _routed_gateway(
            self.folder / name, etcd, self.matchers, self.clusters, environment or {}
        )
        self.extra.append(gateway)
        return gateway

    def all(self) -> list[ServiceProcess]:
        processes: list[ServiceProcess] = [*self.matchers.values()]
        for cluster in self.clusters.values():
            processes += cluster.all()
        return [*processes, self.gateway, *self.extra]

    def start(self, *processes: ServiceProcess) -> None:
        """Start `processes` (default: all) together and wait until each is SERVING."""
        start_together(list(processes) or self.all(), self.stop)

    def stop(self) -> None:
        """Kill and reap every process, then drop the database: safe to call more than once."""
        for process in self.all():
            process.stop()
        drop_database(self.server_url, self.database_url)

    def admin(self, address: str | None = None) -> AdminClient:
        return AdminClient(
            address or self.gateway.address, api_key=ADMIN_KEY, api_secret=ADMIN_SECRET
        )

    def addresses(self) -> MeshAddresses:
        """Every cluster's shard and persister and every matcher group, for the invariants."""
        return MeshAddresses(
            tuple(
                ShardAddresses(cluster_id, c.shard.address, c.persister.address)
                for cluster_id, c in self.clusters.items()
            ),
            {group: process.address for group, process in self.matchers.items()},
            self.gateway.address,
        )

    def probe(self) -> ShardProbe:
        """What a wave controller asks of the shards, at these shards' addresses."""
        return ShardProbe(
            {cluster_id: c.shard.address for cluster_id, c in self.clusters.items()},
            etcd_endpoints=self.etcd_endpoints,
            mesh_id=self.mesh_id,
        )

    async def write_routing(self, document: RoutingDocument) -> StoredRouting:
        """Swap the mesh's routing document for `document` (its epoch must be the next)."""
        async with EtcdSession(self.etcd_endpoints) as session:
            store = RoutingStore(session, self.mesh_id)
            return await store.swap(await store.read(), document)


def _routed_gateway(
    folder: Path,
    etcd: Mapping[str, str],
    matchers: Mapping[str, MatcherProcess],
    clusters: Mapping[str, ClusterProcesses],
    environment: Mapping[str, str],
) -> GatewayProcess:
    return GatewayProcess(
        folder,
        shard_address="",  # unused: the routing document names the clusters
        persister_address="",
        matchers={group: process.address for group, process in matchers.items()},
        environment={
            **etcd,
            "OMS_GATEWAY_ROUTING": "etcd",
            "OMS_SHARDS": ",".join(f"{c}={p.shard.address}" for c, p in clusters.items()),
            "OMS_PERSISTERS": ",".join(f"{c}={p.persister.address}" for c, p in clusters.items()),
            **environment,
        },
    )
