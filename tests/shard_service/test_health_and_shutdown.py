"""Health is SERVING while up; SIGTERM stops the shard with exit code 0 within a deadline."""

from __future__ import annotations

from collections.abc import Callable

from grpc_health.v1 import health_pb2

from tests.shard_service.shard_process import ShardProcess

SIGTERM_DEADLINE_S = 10.0


def test_serving_then_sigterm_exits_zero(new_shard: Callable[..., ShardProcess]) -> None:
    process = new_shard()
    process.start_serving()
    assert process.health() == health_pb2.HealthCheckResponse.SERVING
    assert process.terminate(SIGTERM_DEADLINE_S) == 0, process.log_tail()
