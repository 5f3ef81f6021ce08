"""`oms up` (what `make run` runs) brings the whole mesh up, `oms demo` trades on it, and
Ctrl-C stops everything cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.coordination.errors import CoordinationDenied, CoordinationUnavailable
from services.coordination.etcd_channel import credentials_of
from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import mesh_prefix
from services.infra.infra_record import read_record
from services.infra.local_infra import LocalInfra, ServerState
from services.mesh.mesh_record import read_mesh_record
from services.transport.certificates import mesh_identity
from services.transport.development import DevelopmentTls
from tests.bridge.bridge_process import service_status
from tests.mesh.up_process import ROOT, output_lines, run_demo, up_environment, wait_for_line
from tests.replication.replicated_mesh import (
    ReplicatedMesh,
    kill_replica,
    leader_of,
    wait_new_term,
)


@pytest.mark.slow
def test_oms_up_runs_the_mesh_the_demo_trades_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    environment = up_environment()
    process = subprocess.Popen(
        [sys.executable, "-m", "services.command_line", "up", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=ROOT,
    )
    seen: list[str] = []
    try:
        lines = output_lines(process)
        wait_for_line(lines, "press Ctrl-C", seen, 60)
        wait_for_line(lines, "[mesh] all services serving", seen, 90)
        running = {status.name: status.state for status in LocalInfra(state_dir).status()}
        assert running == {"etcd": ServerState.RUNNING, "postgres": ServerState.RUNNING}
        # TLS by default: the demo reached the gateway by the development authority and
        # every service reached the others by their certificates; a plaintext caller
        # is refused by the gateway and by the shard alike.
        shown = run_demo(state_dir, environment)
        assert "USDT  total           80,461.00 USDT" in shown, shown
        record = read_mesh_record(state_dir)
        assert record is not None and record.tls
        for address in (record.gateway, record.shard):
            assert not _plaintext_health(address), address
        tls = DevelopmentTls.under(state_dir)
        with tls.operator_transport().blocking_channel(record.shard, ()) as channel:
            assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        # etcd too: mutual TLS with its auth on, each service its own user.
        assert any("[mesh] etcd: TLS, auth on; role oms-" in line for line in seen), seen
        asyncio.run(_etcd_by_certificate_only(state_dir, record.mesh_id))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        wait_for_line(lines, "[mesh] stopped", seen, 10)
        stopped = {status.name: status.state for status in LocalInfra(state_dir).status()}
        assert stopped == {"etcd": ServerState.STOPPED, "postgres": ServerState.STOPPED}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        LocalInfra(state_dir).down()


async def _etcd_by_certificate_only(state_dir: Path, mesh_id: str) -> None:
    """The tools' certificate reads the mesh's keys; plaintext never reaches etcd, and
    no certificate reaches another mesh's keys."""
    etcd = read_record(state_dir / "infra.json").etcd
    assert etcd is not None and etcd.endpoint.startswith("https://127.0.0.1:")
    tls = DevelopmentTls.under(state_dir)
    authority = tls.authority()
    as_tools = credentials_of(authority.certificate_pem, mesh_identity(authority, "operator"))
    async with EtcdSession((etcd.endpoint,), credentials=as_tools) as session:
        # (One shard without replicas keeps nothing in etcd: a key of the test's own.)
        await session.put(mesh_prefix(mesh_id) + b"tools-check", b"ok")
        keys = await session.range(mesh_prefix(mesh_id), prefix_end(mesh_prefix(mesh_id)))
        assert mesh_prefix(mesh_id) + b"tools-check" in [entry.key for entry in keys]
        await session.delete(mesh_prefix(mesh_id) + b"tools-check")
        with pytest.raises(CoordinationDenied):
            await session.get(mesh_prefix("another") + b"routing")
    plaintext = f"http://127.0.0.1:{etcd.client_port}"
    async with EtcdSession((plaintext,), timeout_s=2.0) as session:
        with pytest.raises(CoordinationUnavailable):
            await session.get(mesh_prefix(mesh_id) + b"routing")


def _health(channel: grpc.Channel) -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(reply.status)


def _plaintext_health(address: str) -> bool:
    """Whether a plaintext caller gets an answer from `address`."""
    with grpc.insecure_channel(address) as channel:
        try:
            _health(channel)
        except grpc.RpcError as refused:
            assert refused.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed
            return False
    return True


@pytest.mark.slow
def test_oms_up_with_three_replicas_trades_through_the_leaders_kills(
    tmp_path: Path, database_url: str
) -> None:
    """`oms up --replicas 3` as a developer runs it, TLS everywhere: its own embedded
    etcd over mutual TLS with auth on (each service its own etcd user, the mesh's role
    over its keys alone), a database of its own. The demo trades; the shard's and a
    matcher group's leaders are killed; the supervisor restarts them as followers, new
    leaders are elected (leases, logs and watches as etcd users), every service finds
    them in etcd, and the demo trades again."""
    state_dir = tmp_path / "state"
    with ReplicatedMesh(state_dir, database_url, tls=True) as mesh:
        assert any("[mesh] etcd: TLS, auth on" in line for line in mesh.seen), mesh.seen
        run_demo(state_dir, mesh.environment)
        record = mesh.record
        groups = (record.shard_replicas(), record.matcher_replicas("g1"))
        terms = [leader_of(replicas, mesh.transport) for replicas in groups]
        for address, _ in terms:
            kill_replica(address)
        for replicas, (_, term) in zip(groups, terms, strict=True):
            wait_new_term(replicas, term, transport=mesh.transport)
        run_demo(state_dir, mesh.environment)
        assert mesh.stop() == 0


@pytest.mark.slow
def test_oms_up_with_two_shards_routes_by_the_document_and_the_demo_trades(
    tmp_path: Path, database_url: str
) -> None:
    """`oms up --shards 2`: clusters s1 and s2, each with its own shard, persister, bridge
    and reconciler; the first routing document (epoch 1, both active) is written to etcd;
    the gateway routes by it, and the demo's two traders trade through it."""
    state_dir = tmp_path / "state"
    with ReplicatedMesh(state_dir, database_url, replicas=1, shards=2) as mesh:
        assert any(
            "[mesh] routing: epoch 1 written, clusters s1 (active), s2 (active)" in line
            for line in mesh.seen
        )
        record = mesh.record
        assert [cluster.cluster_id for cluster in record.clusters()] == ["s1", "s2"]
        run_demo(state_dir, mesh.environment)
        report = asyncio.run(service_status(record.gateway))
        assert report.counters["routing_epoch"] == 1
        assert dict(report.info)["routing"] == "etcd"
        assert mesh.stop() == 0
