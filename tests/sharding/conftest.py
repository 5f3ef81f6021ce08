"""Fixtures: meshes of several user-shard clusters (tests/sharded_mesh.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from services.routing.core.routing_document import RoutingDocument
from tests.sharded_mesh import ShardedMesh


@pytest.fixture
def new_sharded_mesh(
    tmp_path: Path, database_url: str, etcd_endpoints: tuple[str, ...]
) -> Iterator[Callable[..., Awaitable[ShardedMesh]]]:
    """Starts meshes routed from `first` (clusters: the document's, or `cluster_ids` when
    some join later); kills and reaps them at the end."""
    made: list[ShardedMesh] = []

    async def start(
        first: RoutingDocument, cluster_ids: Sequence[str] | None = None, **options: Any
    ) -> ShardedMesh:
        ids = list(cluster_ids or [cluster.cluster_id for cluster in first.clusters])
        folder = tmp_path / f"mesh-{len(made) + 1}"
        mesh = ShardedMesh.create(folder, database_url, etcd_endpoints, ids, **options)
        made.append(mesh)
        await mesh.write_routing(first)
        # Off the event loop: starting waits on health checks for seconds.
        await asyncio.to_thread(mesh.start)
        return mesh

    try:
        yield start
    finally:
        for mesh in made:
            mesh.stop()
