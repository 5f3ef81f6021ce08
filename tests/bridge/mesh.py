"""A shard, one matcher per group and a bridge as real processes, and clients of them.

`MeshProcesses` starts every process at once (each start costs about two
seconds of imports, so they overlap) and always reaps them. `MeshClients`
opens a client of each over loopback for one test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from protos.oms.v1 import status_pb2
from services.markets.catalog import load_catalog
from tests.bridge.bridge_process import BridgeProcess, service_status
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_process import MatcherProcess
from tests.service_process import ServiceProcess, aio_channel, start_together
from tests.shard_service.shard_client import ShardClient, eventually
from tests.shard_service.shard_process import SHARD_ID, ShardProcess

GROUPS = tuple(load_catalog(None).groups())
GROUP_OF_SYMBOL = {market.symbol: market.matcher_group for market in load_catalog(None).markets}


@dataclass
class MeshProcesses:
    shard: ShardProcess
    matchers: dict[str, MatcherProcess]
    bridge: BridgeProcess
    extra: list[ServiceProcess] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        folder: Path,
        *,
        matcher_environment: Mapping[str, Mapping[str, str]] | None = None,
        bridge_environment: Mapping[str, str] | None = None,
    ) -> MeshProcesses:
        folder.mkdir(parents=True, exist_ok=True)
        shard = ShardProcess(folder / "shard")
        matchers = {
            group: MatcherProcess(
                folder / f"matcher-{group}",
                group=group,
                environment=(matcher_environment or {}).get(group),
            )
            for group in GROUPS
        }
        bridge = BridgeProcess(
            folder / "bridge",
            shard_address=shard.address,
            matchers={group: process.address for group, process in matchers.items()},
            environment=bridge_environment,
        )
        return cls(shard, matchers, bridge)

    @property
    def matcher_addresses(self) -> dict[str, str]:
        return {group: process.address for group, process in self.matchers.items()}

    def all(self) -> list[ServiceProcess]:
        return [self.shard, *self.matchers.values(), self.bridge, *self.extra]

    def start(self, *processes: ServiceProcess) -> None:
        """Start `processes` (default: all) together and wait until each is SERVING."""
        start_together(list(processes) or self.all(), self.stop)

    def stop(self) -> None:
        for process in self.all():
            process.stop()


@dataclass
class MeshClients:
    shard: ShardClient
    matchers: dict[str, MatcherClient]
    bridge_address: str

    async def bridge_status(self) -> status_pb2.StatusReport:
        return await service_status(self.bridge_address)

    async def wait_bridge_connected(self) -> status_pb2.StatusReport:
        """Poll until the bridge has a session with the shard and every matcher group."""

        def connected(report: status_pb2.StatusReport) -> bool:
            return all(report.info.get(f"connected.{group}") == "yes" for group in GROUPS)

        return await eventually(self.bridge_status, connected, timeout_s=20)


@asynccontextmanager
async def mesh_clients(processes: MeshProcesses) -> AsyncIterator[MeshClients]:
    channels = [aio_channel(processes.shard.address)]
    channels += [aio_channel(process.address) for process in processes.matchers.values()]
    try:
        yield MeshClients(
            ShardClient(channels[0]),
            {
                group: MatcherClient(channel)
                for group, channel in zip(processes.matchers, channels[1:], strict=True)
            },
            processes.bridge.address,
        )
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


__all__ = ["GROUPS", "GROUP_OF_SYMBOL", "SHARD_ID", "MeshClients", "MeshProcesses", "mesh_clients"]
