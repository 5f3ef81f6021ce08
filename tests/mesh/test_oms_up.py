"""`oms up` (what `make run` runs) brings the whole mesh up, `oms demo` trades on it, and
Ctrl-C stops everything cleanly."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
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
from tests.replication.replicated_mesh import (
    ReplicatedMesh,
    kill_replica,
    leader_of,
    wait_new_term,
)

ROOT = Path(__file__).resolve().parents[2]


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        if process.stdout is None:
            return
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], needle: str, seen: list[str], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not printed; output so far:\n{''.join(seen)}")


@pytest.mark.slow
def test_oms_up_runs_the_mesh_the_demo_trades_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("OMS_ETCD_ENDPOINTS", "OMS_DATABASE_URL")
    }
    environment["PYTHONPATH"] = str(ROOT)
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
        lines = _lines(process)
        _wait_for(lines, "press Ctrl-C", seen, 60)
        _wait_for(lines, "[mesh] all services serving", seen, 90)
        running = {status.name: status.state for status in LocalInfra(state_dir).status()}
        assert running == {"etcd": ServerState.RUNNING, "postgres": ServerState.RUNNING}
        # TLS by default: the demo reached the gateway by the development authority and
        # every service reached the others by their certificates; a plaintext caller
        # is refused by the gateway and by the shard alike.
        shown = _demo(state_dir, environment)
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
        _wait_for(lines, "[mesh] stopped", seen, 10)
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


def _demo(state_dir: Path, environment: dict[str, str]) -> str:
    """`oms demo` against the mesh of `state_dir`, checked; what it printed."""
    demo = subprocess.run(
        [sys.executable, "-m", "services.command_line", "demo", "--state-dir", str(state_dir)],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "alice   update ORDER_STATUS_FILLED" in demo.stdout, demo.stdout
    assert "bob     update ORDER_STATUS_CANCELLED" in demo.stdout, demo.stdout
    return demo.stdout


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
        _demo(state_dir, mesh.environment)
        record = mesh.record
        groups = (record.shard_replicas(), record.matcher_replicas("g1"))
        terms = [leader_of(replicas, mesh.transport) for replicas in groups]
        for address, _ in terms:
            kill_replica(address)
        for replicas, (_, term) in zip(groups, terms, strict=True):
            wait_new_term(replicas, term, transport=mesh.transport)
        _demo(state_dir, mesh.environment)
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
        _demo(state_dir, mesh.environment)
        report = asyncio.run(service_status(record.gateway))
        assert report.counters["routing_epoch"] == 1
        assert dict(report.info)["routing"] == "etcd"
        assert mesh.stop() == 0
