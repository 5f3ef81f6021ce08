"""The development PKI `oms up` keeps under its state folder: `state_dir/tls/`.

One authority (`ca.pem`, `ca.key`, made once per folder) issues a certificate per
service (`<service>.pem`, `<service>.key`), one for the local tools (`operator`,
what `oms demo`, `oms bench` and the tests present to the mesh), and the gateway's
public one (`gateway-public`, for localhost and 127.0.0.1). The embedded etcd gets
its own (`etcd-server`, for localhost, 127.0.0.1 and ::1), its health probes one
(`etcd-probe`, a name etcd knows no user by), and etcd's administrator one
(`etcd-root`, common name `root`: what sets the mesh's etcd users and role up, see
`services/coordination/etcd_access.py`). A certificate is issued
again when it is missing, expires within 30 days or is not the authority's; keys
are 0600 and the folder 0700. Nothing here is meant for production: there the
files come from the deployment's PKI (`docs/operations/tls.md`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from services.infra.embedded_etcd import EtcdServerTls
from services.infra.ports import LOOPBACK
from services.transport.certificates import (
    Identity,
    issue,
    mesh_identity,
    needs_renewal,
    new_authority,
)
from services.transport.tls import ClientTransport, MeshTransport, use_transports

FOLDER = "tls"
AUTHORITY = "ca"
OPERATOR = "operator"
GATEWAY_PUBLIC = "gateway-public"
PUBLIC_HOSTS = ("localhost", LOOPBACK)
ETCD_SERVER = "etcd-server"
ETCD_HOSTS = ("localhost", LOOPBACK, "::1")
ETCD_PROBE = "etcd-probe"
ETCD_ROOT = "etcd-root"
ETCD_ROOT_USER = "root"  # etcd names a certificate's holder by its common name


@dataclass(frozen=True)
class DevelopmentTls:
    folder: Path

    @classmethod
    def under(cls, state_dir: Path) -> DevelopmentTls:
        return cls(state_dir / FOLDER)

    def _paths(self, name: str) -> tuple[Path, Path]:
        return self.folder / f"{name}.pem", self.folder / f"{name}.key"

    @property
    def authority_path(self) -> Path:
        return self._paths(AUTHORITY)[0]

    def authority(self) -> Identity:
        certificate_path, key_path = self._paths(AUTHORITY)
        if certificate_path.exists() and key_path.exists():
            return Identity.read(certificate_path, key_path)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A common name holds at most 64 characters: a random tag tells folders apart.
        made = new_authority(f"OMS development authority {secrets.token_hex(4)}")
        made.write(certificate_path, key_path)
        return made

    def _kept(
        self,
        name: str,
        hosts: tuple[str, ...] = (),
        *,
        common_name: str | None = None,
        client_too: bool = False,
    ) -> tuple[Path, Path]:
        authority = self.authority()
        certificate_path, key_path = self._paths(name)
        if (
            certificate_path.exists()
            and key_path.exists()
            and not needs_renewal(certificate_path.read_bytes(), authority.certificate_pem)
        ):
            return certificate_path, key_path
        if hosts or common_name is not None:
            made = issue(authority, common_name or name, hosts=hosts, server_only=not client_too)
        else:
            made = mesh_identity(authority, name)
        made.write(certificate_path, key_path)
        return certificate_path, key_path

    def service_environment(self, service: str) -> dict[str, str]:
        """The `OMS_TLS*` settings of one mesh service, its certificate issued if need be."""
        certificate_path, key_path = self._kept(service)
        return {
            "OMS_TLS": "on",
            "OMS_TLS_CA": str(self.authority_path),
            "OMS_TLS_CERT": str(certificate_path),
            "OMS_TLS_KEY": str(key_path),
        }

    def gateway_environment(self) -> dict[str, str]:
        """The gateway's public certificate, besides its mesh one."""
        certificate_path, key_path = self._kept(GATEWAY_PUBLIC, PUBLIC_HOSTS)
        return {"OMS_GATEWAY_TLS_CERT": str(certificate_path), "OMS_GATEWAY_TLS_KEY": str(key_path)}

    def etcd_server_tls(self) -> EtcdServerTls:
        """The embedded etcd's client port over mutual TLS from this authority. etcd's
        own certificate is for clients too: its JSON gateway calls its gRPC port with it."""
        certificate_path, key_path = self._kept(ETCD_SERVER, ETCD_HOSTS, client_too=True)
        probe_certificate, probe_key = self._kept(
            ETCD_PROBE, common_name=ETCD_PROBE, client_too=True
        )
        return EtcdServerTls(
            self.authority_path, certificate_path, key_path, probe_certificate, probe_key
        )

    def etcd_root_identity(self) -> Identity:
        """etcd's administrator (`root`), for setting the mesh's users and role up."""
        certificate_path, key_path = self._kept(
            ETCD_ROOT, common_name=ETCD_ROOT_USER, client_too=True
        )
        return Identity.read(certificate_path, key_path)

    def client_environment(self) -> dict[str, str]:
        """What a client of the gateway (`oms client` from a shell) checks it by."""
        return {"OMS_TLS": "on", "OMS_CLIENT_TLS_CA": str(self.authority_path)}

    def operator_environment(self) -> dict[str, str]:
        """What `omsctl` from a shell presents to the mesh's services."""
        return self.service_environment(OPERATOR)

    def operator_transport(self) -> MeshTransport:
        """The local tools' own mesh identity."""
        certificate_path, key_path = self._kept(OPERATOR)
        return MeshTransport.mutual(
            self.authority_path.read_bytes(), Identity.read(certificate_path, key_path)
        )

    def client_transport(self) -> ClientTransport:
        return ClientTransport(authority_pem=self.authority_path.read_bytes())

    def adopt(self) -> None:
        """This process (a local tool) reaches the mesh as the operator, and the gateway
        checked by the development authority."""
        use_transports(self.operator_transport(), self.client_transport())


def adopt_mesh_transports(state_dir: Path, *, tls: bool) -> None:
    """What a local tool does once it read `mesh.json`: the mesh's transports."""
    if tls:
        DevelopmentTls.under(state_dir).adopt()
    else:
        use_transports(MeshTransport.plaintext(), ClientTransport(tls=False))
