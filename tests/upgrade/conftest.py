"""Fixtures: the replication tests' replica sets (real shard processes, always reaped)."""

from tests.replication.conftest import replica_set

__all__ = ["replica_set"]
