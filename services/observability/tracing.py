"""OpenTelemetry traces of sampled orders, exported over OTLP (Jaeger reads OTLP).

An order's trace runs gateway -> shard -> bridge -> matcher -> back. Between
processes the context travels as a W3C `traceparent`: in gRPC metadata where a
call belongs to one order (the gateway's unary calls, the bridge's traced
matcher batches), and inside the logged command where many orders share one
stream (`PlaceOrder.trace_parent`, carried by the shard's log to
`SubmitToME.order.trace_parent`). Batched hot paths never start spans for
unsampled orders: only the gateway samples, the others follow its decision.

With no `OMS_OTLP_ENDPOINT` nothing is exported and the tracer is the no-op one.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.settings import SettingsError, load_settings, setting
from services.transport.tls import TransportSettings

TRACEPARENT = "traceparent"
_propagator = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class TracingSettings:
    otlp_endpoint: str = setting(
        env="OMS_OTLP_ENDPOINT", default="", help="host:port of an OTLP/gRPC receiver"
    )
    otlp_tls: bool = setting(
        env="OMS_OTLP_TLS",
        default=False,
        help="TLS to the receiver: checked by OMS_TLS_CA; OMS_TLS_CERT/KEY presented if set",
    )
    sample_per_million: int = setting(
        env="OMS_TRACE_SAMPLE_PER_MILLION",
        default=1_000_000,
        help="orders the gateway samples, per million (others follow its decision)",
    )


def configure_tracing(service_name: str) -> TracingSettings:
    """Install the exporting tracer provider once at start, if an endpoint is set."""
    settings = load_settings(TracingSettings)
    if not settings.otlp_endpoint:
        return settings
    ratio = min(max(settings.sample_per_million, 0), 1_000_000) / 1_000_000
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(ratio)),
    )
    if settings.otlp_tls:
        exporter = OTLPSpanExporter(
            endpoint=settings.otlp_endpoint, insecure=False, credentials=_receiver_credentials()
        )
    else:
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)
    _installed.append(provider)
    return settings


_installed: list[TracerProvider] = []


def _receiver_credentials() -> grpc.ChannelCredentials:
    """The receiver checked by the mesh's authority; this service's certificate shown."""
    files = load_settings(TransportSettings)
    if files.authority_file is None:
        raise SettingsError("OMS_OTLP_TLS=on needs OMS_TLS_CA (what the receiver is checked by)")
    shown = (files.key_file, files.certificate_file)
    key, chain = (path.read_bytes() if path is not None else None for path in shown)
    return grpc.ssl_channel_credentials(
        root_certificates=files.authority_file.read_bytes(),
        private_key=key,
        certificate_chain=chain,
    )


def tracing_enabled() -> bool:
    """True once an exporter is installed: hot paths skip span work entirely otherwise."""
    return bool(_installed)


def tracer(name: str) -> Tracer:
    return trace.get_tracer(name)


def trace_parent_of(span: Span) -> str:
    """The W3C traceparent of a sampled span, "" otherwise (nothing to carry)."""
    context = span.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def context_of(trace_parent: str) -> Context:
    """The parent context a traceparent names (an empty context if it is malformed)."""
    return _propagator.extract({TRACEPARENT: trace_parent})


def context_from_metadata(metadata: Sequence[tuple[str, str | bytes]] | None) -> Context | None:
    """The parent context of a gRPC call's `traceparent` metadata, if it has one."""
    for key, value in metadata or ():
        if key == TRACEPARENT:
            text = value.decode() if isinstance(value, bytes) else value
            return context_of(text)
    return None


def metadata_for(span: Span) -> tuple[tuple[str, str], ...]:
    parent = trace_parent_of(span)
    return ((TRACEPARENT, parent),) if parent else ()
