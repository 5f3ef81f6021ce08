"""A certificate authority and the certificates it issues, as PEM (the `cryptography` package).

`oms up` makes a development authority under its state folder and one certificate
per service from it (`development_tls`); `oms tls` issues the same files for a
deployment that has no PKI of its own (production should use its own: cert-manager,
Vault). Keys are ECDSA P-256: a handshake costs a fraction of an RSA-2048 one.

Every mesh certificate names `MESH_SERVER_NAME` among its DNS names besides its own,
and the mesh's channels check that name (`grpc.ssl_target_name_override`): the
mesh's services find each other by addresses that change with every failover (a
group's leader advertises its own), so what a peer proves is membership of the
mesh, a certificate chained to the mesh's authority, not one host name.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MESH_SERVER_NAME = "oms-mesh"
AUTHORITY_DAYS = 3650
CERTIFICATE_DAYS = 365
# Issued again when less than this is left (`oms up` on an old state folder).
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Identity:
    """A certificate and its private key, PEM."""

    certificate_pem: bytes
    key_pem: bytes

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.certificate_pem)

    def write(self, certificate_path: Path, key_path: Path) -> None:
        certificate_path.parent.mkdir(parents=True, exist_ok=True)
        certificate_path.write_bytes(self.certificate_pem)
        # The key is written 0600 from its first byte, never readable by others.
        descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as key_file:
            key_file.write(self.key_pem)

    @classmethod
    def read(cls, certificate_path: Path, key_path: Path) -> Identity:
        return cls(certificate_path.read_bytes(), key_path.read_bytes())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key, pem


def new_authority(common_name: str, *, days: int = AUTHORITY_DAYS) -> Identity:
    """A self-signed authority that may sign leaf certificates only (path length 0)."""
    key, key_pem = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Identity(certificate.public_bytes(serialization.Encoding.PEM), key_pem)


def issue(
    authority: Identity,
    common_name: str,
    *,
    hosts: Sequence[str] = (),
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    server_only: bool = False,
) -> Identity:
    """A leaf certificate naming `hosts` (DNS names or IP addresses) as its subject's
    alternative names: for both ends of a TLS link (server and client), or with
    `server_only` for a server alone (the gateway's public port: its holder is no
    client of the mesh)."""
    authority_key = serialization.load_pem_private_key(authority.key_pem, password=None)
    if not isinstance(authority_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the authority's key is not an EC key this module made")
    authority_certificate = authority.certificate()
    key, key_pem = _key()
    now = _now()
    start = not_before if not_before is not None else now - datetime.timedelta(minutes=5)
    end = not_after if not_after is not None else now + datetime.timedelta(days=CERTIFICATE_DAYS)
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # once each, in the order given
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(authority_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH]
                if server_only
                else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(authority_key, hashes.SHA256())
    return Identity(certificate.public_bytes(serialization.Encoding.PEM), key_pem)


def mesh_identity(
    authority: Identity,
    service: str,
    *,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> Identity:
    """A mesh service's certificate: its own name and the mesh's (see the module's note)."""
    return issue(
        authority,
        service,
        hosts=(service, MESH_SERVER_NAME),
        not_before=not_before,
        not_after=not_after,
    )


def needs_renewal(certificate_pem: bytes, authority_pem: bytes) -> bool:
    """Whether a stored certificate expires soon or was not issued by this authority."""
    certificate = x509.load_pem_x509_certificate(certificate_pem)
    authority = x509.load_pem_x509_certificate(authority_pem)
    if certificate.issuer != authority.subject:
        return True
    try:
        certificate.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        return True
    return certificate.not_valid_after_utc - _now() < RENEW_BEFORE
