"""The routing document in a real etcd: created once, replaced only by a swap that names
what it read and carries the next epoch, and watched in order."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_document import (
    Cluster,
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
)
from services.routing.routing_store import (
    RoutingConflictError,
    RoutingStore,
    StoredRouting,
    routing_key,
)

WATCH_TIMEOUT_S = 10.0


def _document(epoch: int, *clusters: str) -> RoutingDocument:
    return RoutingDocument.build(epoch, [Cluster(c, ClusterState.ACTIVE) for c in clusters])


@pytest.fixture
async def store(etcd_endpoints: tuple[str, ...]) -> AsyncIterator[RoutingStore]:
    mesh_id = "routing-" + secrets.token_hex(4)
    async with EtcdSession(etcd_endpoints) as session:
        yield RoutingStore(session, mesh_id)
        await session.delete(routing_key(mesh_id))


async def test_a_document_changes_only_by_a_swap_of_what_was_read(store: RoutingStore) -> None:
    assert await store.read() is None
    first = await store.swap(None, _document(1, "c1"))
    assert await store.read() == first and first.epoch == 1

    with pytest.raises(RoutingConflictError):
        await store.swap(None, _document(1, "c2"))  # someone created it already
    second = await store.swap(first, _document(2, "c1", "c2"))
    with pytest.raises(RoutingConflictError):
        await store.swap(first, _document(2, "c1", "c3"))  # read before the second swap
    with pytest.raises(RoutingDocumentError, match="is epoch 3"):
        await store.swap(second, _document(4, "c1"))  # epochs go up by one
    assert await store.read() == second


async def test_a_watcher_sees_every_epoch_in_order(store: RoutingStore) -> None:
    first = await store.swap(None, _document(1, "c1"))
    seen: list[StoredRouting] = []

    async def watch() -> None:
        async for stored in store.watch(first):
            seen.append(stored)
            if stored.epoch == 4:
                return

    watcher = asyncio.create_task(watch())
    current = first
    for epoch in (2, 3, 4):
        current = await store.swap(current, _document(epoch, "c1", f"c{epoch}"))
    async with asyncio.timeout(WATCH_TIMEOUT_S):
        await watcher
    assert [stored.epoch for stored in seen] == [2, 3, 4]
    assert seen[-1] == current


async def test_a_value_that_is_not_a_document_is_an_error_not_a_gap(store: RoutingStore) -> None:
    await store.session.put(store.key, b'{"epoch": 1}')
    with pytest.raises(RoutingDocumentError, match="the routing document at revision"):
        await store.read()
