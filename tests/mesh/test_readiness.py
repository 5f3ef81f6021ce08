"""What `oms demo` waits for before it trades: each service of the mesh serving in
one of its processes (a leader-only role beside a follower replica opens no port)."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from services.mesh.readiness import NotServingError, wait_until_serving


def _closed_port_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def test_a_service_serves_once_one_of_its_processes_does() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        standby = _closed_port_address()
        await wait_until_serving(
            {"persister s1": [standby, f"127.0.0.1:{port}"], "shard s1": [f"127.0.0.1:{port}"]},
            deadline_s=10,
        )
        with pytest.raises(NotServingError, match=r"not serving after 1 s: bridge s1$"):
            await wait_until_serving(
                {"bridge s1": [standby], "shard s1": [f"127.0.0.1:{port}"]}, deadline_s=1
            )
    finally:
        await server.stop(0)
