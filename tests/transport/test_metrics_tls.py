"""The scrape endpoint over HTTPS (`OMS_METRICS_TLS=on`), on a real matcher process.

It presents the service's mesh certificate and serves only a scraper that presents a
certificate from the mesh's authority: plain HTTP, a scraper without a certificate
or with another authority's get nothing, and a scraper checks the server's.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.infra.ports import LOOPBACK, free_port
from services.transport.certificates import MESH_SERVER_NAME, mesh_identity, new_authority
from tests.matcher_service.matcher_process import MatcherProcess
from tests.transport.test_mutual_tls import Pki

TIMEOUT_S = 5.0
REFUSED = (OSError, http.client.HTTPException)  # ssl.SSLError and resets are OSErrors


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Pki]]:
    pki = Pki(
        tmp_path_factory.mktemp("pki"),
        new_authority("test mesh authority"),
        new_authority("another authority"),
    )
    metrics = f"{LOOPBACK}:{free_port()}"
    environment = {
        **pki.files("matcher", mesh_identity(pki.authority, "matcher-g1")),
        "OMS_TLS": "off",  # the gRPC port has its own test (test_mutual_tls.py)
        "OMS_METRICS_LISTEN": metrics,
        "OMS_METRICS_TLS": "on",
    }
    with MatcherProcess(tmp_path_factory.mktemp("matcher") / "data", environment=environment):
        yield metrics, pki


def _context(pki: Pki, name: str = "", *, trusting: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(trusting or pki.folder / "ca.pem"))
    if name:
        context.load_cert_chain(pki.folder / f"{name}.pem", pki.folder / f"{name}.key")
    return context


def _scrape(address: str, context: ssl.SSLContext | None) -> bytes:
    """GET /metrics, over TLS when `context` is given: the server's certificate must name
    the mesh (`oms-mesh`), as a Prometheus `tls_config.server_name` would ask."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        if context is not None:
            raw = socket.create_connection((host, int(port)), TIMEOUT_S)
            connection.sock = context.wrap_socket(raw, server_hostname=MESH_SERVER_NAME)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise http.client.HTTPException(f"status {response.status}")
        return body
    finally:
        connection.close()


def test_a_mesh_scraper_reads_the_metrics_over_https(scraped: tuple[str, Pki]) -> None:
    address, pki = scraped
    pki.files("prometheus", mesh_identity(pki.authority, "prometheus"))
    assert b"oms_" in _scrape(address, _context(pki, "prometheus"))


def test_a_connection_that_says_nothing_does_not_stall_the_scrapes(
    scraped: tuple[str, Pki],
) -> None:
    address, pki = scraped
    host, _, port = address.rpartition(":")
    pki.files("prometheus", mesh_identity(pki.authority, "prometheus"))
    with socket.create_connection((host, int(port)), TIMEOUT_S):  # no ClientHello, ever
        started = time.monotonic()
        assert b"oms_" in _scrape(address, _context(pki, "prometheus"))
        assert time.monotonic() - started < TIMEOUT_S / 2  # not behind the silent one


def test_plain_http_and_scrapers_without_a_mesh_certificate_get_nothing(
    scraped: tuple[str, Pki],
) -> None:
    address, pki = scraped
    with pytest.raises(REFUSED):
        _scrape(address, None)
    with pytest.raises(REFUSED):
        _scrape(address, _context(pki))  # no client certificate
    pki.files("stranger", mesh_identity(pki.other_authority, "prometheus"))
    with pytest.raises(REFUSED):
        _scrape(address, _context(pki, "stranger"))  # another authority's
    other = pki.folder / "other-ca.pem"
    other.write_bytes(pki.other_authority.certificate_pem)
    pki.files("prometheus", mesh_identity(pki.authority, "prometheus"))
    with pytest.raises(ssl.SSLCertVerificationError):
        _scrape(address, _context(pki, "prometheus", trusting=other))  # the server is checked
