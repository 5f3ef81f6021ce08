"""Fixtures: a shard, matchers g1 and g2 and a bridge, as real processes on loopback.

The order-flow tests share one mesh per module (starting four processes costs
seconds) and use user ids no other test uses; fault tests start their own
through `new_mesh`, which always reaps what it started.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bridge.mesh import MeshClients, MeshProcesses, mesh_clients

_user_blocks = itertools.count(1)
USERS_PER_TEST = 8


@pytest.fixture(scope="module")
def shared_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshProcesses]:
    processes = MeshProcesses.create(tmp_path_factory.mktemp("bridge-mesh"))
    processes.start()
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture
async def mesh(shared_mesh: MeshProcesses) -> AsyncIterator[MeshClients]:
    async with mesh_clients(shared_mesh) as clients:
        await clients.wait_bridge_connected()
        yield clients


@pytest.fixture
def users() -> tuple[int, ...]:
    """User ids no other test of the session uses."""
    base = 10_000 + next(_user_blocks) * 100
    return tuple(base + offset for offset in range(1, USERS_PER_TEST + 1))


@pytest.fixture
def new_mesh(tmp_path: Path) -> Iterator[Callable[..., MeshProcesses]]:
    """Makes dedicated (not yet started) meshes; kills and reaps them at the end."""
    made: list[MeshProcesses] = []

    def make(**options: Any) -> MeshProcesses:
        processes = MeshProcesses.create(tmp_path / f"mesh-{len(made) + 1}", **options)
        made.append(processes)
        return processes

    try:
        yield make
    finally:
        for processes in made:
            processes.stop()
