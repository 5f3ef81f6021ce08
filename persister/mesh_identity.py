"""Which mesh a database belongs to, and which database a mesh's etcd keys belong to.

The shard's positions, the persister's cursor and the writer fences in PostgreSQL
only make sense beside the logs they were written from. A persister pointed at
another mesh's database, or a database restored beside another mesh's etcd, would
apply one log's positions to another's rows. So before it writes any of the mesh's
data (only its schema migrations come first) the persister:

1. claims the database for its mesh (`mesh_identity`, one row; the first claim wins
   and gives the database a random uid); a database of another mesh id is refused;
2. when the mesh's logs are in etcd, binds the mesh's etcd namespace to that uid
   (`/oms/v1/<mesh>/identity`, created once, and `etcd_bound_at` in the database);
   an etcd whose mesh is bound to another database is refused, and so is an etcd
   without the key once the database was bound (its logs are elsewhere, or lost).

Both refusals are `MeshMismatchError`: the persister stops with both names, since
only an operator can say which side is the wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

from persister.store import Store
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import mesh_identity_key, mesh_prefix


class MeshMismatchError(RuntimeError):
    """The database or the etcd namespace belongs to another mesh."""


@dataclass(frozen=True, slots=True)
class MeshIdentity:
    mesh_id: str
    database_uid: str


async def claim_database(store: Store, mesh_id: str) -> MeshIdentity:
    """The database's identity, claimed for `mesh_id` if no mesh had claimed it."""
    mesh_prefix(mesh_id)  # a valid namespace, before it is written down for good
    async with store.transaction() as session:
        await session.execute(
            "INSERT INTO mesh_identity (mesh_id, database_uid)"
            " VALUES ($1, gen_random_uuid()::text) ON CONFLICT (singleton) DO NOTHING",
            mesh_id,
        )
        row = await session.fetchrow("SELECT mesh_id, database_uid FROM mesh_identity")
    assert row is not None  # inserted or already there, in this transaction
    identity = MeshIdentity(str(row["mesh_id"]), str(row["database_uid"]))
    if identity.mesh_id != mesh_id:
        raise MeshMismatchError(
            f"this database belongs to mesh {identity.mesh_id!r}, not {mesh_id!r} "
            "(OMS_MESH_ID): point the persister at its own mesh's database"
        )
    return identity


async def bind_etcd(session: EtcdSession, store: Store, identity: MeshIdentity) -> None:
    """Record the database's uid under the mesh's etcd namespace, or check it there."""
    async with store.session() as reading:
        bound_before = bool(
            await reading.fetchval("SELECT etcd_bound_at IS NOT NULL FROM mesh_identity")
        )
    key = mesh_identity_key(identity.mesh_id)
    entry = await session.get(key)
    if entry is None:
        if bound_before:
            raise MeshMismatchError(
                f"this database was written beside mesh {identity.mesh_id!r}'s logs in "
                "etcd, and this etcd holds no such mesh: the logs are not here (another "
                "etcd cluster, or its data was lost); point OMS_ETCD_ENDPOINTS at the "
                "mesh's own etcd"
            )
        _, entry = await session.create(key, identity.database_uid.encode(), lease=0)
    bound = entry.value.decode() if entry is not None else ""
    if bound != identity.database_uid:
        raise MeshMismatchError(
            f"mesh {identity.mesh_id!r} in etcd belongs to database {bound!r}, and this "
            f"database is {identity.database_uid!r}: the logs in this etcd were not written "
            "beside this database (a second mesh with the same OMS_MESH_ID, or a database "
            "restored from elsewhere)"
        )
    if not bound_before:
        async with store.transaction() as writing:
            await writing.execute(
                "UPDATE mesh_identity SET etcd_bound_at = now() WHERE etcd_bound_at IS NULL"
            )
