"""Shared test setup: a real etcd and a real PostgreSQL, and the hypothesis profile.

Each server starts once per session and only when a test asks for it, so tests that need
neither pay nothing. OMS_ETCD_ENDPOINTS / OMS_DATABASE_URL point tests at existing servers.

The suite's own processes speak plaintext (`OMS_TLS=off`, inherited by every service
a test starts) unless a test gives them TLS settings: `tests/transport/` tests TLS
itself, and a mesh `oms up` starts is TLS by default, its tools reading `mesh.json`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from services.infra.embedded_etcd import EmbeddedEtcd
from services.infra.embedded_postgres import EmbeddedPostgres
from services.infra.local_infra import InfraEndpoints
from services.infra.settings import InfraSettings
from services.settings import load_settings
from tests.server_folders import server_reachable_folder

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")
os.environ["OMS_TLS"] = "off"
# The persister's master key (it seals API secrets), for every persister a test starts:
# a test value, public like the rest of the suite's credentials.
os.environ["OMS_PERSISTER_MASTER_KEY"] = "b21zLXRlc3Qtc3VpdGUtbWFzdGVyLWtleS0zMmJ5dGU="


@pytest.fixture(scope="session")
def infra_settings() -> InfraSettings:
    return load_settings(InfraSettings)


@pytest.fixture(scope="session")
def etcd_endpoints(
    infra_settings: InfraSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ...]]:
    """host:port of every etcd member: OMS_ETCD_ENDPOINTS, else an embedded etcd."""
    if infra_settings.etcd_endpoints:
        yield infra_settings.etcd_endpoints
        return
    # No fsync: the data dies with the session anyway.
    with EmbeddedEtcd(tmp_path_factory.mktemp("etcd"), unsafe_no_fsync=True) as etcd:
        yield (etcd.endpoint,)


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_endpoints: tuple[str, ...]) -> str:
    """host:port of one etcd member."""
    return etcd_endpoints[0]


@pytest.fixture(scope="session")
def database_url(
    infra_settings: InfraSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """postgresql:// URL of the test database: OMS_DATABASE_URL, else an embedded PostgreSQL."""
    if infra_settings.database_url:
        yield infra_settings.database_url
        return
    with (
        server_reachable_folder("oms-test-postgres-") as data_dir,
        EmbeddedPostgres(data_dir, fast_unsafe=True) as postgres,
    ):
        yield postgres.url


@pytest.fixture(scope="session")
def infra_endpoints(
    infra_settings: InfraSettings, etcd_endpoints: tuple[str, ...], database_url: str
) -> InfraEndpoints:
    """Both servers; each fixture above can also be requested alone to start only that one."""
    return InfraEndpoints(
        etcd_endpoints=etcd_endpoints,
        database_url=database_url,
        embedded=not (infra_settings.etcd_endpoints or infra_settings.database_url),
    )
