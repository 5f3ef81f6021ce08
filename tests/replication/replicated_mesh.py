"""`oms up --replicas 3` as a test harness: the replicated mesh exactly as a developer
runs it (supervised children; three replicas of the shard and of each matcher group
over logs in etcd), on an etcd and a database of its own. Other shapes too
(`replicas`, `shards`: `oms up --shards 2`).

Its own etcd, not the session's: each state folder is a mesh of its own id (its keys
under /oms/v1/<mesh id>/), and a mesh's keys are never deleted, so the session's etcd
would keep every replicated mesh's logs and leases to the end of the run.

Everything is found through `state_dir/mesh.json`; a group's leader through the
replicas' `oms.v1.Status`. Plaintext (`oms up --plaintext`), like the rest of the
suite, unless `tls`: then `oms up`'s default, every link TLS and its own embedded etcd
(mutual TLS, auth on), the status read as the local tools (`transport`). Stopping
sends SIGINT like Ctrl-C, and always reaps.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc

from services.infra.embedded_etcd import EmbeddedEtcd
from services.mesh.mesh_record import MeshRecord, read_mesh_record
from services.transport.development import DevelopmentTls
from services.transport.tls import MeshTransport
from tests.databases import drop_database, fresh_database
from tests.replication.replica_set import ReplicaStatus, status_of

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


class ReplicatedMesh:
    def __init__(
        self,
        state_dir: Path,
        server_url: str,
        environment: dict[str, str] | None = None,
        *,
        replicas: int = 3,
        shards: int = 1,
        colocated: bool = False,
        tls: bool = False,
    ) -> None:
        self.replicas = replicas
        self.tls = tls
        self.transport: MeshTransport | None = None  # set once up, with tls
        self.shards = shards
        # `oms up --colocate`: a persister, bridge and reconciler beside each shard replica.
        self.colocated = colocated
        self.state_dir = state_dir
        self.server_url = server_url
        self.database_url = ""
        # No fsync: the data dies with the test.
        self.etcd = EmbeddedEtcd(state_dir.parent / "etcd", unsafe_no_fsync=True)
        self.environment = {**os.environ, "PYTHONPATH": str(ROOT), **(environment or {})}
        self.process: subprocess.Popen[str] | None = None
        self.output: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []

    @property
    def record(self) -> MeshRecord:
        record = read_mesh_record(self.state_dir)
        assert record is not None and record.replicas == self.replicas, record
        assert record.shards == self.shards, record
        return record

    def __enter__(self) -> Self:
        try:
            if self.tls:
                self.environment.pop("OMS_ETCD_ENDPOINTS", None)  # `oms up` embeds its own
            else:
                self.etcd.start()
                self.environment["OMS_ETCD_ENDPOINTS"] = self.etcd.endpoint
            self.database_url = fresh_database(self.server_url)
            self.environment["OMS_DATABASE_URL"] = self.database_url
            command = [sys.executable, "-m", "services.command_line", "up"]
            command += ["--replicas", str(self.replicas), "--shards", str(self.shards)]
            # Replication and sharding are what these tests are about, read through the
            # replicas' status in plaintext; `tests/mesh/test_oms_up.py` runs TLS's default.
            command += [] if self.tls else ["--plaintext"]
            command += ["--colocate"] if self.colocated else []
            self.process = subprocess.Popen(
                [*command, "--state-dir", str(self.state_dir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.environment,
                cwd=ROOT,
            )
            threading.Thread(target=self._pump, daemon=True).start()
            self.wait_printed("[mesh] all services serving", START_TIMEOUT_S)
            if self.tls:
                self.transport = DevelopmentTls.under(self.state_dir).operator_transport()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.put(line)

    def wait_printed(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.output.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            if needle in line:
                return
        raise AssertionError(f"{needle!r} not printed; output so far:\n{''.join(self.seen)}")

    def stop(self) -> int:
        """Ctrl-C; the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.database_url:
            drop_database(self.server_url, self.database_url)
        self.etcd.stop()


def statuses(
    addresses: list[str], transport: MeshTransport | None = None
) -> dict[str, ReplicaStatus]:
    found = {}
    for address in addresses:
        with contextlib.suppress(grpc.RpcError):
            found[address] = status_of(address, transport=transport)
    return found


def leader_of(addresses: list[str], transport: MeshTransport | None = None) -> tuple[str, int]:
    """The leading replica's address and term."""
    for address, status in statuses(addresses, transport).items():
        if status.leading:
            return address, status.term
    raise AssertionError(f"none of {addresses} leads")


def wait_new_term(
    addresses: list[str],
    old_term: int,
    timeout_s: float = 30.0,
    transport: MeshTransport | None = None,
) -> str:
    """The address of a leader of a newer term than `old_term`, once there is one."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(AssertionError):
            address, term = leader_of(addresses, transport)
            if term > old_term:
                return address
        assert time.monotonic() < deadline, f"no term after {old_term} among {addresses}"
        time.sleep(0.1)


def kill_replica(address: str) -> None:
    """SIGKILL the replica listening on `address` (its supervisor starts it again)."""
    killed = subprocess.run(["pkill", "-9", "-f", f"listen {address}"], check=False)
    assert killed.returncode == 0, f"no process listens on {address}"


def wait_same_checkpoint(addresses: list[str], timeout_s: float = 30.0) -> int:
    """Until every replica has recorded a hash at one common checkpoint position, and
    they are all equal there; that position."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = statuses(addresses)
        if len(found) == len(addresses):
            recorded = [
                dict(item.split(":") for item in status.checkpoints.split(",") if item)
                for status in found.values()
            ]
            common = set(recorded[0]).intersection(*recorded[1:])
            if common:
                position = max(common, key=int)
                hashes = {hashes_at[position] for hashes_at in recorded}
                assert len(hashes) == 1, f"replicas differ at position {position}: {found}"
                return int(position)
        assert time.monotonic() < deadline, f"no common checkpoint: {found}"
        time.sleep(0.2)
