"""The whole mesh as real processes: shard, matchers g1/g2, bridge, persister, reconciler, gateway.

The one place that starts a whole mesh for tests (the gateway and end-to-end
tests use it). `FullMesh` starts every process at once (imports cost about two
seconds each, so they overlap), gives the persister a database of its own, and
always reaps what it started. `new_gateway` adds another gateway on the same
mesh (gateways keep no state, so any number can serve one shard).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from gateway.client import AdminClient
from services.markets.catalog import load_catalog
from tests.bridge.bridge_process import BridgeProcess, service_status
from tests.databases import drop_database, fresh_database
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET, GatewayProcess
from tests.matcher_service.matcher_process import MatcherProcess
from tests.persister.persister_process import PersisterProcess
from tests.reconciler.reconciler_process import ReconcilerProcess
from tests.service_process import ServiceProcess, ServiceProcessError, start_together
from tests.shard_service.shard_process import ShardProcess

GROUPS = tuple(load_catalog(None).groups())
ROLES_START_S = 30.0


@dataclass
class FullMesh:
    folder: Path
    server_url: str
    database_url: str
    shard: ShardProcess
    matchers: dict[str, MatcherProcess]
    bridge: BridgeProcess
    persister: PersisterProcess
    reconciler: ReconcilerProcess
    gateway: GatewayProcess
    extra: list[ServiceProcess] = field(default_factory=list)
    colocated: bool = False  # the persister, bridge and reconciler are in the shard's process

    @classmethod
    def create(
        cls,
        folder: Path,
        server_url: str,
        *,
        shard_environment: Mapping[str, str] | None = None,
        matcher_environment: Mapping[str, Mapping[str, str]] | None = None,
        bridge_environment: Mapping[str, str] | None = None,
        persister_environment: Mapping[str, str] | None = None,
        reconciler_environment: Mapping[str, str] | None = None,
        gateway_environment: Mapping[str, str] | None = None,
        colocated: bool = False,
    ) -> FullMesh:
        """A mesh of processes not yet started, on a fresh database of `server_url`'s server.

        `colocated`: the shard's persister, bridge and reconciler run in the shard's
        process (`oms shard --colocate`), each on its own port as usual, configured by
        the environment their own processes would get; `all()` then holds the shard only
        (killing it kills the four)."""
        folder.mkdir(parents=True, exist_ok=True)
        database_url = fresh_database(server_url)
        shard = ShardProcess(folder / "shard", environment=shard_environment, colocate=colocated)
        matchers = {
            group: MatcherProcess(
                folder / f"matcher-{group}",
                group=group,
                environment=(matcher_environment or {}).get(group),
            )
            for group in GROUPS
        }
        addresses = {group: process.address for group, process in matchers.items()}
        bridge = BridgeProcess(
            folder / "bridge",
            shard_address=shard.address,
            matchers=addresses,
            environment=bridge_environment,
        )
        persister = PersisterProcess(
            folder / "persister",
            shard_address=shard.address,
            database_url=database_url,
            environment=persister_environment,
        )
        reconciler = ReconcilerProcess(
            folder / "reconciler",
            shard_address=shard.address,
            matchers=addresses,
            environment=reconciler_environment,
        )
        gateway = GatewayProcess(
            folder / "gateway",
            shard_address=shard.address,
            persister_address=persister.address,
            matchers=addresses,
            environment=gateway_environment,
        )
        if colocated:
            shard.environment.update(
                {
                    **bridge.environment,
                    **persister.environment,
                    **reconciler.environment,
                    "OMS_SHARD_ADDRESS": shard.address,
                    "OMS_DATABASE_URL": database_url,
                    "OMS_PERSISTER_LISTEN": persister.address,
                    "OMS_BRIDGE_LISTEN": bridge.address,
                    "OMS_RECONCILER_LISTEN": reconciler.address,
                    **(shard_environment or {}),
                }
            )
        return cls(
            folder,
            server_url,
            database_url,
            shard,
            matchers,
            bridge,
            persister,
            reconciler,
            gateway,
            colocated=colocated,
        )

    @property
    def matcher_addresses(self) -> dict[str, str]:
        return {group: process.address for group, process in self.matchers.items()}

    def all(self) -> list[ServiceProcess]:
        roles = [] if self.colocated else [self.bridge, self.persister, self.reconciler]
        return [self.shard, *self.matchers.values(), *roles, self.gateway, *self.extra]

    def start(self, *processes: ServiceProcess) -> None:
        """Start `processes` (default: all) together and wait until each is SERVING (and,
        co-located, the shard's roles in its process)."""
        start_together(list(processes) or self.all(), self.stop)
        if self.colocated and (not processes or self.shard in processes):
            self.wait_roles_serving()

    def wait_roles_serving(self, timeout_s: float = ROLES_START_S) -> None:
        """Until the persister, bridge and reconciler inside the co-located shard serve."""
        deadline = time.monotonic() + timeout_s
        for role in (self.persister, self.bridge, self.reconciler):
            while True:
                with contextlib.suppress(grpc.RpcError):
                    if role.health() == health_pb2.HealthCheckResponse.SERVING:
                        break
                if time.monotonic() > deadline:
                    raise ServiceProcessError(
                        f"the co-located {role.subcommand} is not serving\n{self.shard.log_tail()}"
                    )
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill and reap every process, then drop the database: safe to call more than once."""
        for process in self.all():
            process.stop()
        drop_database(self.server_url, self.database_url)

    def new_gateway(
        self, name: str, environment: Mapping[str, str] | None = None
    ) -> GatewayProcess:
        """Another gateway on this mesh (not started; reaped with the mesh)."""
        gateway = GatewayProcess(
            self.folder / name,
            shard_address=self.shard.address,
            persister_address=self.persister.address,
            matchers=self.matcher_addresses,
            environment=environment,
        )
        self.extra.append(gateway)
        return gateway

    def admin(self, address: str | None = None) -> AdminClient:
        return AdminClient(
            address or self.gateway.address, api_key=ADMIN_KEY, api_secret=ADMIN_SECRET
        )


async def gateway_counters(address: str) -> dict[str, int]:
    report = await service_status(address)
    return dict(report.counters)


@contextlib.contextmanager
def running_mesh(folder: Path, server_url: str, **options: Any) -> Iterator[FullMesh]:
    """A started mesh (options as `FullMesh.create`), stopped and its database dropped on exit."""
    mesh = FullMesh.create(folder, server_url, **options)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()
