"""Fixtures: the replication tests' replica sets and the gateway tests' dedicated meshes
(real processes, always reaped)."""

from tests.gateway.conftest import new_mesh
from tests.replication.conftest import replica_set

__all__ = ["new_mesh", "replica_set"]
