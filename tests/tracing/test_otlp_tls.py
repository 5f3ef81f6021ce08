"""Spans to an OTLP receiver over TLS (`OMS_OTLP_TLS=on`), from a real process.

The exporter checks the receiver by the mesh's authority and shows the service's own
certificate: a receiver that requires that certificate gets the span; a receiver
whose certificate another authority signed gets nothing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc

from services.transport.certificates import Identity, issue, mesh_identity, new_authority
from tests.otlp_receiver import OtlpReceiver
from tests.service_process import ROOT

# One process, one span, flushed by the provider's shutdown before the process exits.
EXPORT_ONE_SPAN = """
from opentelemetry import trace
from services.observability.tracing import configure_tracing
configure_tracing("tls-probe")
with trace.get_tracer("probe").start_as_current_span("probe-span"):
    pass
trace.get_tracer_provider().shutdown()
"""
EXPORT_TIMEOUT_S = 30.0


def _receiver_credentials(authority: Identity, mesh: Identity) -> grpc.ServerCredentials:
    """A receiver on 127.0.0.1 with a certificate from `authority`, requiring the
    exporter's certificate from the mesh's."""
    receiver = issue(authority, "otel-collector", hosts=("127.0.0.1",), server_only=True)
    return grpc.ssl_server_credentials(
        [(receiver.key_pem, receiver.certificate_pem)],
        root_certificates=mesh.certificate_pem,
        require_client_auth=True,
    )


def _exporter_environment(folder: Path, mesh: Identity) -> dict[str, str]:
    (folder / "ca.pem").write_bytes(mesh.certificate_pem)
    mesh_identity(mesh, "matcher-g1").write(folder / "exporter.pem", folder / "exporter.key")
    return {
        "OMS_OTLP_TLS": "on",
        "OMS_TLS_CA": str(folder / "ca.pem"),
        "OMS_TLS_CERT": str(folder / "exporter.pem"),
        "OMS_TLS_KEY": str(folder / "exporter.key"),
    }


async def _export_one_span(receiver: OtlpReceiver, environment: dict[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EXPORT_ONE_SPAN,
        cwd=ROOT,
        env={
            **{name: value for name, value in os.environ.items() if not name.startswith("OMS_")},
            **environment,
            "OMS_OTLP_ENDPOINT": receiver.endpoint,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    async with asyncio.timeout(EXPORT_TIMEOUT_S):
        return await process.wait()


async def test_spans_reach_a_receiver_the_mesh_authority_signed(tmp_path: Path) -> None:
    mesh = new_authority("test mesh authority")
    async with OtlpReceiver(_receiver_credentials(mesh, mesh)) as receiver:
        assert await _export_one_span(receiver, _exporter_environment(tmp_path, mesh)) == 0
        assert [span.name for span in receiver.spans] == ["probe-span"]
        assert receiver.spans[0].service == "tls-probe"


async def test_a_receiver_another_authority_signed_gets_nothing(tmp_path: Path) -> None:
    mesh = new_authority("test mesh authority")
    stranger = new_authority("another authority")
    async with OtlpReceiver(_receiver_credentials(stranger, mesh)) as receiver:
        await _export_one_span(receiver, _exporter_environment(tmp_path, mesh))
        assert receiver.spans == []
