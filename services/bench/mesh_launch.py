"""A whole local mesh for a benchmark: `oms up` on a throwaway state folder.

Started as a child process exactly as `make run` starts it (separate service
processes under the supervisor, embedded etcd and PostgreSQL), found through
`state_dir/mesh.json`, and stopped with SIGINT like a developer's Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.infra.local_infra import LocalInfra, ServerState
from services.mesh.mesh_record import MeshRecord, read_mesh_record
from services.transport.development import adopt_mesh_transports
from services.transport.grpc_runtime import GRPC_EXPERIMENTS
from services.transport.tls import client_transport, mesh_transport

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


class MeshLaunchError(RuntimeError):
    pass


class LaunchedMesh:
    def __init__(
        self,
        state_dir: Path,
        *,
        replicas: int = 1,
        shards: int = 1,
        active: int | None = None,
        plaintext: bool = False,
        grpc_experiments: str | None = None,
        colocated: bool = False,
    ) -> None:
        self.state_dir = state_dir
        # GRPC_EXPERIMENTS for every service ("": gRPC's defaults); None: as inherited.
        self.grpc_experiments = grpc_experiments
        self.colocated = colocated  # `oms up --colocate`: a shard cluster in one process
        self.plaintext = plaintext  # `oms up --plaintext`: no TLS on any link
        self.replicas = replicas  # of the shard and of each matcher group (`oms up --replicas`)
        self.shards = shards  # user-shard clusters (`oms up --shards`)
        self.active = active  # of them active in the first routing document (`--active`)
        self.log_path = state_dir / "mesh.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.record: MeshRecord | None = None
        self.database_url = ""
        self.etcd_endpoints: tuple[str, ...] = ()
        self.server_pids: dict[str, int] = {}  # the embedded etcd's and PostgreSQL's

    def __enter__(self) -> LaunchedMesh:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        environment = {
            key: value
            for key, value in os.environ.items()
            if key not in ("OMS_ETCD_ENDPOINTS", "OMS_DATABASE_URL")
        }
        # Every service answers channelz: the bench counts messages per connection.
        environment["OMS_CHANNELZ"] = "on"
        if self.grpc_experiments is not None:
            environment[GRPC_EXPERIMENTS] = self.grpc_experiments
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.command_line",
                    "up",
                    "--state-dir",
                    str(self.state_dir),
                    "--replicas",
                    str(self.replicas),
                    "--shards",
                    str(self.shards),
                    *(["--active", str(self.active)] if self.active is not None else []),
                    *(["--plaintext"] if self.plaintext else []),
                    *(["--colocate"] if self.colocated else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise MeshLaunchError(f"oms up exited; see {self.log_path}")
            if time.monotonic() > deadline:
                raise MeshLaunchError(
                    f"mesh not serving in {START_TIMEOUT_S:g} s; see {self.log_path}"
                )
            record = read_mesh_record(self.state_dir)
            if record is not None:
                # This process reaches the mesh as `oms up`'s tools do.
                adopt_mesh_transports(self.state_dir, tls=record.tls)
            # Every replica serves health, followers too: all of them up, then the
            # gateway still waits for the leaders through etcd on the first orders.
            if record is not None and all(
                _serving(address, gateway=address == record.gateway)
                for address in (
                    record.gateway,
                    *(a for cluster in record.clusters() for a in cluster.shard_replicas()),
                    *(cluster.persister for cluster in record.clusters()),
                    *(cluster.bridge for cluster in record.clusters()),
                    *(a for group in record.matchers for a in record.matcher_replicas(group)),
                )
            ):
                self.record = record
                infra = LocalInfra(self.state_dir).up()
                self.database_url = infra.database_url
                self.etcd_endpoints = tuple(infra.etcd_endpoints)
                # Once: asking their status connects to them (PostgreSQL forks a backend).
                self.server_pids = {
                    server.name: server.pid
                    for server in LocalInfra(self.state_dir).status()
                    if server.pid is not None and server.state is ServerState.RUNNING
                }
                return
            time.sleep(0.2)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        LocalInfra(self.state_dir).down()

    def service_processes(self) -> dict[str, list[int]]:
        """The process ids of each service ("shard", "matcher-g1", ...; a service with
        several replicas or clusters has several)."""
        if self.process is None:
            return {}
        found: dict[str, list[int]] = {}
        for pid in _children(self.process.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # exited meanwhile
            name = _service_name([part.decode(errors="replace") for part in argv])
            if name:
                found.setdefault(name, []).append(pid)
        return found

    def service_addresses(self) -> dict[str, list[str]]:
        """One gRPC address of each process of each service, named as
        `service_processes` names them (a co-located cluster is one "shard" process)."""
        record = self.record
        if record is None:
            return {}
        addresses: dict[str, list[str]] = {"gateway": [record.gateway]}
        for cluster in record.clusters():
            addresses.setdefault("shard", []).extend(cluster.shard_replicas())
            if not record.colocated:
                for role in ("persister", "bridge", "reconciler"):
                    addresses.setdefault(role, []).append(getattr(cluster, role))
        for group in record.matchers:
            addresses[f"matcher-{group}"] = list(record.matcher_replicas(group))
        return addresses

    def role_addresses(self, role: str) -> list[str]:
        """Where each cluster's `role` (persister, bridge, reconciler) listens (beside
        each shard replica, co-located and replicated)."""
        record = self.record
        if record is None:
            return []
        return [
            address for cluster in record.clusters() for address in cluster.role_addresses(role)
        ]

    def listening_ports(self) -> dict[int, str]:
        """Which process (as `service_processes` names it) listens on each port."""
        record = self.record
        ports = {
            int(address.rpartition(":")[2]): name
            for name, addresses in self.service_addresses().items()
            for address in addresses
        }
        for role in ("persister", "bridge", "reconciler"):
            for address in self.role_addresses(role):
                owner = "shard" if record is not None and record.colocated else role
                ports[int(address.rpartition(":")[2])] = owner
        return ports

    def service_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each process of the mesh has used so far: every
        service, and the embedded etcd and PostgreSQL (the server and all its backends)."""
        used: dict[str, float] = {}
        for name, pids in self.service_processes().items():
            used[name] = sum(_cpu_seconds(pid) for pid in pids)
        for name, pid in self.server_pids.items():
            # PostgreSQL's backends come and go: the server's own count includes the
            # children it has reaped, and the live ones are added.
            used[name] = _cpu_seconds(pid, with_reaped=True) + sum(
                _cpu_seconds(child) for child in _children(pid)
            )
        return used


def _cpu_seconds(pid: int, *, with_reaped: bool = False) -> float:
    """User + system CPU seconds of one process (0 once it has exited); `with_reaped`:
    and of its children that have exited and been waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _service_name(argv: list[str]) -> str:
    """ "shard", "matcher-g1", ... from `python -m services.command_line <service> ...`."""
    if "services.command_line" not in argv:
        return ""
    rest = argv[argv.index("services.command_line") + 1 :]
    if not rest:
        return ""
    if rest[0] == "matcher" and "--group" in rest:
        return f"matcher-{rest[rest.index('--group') + 1]}"
    return rest[0]


def _serving(address: str, *, gateway: bool) -> bool:
    transport = client_transport() if gateway else mesh_transport()
    try:
        with transport.blocking_channel(address, ()) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0
            )
    except grpc.RpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)
