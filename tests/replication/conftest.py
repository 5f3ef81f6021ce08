"""Fixtures: replica sets of real shard processes on the session's etcd, always reaped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.replication.replica_set import ReplicaSet


@pytest.fixture
def replica_set(
    tmp_path: Path, etcd_endpoints: tuple[str, ...]
) -> Iterator[Callable[..., ReplicaSet]]:
    made: list[ReplicaSet] = []

    def make(size: int, environment: dict[str, str] | None = None) -> ReplicaSet:
        replicas = ReplicaSet(tmp_path, etcd_endpoints, size, environment)
        made.append(replicas)
        replicas.start()
        return replicas

    try:
        yield make
    finally:
        for replicas in made:
            replicas.stop()
