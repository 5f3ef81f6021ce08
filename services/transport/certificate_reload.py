"""A server's certificate read again from its files when they change, without a restart.

gRPC asks `dynamic_ssl_server_credentials`' fetcher for a new certificate
configuration at each new connection's handshake; this fetcher answers from the
files on disk when their modification times changed, so a renewed certificate
(cert-manager rewrites the Secret, Kubernetes swaps the mounted files at once)
serves the next connection, while connections already open keep theirs. A pair that
does not match (a certificate written before its key) or does not parse is not
taken: the server keeps the configuration it has, and looks again at the next
handshake.

Outgoing channels are not reloaded: they keep the certificate they were made with
(see `tls.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = structlog.get_logger(__name__)


def _pair_problem(certificate_pem: bytes, key_pem: bytes) -> str:
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as error:
        return f"does not parse: {error}"
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if certificate.public_key().public_bytes(*public) != key.public_key().public_bytes(*public):
        return "the key is not the certificate's"
    return ""


class CertificateFiles:
    """A server certificate, its key and (for mutual TLS) the authority, as files."""

    def __init__(self, certificate: Path, key: Path, authority: Path | None = None) -> None:
        self.certificate = certificate
        self.key = key
        self.authority = authority
        self.reloads = 0
        self._lock = threading.Lock()  # gRPC calls the fetcher from its own threads
        self._stamp = self._modified()

    @property
    def _paths(self) -> Sequence[Path]:
        return [self.certificate, self.key, *([self.authority] if self.authority else [])]

    def _modified(self) -> tuple[int, ...]:
        try:
            return tuple(path.stat().st_mtime_ns for path in self._paths)
        except OSError:
            return ()

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """The files as they are now (at start: they must be right)."""
        certificate, key = self.certificate.read_bytes(), self.key.read_bytes()
        problem = _pair_problem(certificate, key)
        if problem:
            raise ValueError(f"{self.certificate}: {problem}")
        authority = self.authority.read_bytes() if self.authority else None
        return grpc.ssl_server_certificate_configuration(
            [(key, certificate)], root_certificates=authority
        )

    def changed(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration if the files changed and hold a usable pair, else None."""
        stamp = self._modified()
        if stamp == self._stamp or not stamp:
            return None
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                configuration = self.configuration()
            except (OSError, ValueError) as error:
                log.warning(
                    "tls.certificate_not_reloaded", file=str(self.certificate), error=str(error)
                )
                return None
            self._stamp = stamp
            self.reloads += 1
        log.info("tls.certificate_reloaded", file=str(self.certificate), reloads=self.reloads)
        return configuration

    def server_credentials(self, *, require_client_auth: bool) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(), self.changed, require_client_authentication=require_client_auth
        )
