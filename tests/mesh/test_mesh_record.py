"""The mesh record names its mesh once per state folder, and every service gets it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.coordination.group_keys import GroupKeys, mesh_prefix
from services.infra.local_infra import InfraEndpoints
from services.mesh.command import mesh_children
from services.mesh.mesh_record import (
    RECORD_NAME,
    MeshRecordError,
    prepare_mesh_record,
    read_mesh_record,
)


def test_a_state_folder_keeps_its_mesh_id_and_another_folder_gets_its_own(
    tmp_path: Path,
) -> None:
    first = prepare_mesh_record(tmp_path / "a", ["g1"])
    assert first.mesh_id.startswith("mesh-")
    mesh_prefix(first.mesh_id)  # a valid etcd namespace
    assert prepare_mesh_record(tmp_path / "a", ["g1"]).mesh_id == first.mesh_id
    assert prepare_mesh_record(tmp_path / "b", ["g1"]).mesh_id != first.mesh_id


def test_every_service_runs_in_the_record_s_mesh(tmp_path: Path) -> None:
    record = prepare_mesh_record(tmp_path, ["g1"], replicas=3)
    endpoints = InfraEndpoints(
        etcd_endpoints=("127.0.0.1:1",), database_url="postgresql://x", embedded=True
    )
    children = mesh_children(endpoints, tmp_path, record)
    assert children and {child.environment["OMS_MESH_ID"] for child in children} == {record.mesh_id}


def test_a_replicated_folder_from_before_mesh_ids_is_refused(tmp_path: Path) -> None:
    record = prepare_mesh_record(tmp_path, ["g1"], replicas=3)
    data = json.loads((tmp_path / RECORD_NAME).read_text())
    del data["mesh_id"]
    (tmp_path / RECORD_NAME).write_text(json.dumps(data))
    loaded = read_mesh_record(tmp_path)
    assert loaded is not None and loaded.mesh_id == ""
    with pytest.raises(MeshRecordError, match="before meshes had ids"):
        prepare_mesh_record(tmp_path, ["g1"], replicas=3)
    assert record.mesh_id


def test_mesh_ids_are_dns_labels() -> None:
    assert GroupKeys.of("mesh-1a", "shard", "s1").prefix == b"/oms/v1/mesh-1a/shard/s1/"
    for bad in ("", "Mesh", "a/b", "-a", "a-", "a" * 64):
        with pytest.raises(ValueError, match="DNS label"):
            mesh_prefix(bad)


def test_each_cluster_has_its_own_shard_persister_bridge_and_reconciler(tmp_path: Path) -> None:
    record = prepare_mesh_record(tmp_path, ["g1"], shards=3)
    assert [cluster.cluster_id for cluster in record.clusters()] == ["s1", "s2", "s3"]
    endpoints = InfraEndpoints(
        etcd_endpoints=("127.0.0.1:1",), database_url="postgresql://x", embedded=True
    )
    children = {child.name: child for child in mesh_children(endpoints, tmp_path, record)}
    for cluster in record.clusters():
        for role in ("persister", "bridge", "reconciler"):
            child = children[f"{role}-{cluster.cluster_id}"]
            assert child.environment["OMS_SHARD_ID"] == cluster.cluster_id
            assert cluster.shard in child.argv
        assert children[f"shard-{cluster.cluster_id}"].environment["OMS_SHARD_ID"] == (
            cluster.cluster_id
        )
    gateway = children["gateway"].environment
    assert gateway["OMS_GATEWAY_ROUTING"] == "etcd"
    assert gateway["OMS_SHARDS"] == ",".join(f"{c.cluster_id}={c.shard}" for c in record.clusters())
    # The folder keeps its shape: a mesh changes its clusters by waves, not by restarts.
    with pytest.raises(MeshRecordError, match="3 shard cluster"):
        prepare_mesh_record(tmp_path, ["g1"], shards=2)
    assert prepare_mesh_record(tmp_path, ["g1"], shards=3).clusters() == record.clusters()
