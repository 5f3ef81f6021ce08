"""A real `oms shard` subprocess for tests (see tests/service_process.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import ServiceProcess, ServiceProcessError, aio_channel

SERVICE_NAME = "oms.v1.UserShard"
SHARD_ID = "s1"
ShardProcessError = ServiceProcessError

__all__ = ["SERVICE_NAME", "SHARD_ID", "ShardProcess", "ShardProcessError", "aio_channel"]


class ShardProcess(ServiceProcess):
    """One user shard served by a child process; restartable on the same data and port."""

    subcommand = "shard"
    service_name = SERVICE_NAME

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_id: str = SHARD_ID,
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
        colocate: bool = False,
    ) -> None:
        super().__init__(data_dir, port=port, environment=environment)
        self.shard_id = shard_id
        # `oms shard --colocate`: its persister, bridge and reconciler in this process
        # (configured by the environment; tests/full_mesh.py builds it).
        self.colocate = colocate

    def service_arguments(self) -> list[str]:
        return ["--shard-id", self.shard_id, *(["--colocate"] if self.colocate else [])]
