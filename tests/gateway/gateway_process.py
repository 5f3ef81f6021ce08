"""A real `oms gateway` subprocess for tests (see tests/service_process.py).

The gateway keeps no state: its data folder only names its log file (the harness
passes `--data-dir`, which the gateway accepts and ignores).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import ServiceProcess

SERVICE_NAME = "oms.v1.OrderGateway"
ADMIN_KEY = "admin-test"
ADMIN_SECRET = "admin-test-secret-0123456789abcdef"


class GatewayProcess(ServiceProcess):
    subcommand = "gateway"
    service_name = SERVICE_NAME

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_address: str,
        persister_address: str,
        matchers: Mapping[str, str],
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            port=port,
            environment={
                "OMS_SHARD_ADDRESS": shard_address,
                "OMS_PERSISTER_ADDRESS": persister_address,
                "OMS_MATCHERS": ",".join(
                    f"{group}={address}" for group, address in matchers.items()
                ),
                "OMS_ADMIN_API_KEY": ADMIN_KEY,
                "OMS_ADMIN_API_SECRET": ADMIN_SECRET,
                **(environment or {}),
            },
        )
