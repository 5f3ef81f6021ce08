"""Readable status of a running mesh: which service serves, and when that changes.

Polls each child's grpc.health.v1 endpoint; prints one table once every service
is SERVING, and one line whenever a service stops or starts serving afterwards
(a crash and its restart by the supervisor show up as two lines).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.clients.channels import gateway_channel, mesh_channel

POLL_INTERVAL_S = 0.5


async def serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.aio.AioRpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


async def report_readiness(addresses: Mapping[str, str]) -> None:
    """Run until cancelled; `addresses` maps a service name to host:port. The gateway
    is reached on its public port as a client would; the others as mesh peers."""
    channels = {
        name: (gateway_channel if name == "gateway" else mesh_channel)(address)
        for name, address in addresses.items()
    }
    stubs = {name: health_pb2_grpc.HealthStub(channel) for name, channel in channels.items()}
    known: dict[str, bool] = {}
    announced = False
    try:
        while True:
            states = dict(
                zip(stubs, await asyncio.gather(*(serving(s) for s in stubs.values())), strict=True)
            )
            if not announced and all(states.values()):
                announced = True
                print("[mesh] all services serving:", flush=True)
                for name, address in addresses.items():
                    print(f"[mesh]   {name:<12} {address}", flush=True)
            elif announced:
                for name, up in states.items():
                    if known.get(name) != up:
                        print(
                            f"[mesh] {name} {'serving again' if up else 'NOT serving'}",
                            flush=True,
                        )
            known = states
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        for channel in channels.values():
            await channel.close()
