"""A persister refuses another mesh's database, and a mesh's etcd namespace bound to
another database: on a real PostgreSQL and a real etcd, and as a process that exits
with both names before it writes anything."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from persister.mesh_identity import MeshMismatchError, bind_etcd, claim_database
from persister.migrations import apply_migrations
from persister.store import Store
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import mesh_identity_key
from tests.persister.persister_process import PersisterProcess

EXIT_TIMEOUT_S = 30.0


@pytest.fixture
async def store(new_database: Callable[[], str]) -> AsyncIterator[Store]:
    opened = await Store.open(new_database(), pool_size=2)
    await apply_migrations(opened)
    yield opened
    await opened.close()


def _mesh_id() -> str:
    return "test-" + secrets.token_hex(4)


async def test_the_first_mesh_claims_the_database_and_another_is_refused(store: Store) -> None:
    mesh = _mesh_id()
    first = await claim_database(store, mesh)
    assert first.mesh_id == mesh and first.database_uid
    assert await claim_database(store, mesh) == first  # the same mesh, every start

    other = _mesh_id()
    with pytest.raises(MeshMismatchError, match=f"belongs to mesh '{mesh}', not '{other}'"):
        await claim_database(store, other)
    async with store.session() as session:
        rows = await session.fetchval("SELECT count(*) FROM mesh_identity")
    assert rows == 1
    assert await claim_database(store, mesh) == first  # the refusal changed nothing


async def test_a_mesh_in_etcd_stays_bound_to_its_database(
    new_database: Callable[[], str], etcd_endpoints: tuple[str, ...]
) -> None:
    mesh = _mesh_id()
    ours, other = (
        await _claimed_store(new_database(), mesh),
        await _claimed_store(new_database(), mesh),
    )
    async with EtcdSession(etcd_endpoints) as session:
        try:
            ours_identity = await claim_database(ours, mesh)
            await bind_etcd(session, ours, ours_identity)
            await bind_etcd(session, ours, ours_identity)  # every start of the same pairing
            # A second database under the same mesh id (or one restored from elsewhere).
            with pytest.raises(MeshMismatchError, match="not written beside this database"):
                await bind_etcd(session, other, await claim_database(other, mesh))
            entry = await session.get(mesh_identity_key(mesh))
            assert entry is not None and entry.value == ours_identity.database_uid.encode()

            # The etcd's namespace lost (another cluster, its data wiped): the database
            # knows it was bound, so it is not bound again to an empty log.
            await session.delete(mesh_identity_key(mesh))
            with pytest.raises(MeshMismatchError, match="the logs are not here"):
                await bind_etcd(session, ours, ours_identity)
            assert await session.get(mesh_identity_key(mesh)) is None
        finally:
            await session.delete(mesh_identity_key(mesh))
            await ours.close()
            await other.close()


async def _claimed_store(url: str, mesh: str) -> Store:
    store = await Store.open(url, pool_size=2)
    await apply_migrations(store)
    await claim_database(store, mesh)
    return store


def _exit_code(process: PersisterProcess) -> int:
    assert process.process is not None
    return process.process.wait(EXIT_TIMEOUT_S)


async def test_a_persister_of_another_mesh_exits_before_writing(
    tmp_path: Path, new_database: Callable[[], str], etcd_endpoints: tuple[str, ...]
) -> None:
    url = new_database()
    mesh, other = _mesh_id(), _mesh_id()
    store = await Store.open(url, pool_size=1)
    try:
        await apply_migrations(store)
        await claim_database(store, mesh)
    finally:
        await store.close()

    # The shard's address says etcd and no shard runs: a refused persister never gets
    # as far as looking for it.
    process = PersisterProcess(
        tmp_path / "persister",
        shard_address="etcd",
        database_url=url,
        environment={"OMS_MESH_ID": other, "OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints)},
    )
    process.start()
    try:
        code = await asyncio.to_thread(_exit_code, process)
    finally:
        process.stop()
    assert code != 0
    assert f"this database belongs to mesh '{mesh}', not '{other}'" in process.log_tail()

    store = await Store.open(url, pool_size=1)
    try:
        async with store.session() as session:
            fences = await session.fetchval("SELECT count(*) FROM writer_fences")
            cursors = await session.fetchval("SELECT count(*) FROM persister_cursor")
    finally:
        await store.close()
    assert (fences, cursors) == (0, 0)
