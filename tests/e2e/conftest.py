"""Fixtures: whole meshes of real processes (tests/full_mesh.py) for the end-to-end tests.

Tests that kill nothing share one mesh for the whole folder (`e2e_mesh`; they
open their own accounts, whose ids are assigned, so no two tests share a user).
Tests that kill a process or need other settings build their own with
`new_mesh`, which always kills and reaps what it started and drops its database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.client import AdminClient
from tests.full_mesh import FullMesh, running_mesh


@pytest.fixture(scope="package")
def e2e_mesh(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[FullMesh]:
    with running_mesh(tmp_path_factory.mktemp("e2e-mesh"), database_url) as mesh:
        yield mesh


@pytest.fixture(scope="package")
def colocated_e2e_mesh(
    tmp_path_factory: pytest.TempPathFactory, database_url: str
) -> Iterator[FullMesh]:
    """The same mesh with the shard's persister, bridge and reconciler in its process."""
    folder = tmp_path_factory.mktemp("e2e-colocated-mesh")
    with running_mesh(folder, database_url, colocated=True) as mesh:
        yield mesh


@pytest.fixture(params=["processes", "colocated"])
def either_mesh(request: pytest.FixtureRequest) -> FullMesh:
    """Each form in turn: a process per service, then a co-located shard cluster."""
    name = "e2e_mesh" if request.param == "processes" else "colocated_e2e_mesh"
    mesh: FullMesh = request.getfixturevalue(name)
    return mesh


@pytest.fixture
async def admin(e2e_mesh: FullMesh) -> AsyncIterator[AdminClient]:
    async with e2e_mesh.admin() as client:
        yield client


@pytest.fixture
def new_mesh(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Awaitable[FullMesh]]]:
    """Starts dedicated meshes (options as `FullMesh.create`); kills and reaps them at the end."""
    made: list[FullMesh] = []

    async def start(**options: Any) -> FullMesh:
        mesh = FullMesh.create(tmp_path / f"mesh-{len(made) + 1}", database_url, **options)
        made.append(mesh)
        # Off the event loop: starting waits on health checks for seconds.
        await asyncio.to_thread(mesh.start)
        return mesh

    try:
        yield start
    finally:
        for mesh in made:
            mesh.stop()
