"""A real `oms bridge` subprocess for tests (see tests/service_process.py)."""

from __future__ import annotations

import grpc

from protos.oms.v1 import status_pb2, status_pb2_grpc
from tests.service_process import ShardFollowerProcess, aio_channel

WAIT_S = 10.0


class BridgeProcess(ShardFollowerProcess):
    subcommand = "bridge"
    default_environment = {"OMS_BRIDGE_BACKOFF_MAX_MS": "500"}


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
