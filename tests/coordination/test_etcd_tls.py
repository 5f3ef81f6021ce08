"""etcd over mutual TLS with its auth by certificate name, against a real etcd of the
test's own: a mesh's services reach their own keys and nothing else, a certificate
etcd knows no user by is refused, and so are plaintext and another authority's
certificates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.coordination.errors import CoordinationDenied, CoordinationUnavailable
from services.coordination.etcd_access import grant_mesh_access, mesh_role
from services.coordination.etcd_channel import PLAINTEXT, EtcdCredentials, credentials_of
from services.coordination.etcd_session import BlockingLeaseRenewer, EtcdSession, prefix_end
from services.coordination.group_keys import mesh_prefix
from services.infra.embedded_etcd import EmbeddedEtcd
from services.transport.certificates import Identity, mesh_identity, new_authority
from services.transport.development import DevelopmentTls
from services.transport.tls import ClientTransport, MeshTransport, use_transports

pytestmark = [pytest.mark.timeout(90)]
MESH = "alpha"
OTHER_MESH = "beta"
SERVICES = ("shard-s1", "persister-s1", "operator")
ROOT = Path(__file__).resolve().parents[2]


class TlsEtcd:
    """An etcd whose client port is mutual TLS from a development authority, with the
    mesh `alpha`'s users and role set up and auth on."""

    def __init__(self, folder: Path) -> None:
        self.pki = DevelopmentTls(folder / "tls")
        self.server = EmbeddedEtcd(
            folder / "etcd", unsafe_no_fsync=True, tls=self.pki.etcd_server_tls()
        )
        self.authority_pem = self.pki.authority().certificate_pem

    @property
    def endpoint(self) -> str:
        return self.server.client_url  # https://127.0.0.1:port

    def credentials(self, identity: Identity) -> EtcdCredentials:
        return credentials_of(self.authority_pem, identity)

    def service(self, name: str) -> EtcdCredentials:
        return self.credentials(mesh_identity(self.pki.authority(), name))

    def root(self) -> EtcdCredentials:
        return self.credentials(self.pki.etcd_root_identity())

    def session(self, credentials: EtcdCredentials, *, timeout_s: float = 5.0) -> EtcdSession:
        return EtcdSession((self.endpoint,), credentials=credentials, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsEtcd]:
    made = TlsEtcd(tmp_path_factory.mktemp("etcd-tls"))
    made.server.start()
    try:

        async def set_up() -> None:
            async with made.session(made.root()) as root:
                report = await grant_mesh_access(root, MESH, SERVICES)
            assert report.auth_enabled_now and set(SERVICES) <= set(report.users_added)

        asyncio.run(set_up())
        yield made
    finally:
        made.server.stop()


@contextlib.asynccontextmanager
async def _as(tls_etcd: TlsEtcd, name: str) -> AsyncIterator[EtcdSession]:
    async with tls_etcd.session(tls_etcd.service(name)) as session:
        yield session


async def test_a_service_reads_writes_watches_and_leases_its_meshs_keys(
    tls_etcd: TlsEtcd,
) -> None:
    own = mesh_prefix(MESH)
    async with _as(tls_etcd, "shard-s1") as session:
        lease = await session.grant_lease(10)
        created, _ = await session.create(own + b"shard/s1/leader", b"r1", lease=lease)
        assert created
        start = session.revision
        await session.put(own + b"routing", b"epoch 1")
        events = session.watch(own, prefix_end(own), from_revision=start)
        try:
            async with asyncio.timeout(10):
                first = await anext(events)
        finally:
            await events.aclose()
        assert first.entry.key in (own + b"shard/s1/leader", own + b"routing")
        assert [entry.key for entry in await session.range(own, prefix_end(own))] == [
            own + b"routing",
            own + b"shard/s1/leader",
        ]
        assert await session.keep_alive(lease) > 0
        await session.compact(session.revision)  # no key permission needed
        assert (await session.storage()).revision >= session.revision
        assert await session.members()
        await session.revoke_lease(lease)
        assert await session.get(own + b"shard/s1/leader") is None


def test_the_blocking_lease_renewer_renews_over_tls(tls_etcd: TlsEtcd) -> None:
    async def grant() -> int:
        async with _as(tls_etcd, "persister-s1") as session:
            return await session.grant_lease(10)

    lease = asyncio.run(grant())
    renewer = BlockingLeaseRenewer(
        (tls_etcd.endpoint,), timeout_s=5.0, credentials=tls_etcd.service("persister-s1")
    )
    try:
        assert renewer.keep_alive(lease) > 0
    finally:
        renewer.close()


async def test_a_service_is_refused_another_meshs_keys_and_keys_outside_any_mesh(
    tls_etcd: TlsEtcd,
) -> None:
    async with _as(tls_etcd, "shard-s1") as session:
        for key in (mesh_prefix(OTHER_MESH) + b"routing", b"/oms/v1/alphabet/routing", b"/x"):
            with pytest.raises(CoordinationDenied, match="permission denied"):
                await session.put(key, b"mine now")
            with pytest.raises(CoordinationDenied):
                await session.get(key)
        other = mesh_prefix(OTHER_MESH)
        with pytest.raises(CoordinationDenied):
            async for _ in session.watch(other, prefix_end(other), from_revision=1):
                pytest.fail("a watch over another mesh's keys delivered an event")


async def test_a_certificate_of_the_authority_that_names_no_user_is_refused(
    tls_etcd: TlsEtcd,
) -> None:
    async with _as(tls_etcd, "stranger") as session:
        with pytest.raises(CoordinationDenied):
            await session.get(mesh_prefix(MESH) + b"routing")


async def test_plaintext_and_another_authoritys_certificate_never_reach_etcd(
    tls_etcd: TlsEtcd,
) -> None:
    foreign = new_authority("another authority")
    outsider = credentials_of(foreign.certificate_pem, mesh_identity(foreign, "shard-s1"))
    # The same name, signed by another authority, and checking etcd by that authority.
    impostor = EtcdCredentials(
        tls_etcd.authority_pem,
        mesh_identity(foreign, "shard-s1").certificate_pem,
        mesh_identity(foreign, "shard-s1").key_pem,
    )
    for credentials in (PLAINTEXT, outsider, impostor):
        async with tls_etcd.session(credentials, timeout_s=2.0) as session:
            with pytest.raises(CoordinationUnavailable):
                await session.get(mesh_prefix(MESH) + b"routing")


async def test_setting_access_up_again_changes_nothing_but_what_is_missing(
    tls_etcd: TlsEtcd,
) -> None:
    async with tls_etcd.session(tls_etcd.root()) as root:
        again = await grant_mesh_access(root, MESH, SERVICES)
        more = await grant_mesh_access(root, MESH, (*SERVICES, "bridge-s1"))
    assert again.role == mesh_role(MESH)
    assert again.users_added == () and not again.auth_enabled_now
    assert more.users_added == ("bridge-s1",)
    async with _as(tls_etcd, "bridge-s1") as session:
        await session.put(mesh_prefix(MESH) + b"bridge", b"here")


async def test_https_endpoints_take_the_processs_mesh_certificate(tls_etcd: TlsEtcd) -> None:
    """No credentials given: an `https://` endpoint makes the session show the mesh
    identity this process adopted (what a service gets from OMS_TLS_*)."""
    identity = mesh_identity(tls_etcd.pki.authority(), "operator")
    use_transports(MeshTransport.mutual(tls_etcd.authority_pem, identity), ClientTransport())
    try:
        async with EtcdSession((tls_etcd.endpoint,)) as session:
            await session.put(mesh_prefix(MESH) + b"tools", b"operator")
            assert session.credentials.tls
    finally:
        use_transports(None, None)


def _etcd_access(tls_etcd: TlsEtcd, mesh: str, certificate: str, *users: str) -> str:
    """`oms etcd-access` as the Kubernetes Job runs it; its output (exit code checked
    by the caller through the text)."""
    folder = tls_etcd.pki.folder
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMS_ETCD_ENDPOINTS": tls_etcd.endpoint,
        "OMS_MESH_ID": mesh,
        "OMS_TLS": "on",
        "OMS_TLS_CA": str(tls_etcd.pki.authority_path),
        "OMS_TLS_CERT": str(folder / f"{certificate}.pem"),
        "OMS_TLS_KEY": str(folder / f"{certificate}.key"),
    }
    arguments = [arg for user in users for arg in ("--user", user)]
    done = subprocess.run(
        [sys.executable, "-m", "services.command_line", "etcd-access", *arguments, "--wait-s", "5"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    return f"exit {done.returncode}: {done.stdout}{done.stderr}"


async def test_the_etcd_access_command_sets_a_mesh_up_as_root_and_only_as_root(
    tls_etcd: TlsEtcd,
) -> None:
    tls_etcd.pki.etcd_root_identity()  # its files, as a deployment's Secret holds them
    refused = _etcd_access(tls_etcd, "gamma", "etcd-probe", "gateway")
    assert refused.startswith("exit 1:") and "etcd refused" in refused, refused
    granted = _etcd_access(tls_etcd, "gamma", "etcd-root", "gateway", "shard")
    assert granted.startswith("exit 0:") and "role oms-gamma" in granted, granted
    assert "users added: gateway, shard" in granted, granted
    async with _as(tls_etcd, "gateway") as session:
        await session.put(mesh_prefix("gamma") + b"routing", b"epoch 1")
        with pytest.raises(CoordinationDenied):
            await session.put(mesh_prefix(MESH) + b"routing", b"not gamma's")
