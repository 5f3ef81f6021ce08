"""A real OTLP/gRPC trace receiver for tests: what Jaeger's collector would receive.

It serves `opentelemetry.proto.collector.trace.v1.TraceService/Export` on a free
loopback port and keeps every span with the `service.name` of its resource.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.clients.channels import SERVER_OPTIONS
from services.infra.ports import LOOPBACK, free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, str]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: list[ReceivedSpan]) -> None:
        self.spans = spans

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = ""
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    service = attribute.value.string_value
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={
                                a.key: str(a.value.string_value or a.value.int_value)
                                for a in span.attributes
                            },
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self.port = free_port()
        self.spans: list[ReceivedSpan] = []
        self.credentials = credentials  # None: plaintext
        self._server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    async def __aenter__(self) -> OtlpReceiver:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        register = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
        register(_TraceService(self.spans), server)  # type: ignore[no-untyped-call]
        if self.credentials is None:
            server.add_insecure_port(self.endpoint)
        else:
            server.add_secure_port(self.endpoint, self.credentials)
        await server.start()
        self._server = server
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def wait_trace(
        self, trace_id: str, services: set[str], *, timeout_s: float = 20.0
    ) -> list[ReceivedSpan]:
        """Poll until spans of `trace_id` from every one of `services` arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = [span for span in self.spans if span.trace_id == trace_id]
            if services <= {span.service for span in spans}:
                return spans
            if time.monotonic() > deadline:
                seen = sorted({(span.service, span.name) for span in spans})
                raise AssertionError(f"trace {trace_id}: wanted {sorted(services)}, got {seen}")
            await asyncio.sleep(0.05)
