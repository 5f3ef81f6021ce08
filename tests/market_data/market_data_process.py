"""A real `oms marketdata` subprocess for tests (see tests/service_process.py).

The market-data service keeps no state of its own: it follows every matcher group's
feed and reads the fills through a persister, so a restart rebuilds everything from
them. The harness's `--data-dir` is accepted and ignored by the command, and only
names where this process's log file goes. The suite runs plaintext (`OMS_TLS=off`),
so `MarketDataClient(process.address)` reaches it as a client would a public port.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import ServiceProcess

SERVICE_NAME = "oms.v1.MarketData"


class MarketDataProcess(ServiceProcess):
    subcommand = "marketdata"
    service_name = SERVICE_NAME

    def __init__(
        self,
        data_dir: Path,
        *,
        matchers: Mapping[str, str],
        persister_address: str,
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            port=port,
            environment={
                "OMS_MATCHERS": ",".join(
                    f"{group}={address}" for group, address in matchers.items()
                ),
                "OMS_MARKETDATA_PERSISTER": persister_address,
                # A matcher restarted under a test is followed again within a few
                # hundred ms rather than the production back-off's second.
                "OMS_MARKETDATA_BACKOFF_MAX_MS": "300",
                **(environment or {}),
            },
        )
