"""What the read commands say on each form of mesh, decided without one: a mesh of one
replica per group (`oms up`), of replicated groups (`--replicas 3`), of several shard
clusters (`--shards N`), a group that does not answer, a gateway that cannot be reached.
`tests/mesh/test_read_commands.py` runs the commands against the default mesh itself."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gateway.client_waits import refusal
from gateway.signed_channel import GatewayCallError
from services.clients.call_failures import failure_words
from services.mesh.local_mesh import LocalMesh
from services.mesh.mesh_locator import nothing_in_etcd
from services.mesh.mesh_record import MeshRecord
from services.mesh.status_rows import ProcessReport, ProcessTarget, rows_of
from services.mesh.upgrade_command import group_report, status_lines
from services.mesh.version_switch import GroupVersions, ReplicaVersions
from services.routing.core.routing_changes import first_document
from services.routing.omsctl import (
    OmsctlError,
    no_document,
    residents_heading,
    residents_line,
)
from services.routing.routing_store import StoredRouting


def _one_replica(address: str, implemented: tuple[int, ...] = (1,)) -> ReplicaVersions:
    return ReplicaVersions(
        address, leading=True, version=1, implemented=implemented, replicated=False
    )


def test_upgrade_status_of_one_replica_groups_says_where_a_switch_runs() -> None:
    shard = GroupVersions("shard/s1", 1, [_one_replica("127.0.0.1:7001", (1, 2))])
    matcher = GroupVersions("matcher/g1", 1, [_one_replica("127.0.0.1:7002")])
    reports = [group_report(shard), group_report(matcher)]
    assert [report["replicated"] for report in reports] == [False, False]
    assert reports[0]["can_activate"] == []  # its build has 2, but it cannot switch
    lines = status_lines("mesh m under state", reports)
    assert lines[1] == "shard/s1: version 1 in force; one replica (file log)"
    assert lines[2] == "  127.0.0.1:7001 leader: at 1, implements 1,2, applied 0"
    assert "`oms up --replicas 3`" in lines[-1] and "oms upgrade activate" in lines[-1]


def test_upgrade_status_of_replicated_groups_and_of_one_that_does_not_answer() -> None:
    replicas = [
        ReplicaVersions(f"127.0.0.1:700{i}", leading=i == 1, version=1, implemented=(1, 2))
        for i in (1, 2, 3)
    ]
    replicated = group_report(GroupVersions("shard/s1", 1, replicas))
    assert replicated["replicated"] and replicated["can_activate"] == [2]
    silent = GroupVersions(
        "matcher/g1", 0, [ReplicaVersions("127.0.0.1:7004", failure="not reachable")]
    )
    lines = status_lines("mesh m", [replicated, group_report(silent)])
    assert lines[1] == "shard/s1: version 1 in force; can activate 2"
    assert "matcher/g1: no replica answered" in lines
    assert "  127.0.0.1:7004: not reachable" in lines
    assert not any("--replicas 3" in line for line in lines)  # every group is replicated


def test_etcd_holds_nothing_of_a_mesh_of_one_replica_per_group(tmp_path: Path) -> None:
    record = MeshRecord("g:1", "s:1", "p:1", "b:1", "r:1", mesh_id="m1")
    local = LocalMesh(tmp_path, record, ("https://127.0.0.1:2379",))
    said = nothing_in_etcd("m1", local, "oms status")
    assert "one replica per group" in said
    assert f"`oms status --state-dir {tmp_path}` without --etcd" in said
    elsewhere = nothing_in_etcd("m2", None, "oms upgrade status")
    assert "etcd names no process of mesh m2" in elsewhere and "--mesh-id" in elsewhere


def test_omsctl_on_a_mesh_routed_statically() -> None:
    said = no_document("m1", "s1")
    assert "routes every user to its one shard cluster, s1 (static routing)" in said
    assert "`oms up --shards N`" in said
    heading, asked = residents_heading(None, [], "s1", "m1")
    assert heading.startswith("static routing") and asked == ["s1"]
    with pytest.raises(OmsctlError, match="one shard cluster, s1: no s2"):
        residents_heading(None, ["s2"], "s1", "m1")


def test_omsctl_with_no_document_and_with_one() -> None:
    # A deployed mesh with no document: the clusters must be named.
    with pytest.raises(OmsctlError, match="omsctl residents s1"):
        residents_heading(None, [], "", "m1")
    assert residents_heading(None, ["s1"], "", "m1") == ("no routing document", ["s1"])
    assert no_document("m1").startswith("no routing document yet for mesh m1")
    stored = StoredRouting(first_document(["s1", "s2"]), 7)
    assert residents_heading(stored, [], "", "m1") == ("epoch 1", ["s1", "s2"])
    with pytest.raises(OmsctlError, match=r"no cluster s9 in epoch 1 \(its clusters: s1, s2\)"):
        residents_heading(stored, ["s9"], "", "m1")
    assert residents_line("s2", [], 0, 1) == "  s2           0 resident, 0 leaving, at epoch 1"
    many = residents_line("s1", list(range(1, 13)), 1, 1)
    assert many.endswith(": 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (2 more)"), many


def test_a_failed_call_in_words() -> None:
    refused = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    refused += "Failed to connect to remote host: connect: Connection refused (111)"
    unavailable = grpc.StatusCode.UNAVAILABLE
    assert failure_words(unavailable, refused) == "not reachable (connection refused)"
    assert failure_words(grpc.StatusCode.DEADLINE_EXCEEDED, "", 5.0) == "no answer within 5.0 s"
    assert failure_words(grpc.StatusCode.UNIMPLEMENTED, "Method not found!") == (
        "does not serve this call (a build without it)"
    )
    assert failure_words(unavailable, "not the leader") == "not reachable: not the leader"


def test_a_gateway_that_cannot_be_reached_is_named_with_what_to_run() -> None:
    error = GatewayCallError(grpc.StatusCode.UNAVAILABLE, "", "failed to connect: refused")
    said = refusal(error, "oms client", "127.0.0.1:7000", "no mesh under state/")
    assert said.startswith("oms client: no answer from the gateway at 127.0.0.1:7000")
    assert said.endswith("; no mesh under state/") and "UNAVAILABLE" not in said
    reasoned = GatewayCallError(
        grpc.StatusCode.NOT_FOUND, "GATEWAY_ERROR_REASON_ORDER_NOT_FOUND", "no order x"
    )
    assert refusal(reasoned, "oms client", "g:1") == "refused: ORDER_NOT_FOUND: no order x"
    bare = GatewayCallError(grpc.StatusCode.UNAUTHENTICATED, "", "")
    assert refusal(bare, "oms client", "g:1") == "refused: did not accept our credentials"


def _report(service: str, replica: int, leading: int | None = None) -> ProcessReport:
    target = ProcessTarget(service, "s1", replica, f"127.0.0.1:70{replica}{len(service)}")
    if leading is None:
        return ProcessReport(target, failure="no answer: not reachable (connection refused)")
    return ProcessReport(target, {"leading": leading, "uptime_s": 60})


def test_a_colocated_persister_beside_a_follower_is_a_standby() -> None:
    """`oms up --replicas 3 --colocate`: the persisters beside followers do not listen."""
    reports = [
        _report("shard", 0, leading=1),
        _report("shard", 1, leading=0),
        _report("shard", 2),  # its whole process is gone
        ProcessReport(ProcessTarget("persister", "s1", 0, "127.0.0.1:7100"), {"written": 5}),
        _report("persister", 1),
        _report("persister", 2),
    ]
    rows = {(row.service, row.replica): row for row in rows_of(reports, colocated=True)}
    assert (rows["persister", 1].role, rows["persister", 1].health) == ("standby", "ok")
    assert rows["persister", 2].health.startswith("no answer")  # its replica is gone too
    apart = {(row.service, row.replica): row for row in rows_of(reports)}
    assert apart["persister", 1].health.startswith("no answer")  # a process of its own
