"""Readable status of a running mesh: which service serves, and when that changes.

Polls each child's grpc.health.v1 endpoint; prints one table once every service
is SERVING, and one line whenever a service stops or starts serving afterwards
(a crash and its restart by the supervisor show up as two lines).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.clients.channels import service_channel

POLL_INTERVAL_S = 0.5
# What `oms up` says once every service serves, and what `oms demo` waits for.
READY_HINT = "try `oms demo` and `oms status` in another terminal"


class NotServingError(Exception):
    """Some services did not serve within the wait; the message names them."""


async def serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.aio.AioRpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def _channels(addresses: Mapping[str, str]) -> dict[str, grpc.aio.Channel]:
    return {name: service_channel(name, address) for name, address in addresses.items()}


async def wait_until_serving(groups: Mapping[str, Sequence[str]], deadline_s: float) -> None:
    """Return once each group of `groups` (a name and its processes' addresses) has a
    process answering SERVING; raise NotServingError naming the groups that still have
    none after `deadline_s`. One per group, not every process: a leader-only role beside
    a follower replica (`--colocate --replicas 3`) opens no port until its replica leads.
    A mesh just started by `oms up` takes some seconds (a shard replays its log)."""
    channels = {
        (name, address): service_channel(name, address)
        for name, addresses in groups.items()
        for address in addresses
    }
    stubs = {key: health_pb2_grpc.HealthStub(channel) for key, channel in channels.items()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    try:
        while True:
            answers = await asyncio.gather(*(serving(stub) for stub in stubs.values()))
            serving_groups = {name for (name, _), up in zip(stubs, answers, strict=True) if up}
            waiting = sorted(set(groups) - serving_groups)
            if not waiting:
                return
            if loop.time() >= deadline:
                raise NotServingError(f"not serving after {deadline_s:.0f} s: {', '.join(waiting)}")
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        for channel in channels.values():
            await channel.close()


async def report_readiness(addresses: Mapping[str, str]) -> None:
    """Run until cancelled; `addresses` maps a service name to host:port. The gateway
    is reached on its public port as a client would; the others as mesh peers."""
    channels = _channels(addresses)
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
                print(f"[mesh] ready; {READY_HINT}", flush=True)
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
