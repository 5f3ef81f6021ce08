"""grpc.health.v1 while the matcher is up, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import BTC, BUY, OPEN, REFERENCE_TICKS, OrderFactory
from tests.matcher_service.matcher_process import SERVICE_NAME, MatcherProcess, aio_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
# Under the host's 5 s drain grace plus the log's close, with a margin for a busy machine.
STOP_DEADLINE_S = 10.0


async def test_health_is_serving_for_the_server_and_the_matcher_service(
    matcher: MatcherClient,
) -> None:
    health = health_pb2_grpc.HealthStub(matcher.channel)
    for name in ("", SERVICE_NAME):
        response = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert response.status == SERVING, name
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await health.Check(health_pb2.HealthCheckRequest(service="oms.v1.NoSuchService"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_sigterm_stops_the_matcher_gracefully_with_exit_code_zero(
    new_matcher: Callable[..., MatcherProcess],
) -> None:
    process = new_matcher()
    await asyncio.to_thread(process.start_serving)
    order = OrderFactory("sigterm").limit(3, BUY, REFERENCE_TICKS[BTC] - 1, 1)
    async with aio_channel(process.address) as channel:
        (result,) = await MatcherClient(channel).submit(order)
        assert result.order.status == OPEN
        health = health_pb2_grpc.HealthStub(channel)
        response = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert response.status == SERVING

        exit_code = await asyncio.to_thread(process.terminate, STOP_DEADLINE_S)

    assert exit_code == 0, process.log_tail()
    assert '"event": "service.stopped"' in process.log_tail()
