"""One gRPC server with health, status and a structured lifecycle, for services without a log.

`ServiceHost.run()` owns one TaskGroup: the server plus the service's own loops.
Health is SERVING once the server listens; stopping (SIGTERM/SIGINT) turns it
NOT_SERVING, stops accepting, drains for a grace period and cancels the loops.
A loop that fails stops the service with its error (crash-only: the supervisor
restarts it, and every consumer resumes from durable positions).

`oms.v1.Status/GetStatus` answers with the counters the service's `statistics`
callable returns, so tests and operators read the numbers the metrics read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.clients.channels import SERVER_OPTIONS
from services.observability.metrics import numbers_of, serve_metrics
from services.serving.channelz import register_channelz
from services.serving.health_probe import serve_health_probe
from services.serving.status_service import STATUS_SERVICE, StatusSource, register_status
from services.serving.stop_signals import on_stop_signal
from services.transport.tls import mesh_transport

log = structlog.get_logger(__name__)

ServicerRegistration = Callable[[grpc.aio.Server], None]
BackgroundLoop = Callable[[], Coroutine[Any, Any, None]]
# Binds a server to an address with its credentials; the port (0: could not bind).
Listener = Callable[[grpc.aio.Server, str], int]


@dataclass
class ServicePlan:
    """What a service brings: its name, gRPC servicers, loops and status counters."""

    name: str
    service_names: Sequence[str]
    register: ServicerRegistration
    status: StatusSource
    loops: list[BackgroundLoop] = field(default_factory=list)
    interceptors: Sequence[grpc.aio.ServerInterceptor] = ()


class ServiceHost:
    def __init__(
        self, listen_address: str, *, grace_s: float = 5.0, listener: Listener | None = None
    ) -> None:
        self.listen_address = listen_address
        # The mesh's mutual TLS unless told otherwise (the gateway's public port).
        self.listener = listener if listener is not None else mesh_transport().listen
        self.grace_s = grace_s
        self.health = HealthServicer()
        self.bound_port = 0
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        on_stop_signal(self.stop)

    async def run(self, plan: ServicePlan) -> None:
        server = grpc.aio.server(
            interceptors=tuple(plan.interceptors),
            options=SERVER_OPTIONS,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        plan.register(server)
        register_status(server, plan.name, plan.status)
        register_channelz(server)
        serve_metrics([(plan.name, numbers_of(plan.status))])
        self.bound_port = self.listener(server, self.listen_address)
        if self.bound_port == 0:
            raise OSError(f"cannot listen on {self.listen_address}")
        await server.start()
        probe = await serve_health_probe(self.health)
        names = ("", STATUS_SERVICE, *plan.service_names)
        for name in names:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("service.serving", service=plan.name, address=self.listen_address)
        self.ready.set()
        try:
            async with asyncio.TaskGroup() as group:
                loops = [group.create_task(loop(), name=loop.__qualname__) for loop in plan.loops]
                stop = group.create_task(self._stop.wait())
                await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
                for name in names:
                    await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                await server.stop(self.grace_s)
                for task in (stop, *loops):
                    task.cancel()
                for task in loops:
                    if task.done() and not task.cancelled() and task.exception() is None:
                        log.error("service.loop_returned", loop=task.get_name())
        finally:
            with contextlib.suppress(Exception):
                await server.stop(0)
            if probe is not None:
                with contextlib.suppress(Exception):
                    await probe.stop(0)
            log.info("service.stopped", service=plan.name)
