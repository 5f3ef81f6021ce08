"""The TLS credentials of every gRPC link, from `OMS_TLS*` settings.

Between the mesh's services TLS is mutual: each service holds a certificate from
the mesh's authority (`OMS_TLS_CERT`, `OMS_TLS_KEY`), its servers require one from
every caller, and its channels check the server's against the same authority
(`OMS_TLS_CA`). A peer without such a certificate (plaintext, another authority's,
an expired one) fails the handshake: no call of it reaches a handler.

The gateway's public port is server-authenticated only (API keys authenticate the
callers): its certificate is the public one (`OMS_GATEWAY_TLS_CERT`,
`OMS_GATEWAY_TLS_KEY`), and clients check it against `OMS_CLIENT_TLS_CA` (the
system's roots when unset) and the host name they dialled.

TLS is on unless `OMS_TLS=off` (development and the test suite): on, a service
without its files does not start. A server given its certificate as files reads them
again when they change (`certificate_reload.py`): a renewed certificate serves the
next connection. Outgoing channels keep the certificate they were made with, so a
process must restart (a rolling restart in Kubernetes) before the certificate it
started with expires; cert-manager renews at two thirds of a certificate's life.
etcd and PostgreSQL links are not covered here (their own TLS settings).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.settings import SettingsError, load_settings, setting
from services.transport.certificate_reload import CertificateFiles
from services.transport.certificates import MESH_SERVER_NAME, Identity

ChannelOptions = Sequence[tuple[str, int | str]]


@dataclass(frozen=True)
class TransportSettings:
    tls: bool = setting(
        env="OMS_TLS",
        default=True,
        help="TLS on every gRPC link (mutual inside the mesh); off for development only",
    )
    authority_file: Path | None = setting(
        env="OMS_TLS_CA", default=None, help="the mesh's authority, PEM: peers are checked by it"
    )
    certificate_file: Path | None = setting(
        env="OMS_TLS_CERT", default=None, help="this service's certificate from that authority"
    )
    key_file: Path | None = setting(env="OMS_TLS_KEY", default=None, help="its private key")
    gateway_certificate_file: Path | None = setting(
        env="OMS_GATEWAY_TLS_CERT", default=None, help="the gateway's public certificate, PEM"
    )
    gateway_key_file: Path | None = setting(
        env="OMS_GATEWAY_TLS_KEY", default=None, help="its private key"
    )
    client_authority_file: Path | None = setting(
        env="OMS_CLIENT_TLS_CA",
        default=None,
        help="what a client checks the gateway's certificate by (unset: the system's roots)",
    )


def _required(value: Path | None, variable: str) -> bytes:
    if value is None:
        raise SettingsError(f"{variable} is not set (TLS is on: set it, or OMS_TLS=off)")
    try:
        return value.read_bytes()
    except OSError as error:
        raise SettingsError(f"{variable}={value}: {error.strerror}") from error


@dataclass(frozen=True)
class MeshTransport:
    """How this process's mesh servers listen and its channels to mesh services connect."""

    authority_pem: bytes | None = None  # None: plaintext
    identity: Identity | None = None
    # The same, as files: a server then reads them again when they change.
    files: CertificateFiles | None = None

    @property
    def tls(self) -> bool:
        return self.authority_pem is not None

    @classmethod
    def plaintext(cls) -> MeshTransport:
        return cls()

    @classmethod
    def mutual(cls, authority_pem: bytes, identity: Identity) -> MeshTransport:
        return cls(authority_pem, identity)

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> MeshTransport:
        if not settings.tls:
            return cls.plaintext()
        authority = _required(settings.authority_file, "OMS_TLS_CA")
        identity = Identity(
            _required(settings.certificate_file, "OMS_TLS_CERT"),
            _required(settings.key_file, "OMS_TLS_KEY"),
        )
        assert settings.certificate_file and settings.key_file and settings.authority_file
        files = CertificateFiles(
            settings.certificate_file, settings.key_file, settings.authority_file
        )
        return cls(authority, identity, files)

    def server_credentials(self) -> grpc.ServerCredentials:
        assert self.authority_pem is not None and self.identity is not None
        if self.files is not None:
            return self.files.server_credentials(require_client_auth=True)
        return grpc.ssl_server_credentials(
            [(self.identity.key_pem, self.identity.certificate_pem)],
            root_certificates=self.authority_pem,
            require_client_auth=True,
        )

    def listen(self, server: grpc.aio.Server, address: str) -> int:
        """Bind `server` to `address`; the port (0: it could not bind)."""
        if not self.tls:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self.server_credentials()))

    def _channel_credentials(self) -> grpc.ChannelCredentials:
        assert self.authority_pem is not None and self.identity is not None
        return grpc.ssl_channel_credentials(
            root_certificates=self.authority_pem,
            private_key=self.identity.key_pem,
            certificate_chain=self.identity.certificate_pem,
        )

    def _options(self, options: ChannelOptions) -> list[tuple[str, int | str]]:
        return [*options, ("grpc.ssl_target_name_override", MESH_SERVER_NAME)]

    def channel(self, address: str, options: ChannelOptions) -> grpc.aio.Channel:
        if not self.tls:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(
            address, self._channel_credentials(), options=self._options(options)
        )

    def blocking_channel(self, address: str, options: ChannelOptions) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(address, options=options)
        return grpc.secure_channel(
            address, self._channel_credentials(), options=self._options(options)
        )


@dataclass(frozen=True)
class PublicListener:
    """The gateway's public port: TLS with its public certificate, no client certificate."""

    identity: Identity | None = None  # None: plaintext
    files: CertificateFiles | None = None  # read again when they change

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> PublicListener:
        if not settings.tls:
            return cls()
        identity = Identity(
            _required(settings.gateway_certificate_file, "OMS_GATEWAY_TLS_CERT"),
            _required(settings.gateway_key_file, "OMS_GATEWAY_TLS_KEY"),
        )
        assert settings.gateway_certificate_file and settings.gateway_key_file
        return cls(
            identity,
            CertificateFiles(settings.gateway_certificate_file, settings.gateway_key_file),
        )

    def listen(self, server: grpc.aio.Server, address: str) -> int:
        if self.identity is None:
            return int(server.add_insecure_port(address))
        if self.files is not None:
            credentials = self.files.server_credentials(require_client_auth=False)
        else:
            credentials = grpc.ssl_server_credentials(
                [(self.identity.key_pem, self.identity.certificate_pem)]
            )
        return int(server.add_secure_port(address, credentials))


@dataclass(frozen=True)
class ClientTransport:
    """How a client reaches the gateway: TLS checked by an authority and the host name."""

    tls: bool = True
    authority_pem: bytes | None = None  # None with TLS: the system's roots

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> ClientTransport:
        if not settings.tls:
            return cls(tls=False)
        authority = settings.client_authority_file
        return cls(authority_pem=authority.read_bytes() if authority is not None else None)

    def channel(self, address: str, options: ChannelOptions) -> grpc.aio.Channel:
        if not self.tls:
            return grpc.aio.insecure_channel(address, options=options)
        credentials = grpc.ssl_channel_credentials(root_certificates=self.authority_pem)
        return grpc.aio.secure_channel(address, credentials, options=options)

    def blocking_channel(self, address: str, options: ChannelOptions) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(address, options=options)
        credentials = grpc.ssl_channel_credentials(root_certificates=self.authority_pem)
        return grpc.secure_channel(address, credentials, options=options)


@dataclass
class _Chosen:
    """What a tool chose for this process (from `mesh.json`, or a test's), else None."""

    mesh: MeshTransport | None = None
    client: ClientTransport | None = None


_chosen = _Chosen()


@functools.cache
def _mesh_from_environment() -> MeshTransport:
    return MeshTransport.from_settings(load_settings(TransportSettings))


@functools.cache
def _client_from_environment() -> ClientTransport:
    return ClientTransport.from_settings(load_settings(TransportSettings))


def mesh_transport() -> MeshTransport:
    """This process's mesh transport: what `use_transports` chose, else the settings'."""
    return _chosen.mesh if _chosen.mesh is not None else _mesh_from_environment()


def client_transport() -> ClientTransport:
    """How this process reaches the gateway: what `use_transports` chose, else the
    settings'."""
    return _chosen.client if _chosen.client is not None else _client_from_environment()


def use_transports(mesh: MeshTransport | None, client: ClientTransport | None) -> None:
    """Choose the process's transports (a tool reading `mesh.json`, a test); None goes
    back to the settings'. One identity per process, chosen at its start."""
    _chosen.mesh, _chosen.client = mesh, client
