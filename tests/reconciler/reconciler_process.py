"""A real `oms reconciler` subprocess for tests (see tests/service_process.py).

The reconciler is stateless: its data folder only names its log file (the
harness passes `--data-dir`, which the reconciler accepts and ignores).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import ServiceProcess

ROUND_INTERVAL_MS = 200  # rounds every 0.2 s keep the tests short


class ReconcilerProcess(ServiceProcess):
    subcommand = "reconciler"
    service_name = ""  # the server as a whole: the reconciler serves only health and status

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_address: str,
        matchers: Mapping[str, str],
        shard_id: str = "s1",
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        matcher_text = ",".join(f"{group}={address}" for group, address in matchers.items())
        super().__init__(
            data_dir,
            port=port,
            environment={
                "OMS_MATCHERS": matcher_text,
                "OMS_SHARD_ID": shard_id,
                "OMS_RECONCILER_INTERVAL_MS": str(ROUND_INTERVAL_MS),
                **(environment or {}),
            },
        )
        self.shard_address = shard_address

    def service_arguments(self) -> list[str]:
        return ["--shard-address", self.shard_address]
