"""`omsctl` on a real etcd, as an operator runs it (a process): the first document, a
cluster joining as receiving and one draining move nobody; what cannot be done is
refused with why and exit status 1, changing nothing."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_changes import (
    first_document,
    with_cluster_draining,
    with_cluster_joining,
)
from services.routing.core.routing_document import ClusterState, RoutingDocumentError
from services.routing.routing_store import routing_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def omsctl(etcd_endpoints: tuple[str, ...]) -> Iterator[object]:
    mesh_id = "omsctl-" + secrets.token_hex(4)
    environment = {
        **os.environ,
        "OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints),
        "OMS_MESH_ID": mesh_id,
        "PYTHONPATH": str(ROOT),
    }

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.routing.omsctl", *arguments],
            check=False,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )

    yield run

    async def clean() -> None:
        async with EtcdSession(etcd_endpoints) as session:
            await session.delete(routing_key(mesh_id))

    asyncio.run(clean())


def test_an_operator_builds_the_document_and_nobody_moves(omsctl: object) -> None:
    run = omsctl
    assert callable(run)
    shown = run("show")
    assert shown.returncode == 0 and "no routing document yet" in shown.stdout

    made = run("init", "--clusters", "c1,c2")
    assert made.returncode == 0, made.stderr
    assert "epoch 1" in made.stdout and "c1                   active" in made.stdout
    owners = {user: run("owner", str(user)).stdout.split()[2] for user in (1, 2, 42)}
    assert owners == {1: "c2", 2: "c2", 42: "c1"}  # the README's vectors

    joined = run("join", "c3")
    assert joined.returncode == 0 and "epoch 2" in joined.stdout
    assert "c3                   receiving" in joined.stdout
    drained = run("drain", "c2")
    assert drained.returncode == 0 and "c2                   draining" in drained.stdout
    for user, owner in owners.items():  # neither change moved anyone
        assert run("owner", str(user)).stdout.split()[2] == owner

    again = run("init", "--clusters", "c9")
    assert again.returncode == 1 and "a routing document exists (epoch 3)" in again.stderr
    last = run("drain", "c1")
    assert last.returncode == 1 and "no active cluster" in last.stderr
    assert "epoch 3" in run("show").stdout  # the refusals changed nothing


def test_changes_that_move_nobody() -> None:
    first = first_document(["s2", "s1"])
    assert [c.cluster_id for c in first.clusters] == ["s1", "s2"] and first.epoch == 1
    joined = with_cluster_joining(first, "s3")
    assert joined.epoch == 2 and joined.cluster("s3").state == ClusterState.RECEIVING  # type: ignore[union-attr]
    drained = with_cluster_draining(joined, "s1")
    for user in range(1, 2_000):
        assert first.owner_of(user) == joined.owner_of(user) == drained.owner_of(user)
    with pytest.raises(RoutingDocumentError, match="already in epoch"):
        with_cluster_joining(joined, "s3")
    with pytest.raises(RoutingDocumentError, match="only an active cluster drains"):
        with_cluster_draining(joined, "s3")
    with pytest.raises(RoutingDocumentError, match="no cluster s7"):
        with_cluster_draining(joined, "s7")
    with pytest.raises(RoutingDocumentError, match="at least one cluster"):
        first_document([])
