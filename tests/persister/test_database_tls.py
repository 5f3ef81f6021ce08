"""TLS between the persister and PostgreSQL, by configuration (the database URL).

A PostgreSQL that accepts TLS connections only (`hostnossl ... reject`) and presents a
certificate from the mesh's authority: a plaintext client is refused, a client that
verifies the server (`sslmode=verify-full`, the authority as `sslrootcert`) is served
over TLS, one that trusts another authority refuses the server, and a real
persister given such a URL applies its migrations and serves.

The PostgreSQL that `pgserver` ships is built without SSL ("SSL is not supported by
this build"), so these tests run a build that has it: the distribution's
(`/usr/lib/postgresql/<version>/bin`, Debian's package, on these machines), and are
skipped, saying so, where there is none.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from services.infra.embedded_postgres import EmbeddedPostgres
from services.infra.postgres_account import postgres_account
from services.transport.certificates import Identity, issue, new_authority
from tests.persister.persister_client import PersisterClient
from tests.persister.persister_process import PersisterProcess
from tests.server_folders import server_reachable_folder
from tests.shard_service.shard_process import aio_channel

SSL_BUILDS = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), reverse=True)
HBA = """\
local all all trust
hostssl all all 127.0.0.1/32 trust
hostnossl all all 127.0.0.1/32 reject
"""


@dataclass(frozen=True)
class TlsPostgres:
    server: EmbeddedPostgres
    authority_file: Path
    other_authority_file: Path

    def url(self, **parameters: str) -> str:
        query = "&".join(f"{name}={value}" for name, value in parameters.items())
        return f"{self.server.url}?{query}" if query else self.server.url

    def verified_url(self) -> str:
        return self.url(sslmode="verify-full", sslrootcert=str(self.authority_file))


def _write(identity: Identity, folder: Path, name: str) -> tuple[Path, Path]:
    certificate, key = folder / f"{name}.crt", folder / f"{name}.key"
    identity.write(certificate, key)
    return certificate, key


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[TlsPostgres]:
    if not SSL_BUILDS:
        pytest.skip("no PostgreSQL built with SSL here (pgserver's is built without it)")
    with server_reachable_folder("oms-tls-postgres-") as folder:
        tls = folder / "tls"
        tls.mkdir()
        authority = new_authority("oms test database authority")
        (tls / "ca.crt").write_bytes(authority.certificate_pem)
        (tls / "other-ca.crt").write_bytes(new_authority("another authority").certificate_pem)
        certificate, key = _write(issue(authority, "postgres", hosts=("127.0.0.1",)), tls, "pg")
        hba = tls / "pg_hba.conf"
        hba.write_text(HBA)
        account = postgres_account()
        for path in (tls, certificate, key, hba):
            if account is not None:
                os.chown(path, account.uid, account.gid)
        key.chmod(0o600)  # postgres refuses a key others may read
        settings = {
            "ssl": "on",
            "ssl_cert_file": str(certificate),
            "ssl_key_file": str(key),
            "hba_file": str(hba),
        }
        server = EmbeddedPostgres(
            folder / "data",
            fast_unsafe=True,
            server_settings=settings,
            bin_dir=SSL_BUILDS[0].parent,
        )
        with server as pg:
            yield TlsPostgres(pg, tls / "ca.crt", tls / "other-ca.crt")


async def test_a_plaintext_client_is_refused(tls_postgres: TlsPostgres) -> None:
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await asyncpg.connect(tls_postgres.url(sslmode="disable"))


async def test_a_client_that_verifies_the_server_is_served_over_tls(
    tls_postgres: TlsPostgres,
) -> None:
    connection = await asyncpg.connect(tls_postgres.verified_url())
    try:
        encrypted = await connection.fetchval(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
    finally:
        await connection.close()
    assert encrypted is True


async def test_a_client_trusting_another_authority_refuses_the_server(
    tls_postgres: TlsPostgres,
) -> None:
    url = tls_postgres.url(
        sslmode="verify-full", sslrootcert=str(tls_postgres.other_authority_file)
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncpg.connect(url)


async def test_the_persister_runs_on_a_verified_tls_database_url(
    tls_postgres: TlsPostgres, tmp_path: Path
) -> None:
    # No shard is needed to start: the persister applies its migrations and serves its
    # API (CreateUser), then waits for the shard's egress at this unused address.
    persister = PersisterProcess(
        tmp_path / "persister",
        shard_address="127.0.0.1:9",
        database_url=tls_postgres.verified_url(),
    )
    try:
        persister.start_serving()
        async with aio_channel(persister.address) as channel:
            created = await PersisterClient(channel).create_user()
        assert created.user_id > 0
    finally:
        persister.stop()
    connection = await asyncpg.connect(tls_postgres.verified_url())
    try:
        users = await connection.fetchval("SELECT count(*) FROM users")
    finally:
        await connection.close()
    assert users == 1
