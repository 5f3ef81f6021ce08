"""Fixtures: one whole mesh of real processes (tests/full_mesh.py), shared by the gateway tests.

Starting the seven processes costs seconds, so the tests share one mesh and open
their own accounts through the admin API (user ids are assigned, so no two tests
share one). Tests that need a mesh configured differently or kill a process
other than a gateway build their own with `new_mesh`, which always reaps what it
started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.client import AdminClient
from tests.full_mesh import FullMesh, running_mesh


@pytest.fixture(scope="session")
def shared_mesh(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[FullMesh]:
    with running_mesh(tmp_path_factory.mktemp("gateway-mesh"), database_url) as mesh:
        yield mesh


@pytest.fixture
async def admin(shared_mesh: FullMesh) -> AsyncIterator[AdminClient]:
    async with shared_mesh.admin() as client:
        yield client


@pytest.fixture
def new_mesh(tmp_path: Path, database_url: str) -> Iterator[Callable[..., FullMesh]]:
    """Makes dedicated (not yet started) meshes; kills and reaps them at the end."""
    made: list[FullMesh] = []

    def make(**options: Any) -> FullMesh:
        mesh = FullMesh.create(tmp_path / f"mesh-{len(made) + 1}", database_url, **options)
        made.append(mesh)
        return mesh

    try:
        yield make
    finally:
        for mesh in made:
            mesh.stop()
