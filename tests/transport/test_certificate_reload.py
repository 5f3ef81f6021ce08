"""A renewed certificate serves the next connection, without a restart.

A real matcher with mutual TLS from files: its certificate files are replaced (as
Kubernetes swaps a Secret's files, all at once); the next handshake presents the new
certificate and calls go on; a pair that does not match is not taken.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2

from services.transport.certificates import Identity, mesh_identity, new_authority
from tests.matcher_service.matcher_process import MatcherProcess
from tests.transport.test_mutual_tls import Pki

TIMEOUT_S = 5.0
WAIT_S = 10.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[MatcherProcess, Pki]]:
    pki = Pki(tmp_path / "pki", new_authority("test mesh authority"), new_authority("other"))
    pki.folder.mkdir()
    process = MatcherProcess(
        tmp_path / "matcher",
        environment=pki.files("matcher", mesh_identity(pki.authority, "matcher-g1")),
    )
    process.transport = pki.transport(mesh_identity(pki.authority, "operator"))
    with process:
        yield process, pki


def _replace(pki: Pki, name: str, identity: Identity, *, key_of: Identity | None = None) -> None:
    """Both files swapped in at once (written aside, then renamed over)."""
    for suffix, pem in (("pem", identity.certificate_pem), ("key", (key_of or identity).key_pem)):
        aside = pki.folder / f".{name}.{suffix}.new"
        aside.write_bytes(pem)
        os.replace(aside, pki.folder / f"{name}.{suffix}")


def _served_serial(address: str, pki: Pki) -> int:
    """The serial of the certificate the server presents to a new connection."""
    client = mesh_identity(pki.authority, "operator")
    client.write(pki.folder / "operator.pem", pki.folder / "operator.key")
    context = ssl.create_default_context(cafile=str(pki.folder / "ca.pem"))
    context.check_hostname = False  # mesh certificates name the mesh, not an address
    context.load_cert_chain(pki.folder / "operator.pem", pki.folder / "operator.key")
    host, _, port = address.rpartition(":")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), TIMEOUT_S) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _serial(identity: Identity) -> int:
    return identity.certificate().serial_number


def _eventually_serial(address: str, pki: Pki, serial: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (seen := _served_serial(address, pki)) != serial:
        assert time.monotonic() < deadline, f"still serving {seen}, not {serial}"
        time.sleep(0.05)


def test_a_renewed_certificate_serves_the_next_connection(
    served: tuple[MatcherProcess, Pki],
) -> None:
    process, pki = served
    renewed = mesh_identity(pki.authority, "matcher-g1")
    _replace(pki, "matcher", renewed)
    _eventually_serial(process.address, pki, _serial(renewed))
    # A new channel (a new connection) handshakes with the renewed certificate.
    assert process.health() == health_pb2.HealthCheckResponse.SERVING


def test_a_pair_that_does_not_match_is_not_taken(served: tuple[MatcherProcess, Pki]) -> None:
    process, pki = served
    before = _served_serial(process.address, pki)
    first, second = (mesh_identity(pki.authority, "matcher-g1") for _ in range(2))
    _replace(pki, "matcher", first, key_of=second)  # a certificate with another's key
    for _ in range(3):
        assert _served_serial(process.address, pki) == before
    _replace(pki, "matcher", second)  # now right
    _eventually_serial(process.address, pki, _serial(second))
