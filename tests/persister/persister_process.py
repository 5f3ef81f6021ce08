"""A real `oms persister` subprocess for tests (see tests/service_process.py).

The persister keeps no local state: the harness's `--data-dir` is accepted and
ignored by the command, and only names where this process's log file goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import ServiceProcess

SERVICE_NAME = "oms.v1.Persister"


class PersisterProcess(ServiceProcess):
    subcommand = "persister"
    service_name = SERVICE_NAME

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_address: str,
        database_url: str,
        shard_id: str = "s1",
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir, port=port, environment=environment)
        self.shard_address = shard_address
        self.database_url = database_url
        self.shard_id = shard_id

    def service_arguments(self) -> list[str]:
        return [
            "--shard-address",
            self.shard_address,
            "--database-url",
            self.database_url,
            "--shard-id",
            self.shard_id,
        ]
