"""The bench's count of messages per hop: channelz read from a real gRPC server, and
the sockets of several processes matched into links by their ports."""

from __future__ import annotations

import os

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.bench.transport_counts import (
    ETCD,
    LOAD_GENERATOR,
    SocketCount,
    TransportSnapshot,
    phase_transport,
    process_sockets,
    voluntary_switches,
)
from services.serving.channelz import register_channelz


async def test_a_server_with_channelz_on_reports_each_connection_s_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMS_CHANNELZ", "on")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    register_channelz(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(7):
                await stub.Check(health_pb2.HealthCheckRequest())
            sockets = await process_sockets(f"127.0.0.1:{port}")
        served = [s for s in sockets if not s.dialled and s.local_port == port]
        # The health client's connection, and the one channelz itself is read over.
        assert any(s.received >= 7 and s.sent >= 7 for s in served), sockets
        # This process's own channel to the server shows as a dialled socket too.
        assert any(s.dialled and s.remote_port == port and s.sent >= 7 for s in sockets)
    finally:
        await server.stop(0)


async def test_channelz_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMS_CHANNELZ", raising=False)
    server = grpc.aio.server()
    register_channelz(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await process_sockets(f"127.0.0.1:{port}")
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)


def test_sockets_are_matched_into_links_by_their_ports() -> None:
    """gateway (listens on 100) dials shard (listens on 200) from port 5001; the bench
    dials the gateway from 7001; the shard dials etcd (2379)."""
    before = TransportSnapshot(
        sockets={
            "gateway": [
                SocketCount(1, False, 100, 7001, sent=10, received=10),
                SocketCount(2, True, 5001, 200, sent=4, received=6),
            ],
            "shard": [
                SocketCount(3, False, 200, 5001, sent=6, received=4),
                SocketCount(4, True, 6001, 2379, sent=1, received=1),
            ],
        },
        switches={"gateway": 100, "shard": 50},
    )
    after = TransportSnapshot(
        sockets={
            "gateway": [
                SocketCount(1, False, 100, 7001, sent=110, received=110),
                SocketCount(2, True, 5001, 200, sent=104, received=256),
                SocketCount(9, False, 100, 7002, sent=5, received=5),  # the bench's status call
            ],
            "shard": [
                SocketCount(3, False, 200, 5001, sent=256, received=104),
                SocketCount(4, True, 6001, 2379, sent=3, received=3),
            ],
        },
        switches={"gateway": 400, "shard": 250},
    )
    counted = phase_transport(before, after, {100: "gateway", 200: "shard"}, etcd_ports=[2379])
    assert counted.links == {
        ("gateway", LOAD_GENERATOR): 100,
        (LOAD_GENERATOR, "gateway"): 100,
        ("shard", "gateway"): 250,
        ("gateway", "shard"): 100,
        ("shard", ETCD): 2,
        (ETCD, "shard"): 2,
    }
    assert counted.sent == {"gateway": 200, "shard": 252}
    assert counted.switches == {"gateway": 300, "shard": 200}


def test_voluntary_switches_of_this_process_grow() -> None:
    first = voluntary_switches(os.getpid())
    os.sched_yield()
    for _ in range(3):
        with open("/proc/self/stat", "rb") as stat:
            stat.read(10)
    assert voluntary_switches(os.getpid()) >= first > 0
