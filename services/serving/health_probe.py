"""A plaintext port serving only `grpc.health.v1`, for probes that cannot present a
client certificate (Kubernetes' gRPC probes speak no TLS at all).

`OMS_HEALTH_LISTEN` (host:port) turns it on. It shares the service's own
`HealthServicer`, so it answers exactly what the mutual-TLS port would: SERVING,
NOT_SERVING while stopping, a follower's per-service NOT_SERVING. It serves
nothing else, so the mesh's calls stay behind the certificate check; what it
tells a stranger is whether the process is up.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.clients.channels import SERVER_OPTIONS
from services.settings import load_settings, setting

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class HealthProbeSettings:
    listen: str = setting(
        env="OMS_HEALTH_LISTEN",
        default="",
        help="host:port of a plaintext health-only port (Kubernetes probes); unset: none",
    )


_served_once: set[str] = set()  # probe addresses this process already serves


async def serve_health_probe(health: HealthServicer) -> grpc.aio.Server | None:
    """Start the probe port if it is configured; the caller stops the server it returns.

    Once per process: where several services share one (`oms shard --colocate`), the
    first to start (the shard) answers the probes, and the others get None."""
    address = load_settings(HealthProbeSettings).listen
    if not address or address in _served_once:
        return None
    _served_once.add(address)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"OMS_HEALTH_LISTEN={address}: cannot listen")
    await server.start()
    log.info("health_probe.serving", address=address)
    return server
