"""`oms.v1.Status/GetStatus`: one read-only call answering with a service's counters.

Every host registers it the same way (the stateless services' `ServiceHost`, the
replicas' `ReplicatedHost`), so tests and operators read the numbers the metrics read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from protos.oms.v1 import status_pb2

STATUS_SERVICE = "oms.v1.Status"
StatusSource = Callable[[], tuple[Mapping[str, int], Mapping[str, str]]]


def register_status(server: grpc.aio.Server, name: str, status: StatusSource) -> None:
    """Serve `status` as `oms.v1.Status`; every report also says how long the service has
    served (`uptime_s`), which `oms status` shows and a restart resets."""
    started = time.monotonic()

    async def get_status(
        request: status_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> status_pb2.StatusReport:
        counters, info = status()
        report = status_pb2.StatusReport(service=name)
        for key, value in counters.items():
            report.counters[key] = value
        report.counters["uptime_s"] = int(time.monotonic() - started)
        for key, text in info.items():
            report.info[key] = text
        return report

    handler = grpc.unary_unary_rpc_method_handler(
        get_status,
        request_deserializer=status_pb2.StatusRequest.FromString,
        response_serializer=status_pb2.StatusReport.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(STATUS_SERVICE, {"GetStatus": handler}),)
    )
