"""The keys of one replicated group (a shard, a matcher group) in etcd.

Every key of a mesh lives under `/oms/v1/<mesh id>/` (`OMS_MESH_ID`, unique per
etcd cluster; `oms up` makes one per state folder), so two meshes on one etcd
never read each other's logs or leaders. A group's prefix is
`/oms/v1/<mesh id>/<kind>/<name>/`:

<prefix>leader                          the leader key (its lease; value: the leader's address)
<prefix>log/<first position, 20 digits> the group's log records (services/runtime/etcd_log.py)
<prefix>chunk/<first position>/<index>  pieces of records too big for one request
<prefix>replicas/<address>              each live replica (its lease; value: what it holds)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.coordination.etcd_session import prefix_end

DEFAULT_MESH_ID = "local"  # OMS_MESH_ID unset: one mesh per etcd cluster

# A DNS label: it also names Kubernetes objects and never holds a "/".
_MESH_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def mesh_prefix(mesh_id: str) -> bytes:
    """`/oms/v1/<mesh id>/`; ValueError unless the id is a DNS label."""
    if not _MESH_ID.fullmatch(mesh_id):
        raise ValueError(
            f"a mesh id is a DNS label (lower-case letters, digits, '-'), not {mesh_id!r}"
        )
    return f"/oms/v1/{mesh_id}/".encode()


def mesh_identity_key(mesh_id: str) -> bytes:
    """Names the database the mesh's logs belong to (`persister/mesh_identity.py`)."""
    return mesh_prefix(mesh_id) + b"identity"


@dataclass(frozen=True, slots=True)
class GroupKeys:
    prefix: bytes

    @classmethod
    def of(cls, mesh_id: str, kind: str, name: str) -> GroupKeys:
        """The keys of one group of mesh `mesh_id`: kind "shard", "matcher", "bridge",
        "reconciler" or "persister", name the shard or matcher group id."""
        return cls(mesh_prefix(mesh_id) + f"{kind}/{name}/".encode())

    @property
    def leader(self) -> bytes:
        return self.prefix + b"leader"

    @property
    def records(self) -> bytes:
        return self.prefix + b"log/"

    @property
    def records_end(self) -> bytes:
        return prefix_end(self.records)

    def record(self, first_position: int) -> bytes:
        return self.records + b"%020d" % first_position

    @property
    def chunks(self) -> bytes:
        return self.prefix + b"chunk/"

    def chunk_prefix(self, first_position: int) -> bytes:
        return self.chunks + b"%020d/" % first_position

    def chunk(self, first_position: int, index: int) -> bytes:
        return self.chunk_prefix(first_position) + b"%04d" % index

    @property
    def replicas(self) -> bytes:
        return self.prefix + b"replicas/"

    def position_of(self, record_key: bytes) -> int:
        return int(record_key[len(self.records) :])
