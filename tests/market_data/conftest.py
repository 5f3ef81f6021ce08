"""Fixtures: a whole mesh of real processes (tests/full_mesh.py) plus `oms marketdata`.

Each module that asks for `market_mesh` gets one mesh (shard, matchers g1 and g2,
bridge, persister, reconciler, gateway) and one market-data process following its
matchers and reading its persister, all started together and reaped when the module
ends. A test that needs the service configured otherwise (a small queue, a low
stream limit, signed access) starts another market-data process on the same mesh
with `market_data_factory`, reaped when the test ends. Modules pass their own
market-data environment through the `market_data_environment` fixture (a module may
override it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.client import AdminClient
from tests.full_mesh import FullMesh
from tests.market_data.market_data_process import MarketDataProcess


@dataclass
class MarketMesh:
    """A started mesh and the market-data process that follows it."""

    mesh: FullMesh
    market_data: MarketDataProcess

    def new_market_data(
        self, name: str, environment: Mapping[str, str] | None = None
    ) -> MarketDataProcess:
        """Another market-data process on this mesh (not started; reaped with the mesh)."""
        process = MarketDataProcess(
            self.mesh.folder / name,
            matchers=self.mesh.matcher_addresses,
            persister_address=self.mesh.persister.address,
            environment=environment,
        )
        self.mesh.extra.append(process)
        return process


@pytest.fixture(scope="module")
def market_data_environment() -> dict[str, str]:
    """The main market-data process's settings (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def market_mesh(
    tmp_path_factory: pytest.TempPathFactory,
    database_url: str,
    market_data_environment: dict[str, str],
) -> Iterator[MarketMesh]:
    folder = tmp_path_factory.mktemp("market-data-mesh")
    mesh = FullMesh.create(folder, database_url)
    market_data = MarketDataProcess(
        folder / "marketdata",
        matchers=mesh.matcher_addresses,
        persister_address=mesh.persister.address,
        environment=market_data_environment,
    )
    mesh.extra.append(market_data)
    try:
        mesh.start()  # every process at once, the market-data one included
        yield MarketMesh(mesh, market_data)
    finally:
        mesh.stop()


@pytest.fixture
def market_data_factory(
    market_mesh: MarketMesh, tmp_path: Path
) -> Iterator[Callable[..., MarketDataProcess]]:
    """Starts market-data processes of a test's own on the module's mesh; reaps them at the
    test's end (also when it failed)."""
    started: list[MarketDataProcess] = []

    def start(name: str, **environment: str) -> MarketDataProcess:
        process = market_mesh.new_market_data(f"{tmp_path.name}-{name}", environment)
        started.append(process)
        process.start_serving()
        return process

    try:
        yield start
    finally:
        for process in started:
            with contextlib.suppress(Exception):
                process.stop()


@pytest.fixture
async def admin(market_mesh: MarketMesh) -> AsyncIterator[AdminClient]:
    async with market_mesh.mesh.admin() as client:
        yield client
