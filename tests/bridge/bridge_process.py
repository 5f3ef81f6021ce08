"""A real `oms bridge` subprocess for tests (see tests/service_process.py).

The bridge is stateless: its data folder only names its log file (the harness
passes `--data-dir`, which the bridge accepts and ignores).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import grpc

from protos.oms.v1 import status_pb2, status_pb2_grpc
from tests.service_process import ServiceProcess, aio_channel

WAIT_S = 10.0


class BridgeProcess(ServiceProcess):
    subcommand = "bridge"
    service_name = ""  # the server as a whole: the bridge serves only health and status

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
                "OMS_BRIDGE_BACKOFF_MAX_MS": "500",
                **(environment or {}),
            },
        )
        self.shard_address = shard_address

    def service_arguments(self) -> list[str]:
        return ["--shard-address", self.shard_address]


async def service_status(address: str) -> status_pb2.StatusReport:
    """`oms.v1.Status/GetStatus` of a stateless service."""
    async with aio_channel(address) as channel:
        report = await status_pb2_grpc.StatusStub(channel).GetStatus(
            status_pb2.StatusRequest(), timeout=WAIT_S
        )
    assert isinstance(report, status_pb2.StatusReport)
    return report


async def status_or_none(address: str) -> status_pb2.StatusReport | None:
    try:
        return await service_status(address)
    except grpc.aio.AioRpcError:
        return None
