"""`oms up` (what `make run` runs) brings the whole mesh up, `oms demo` trades on it, and
Ctrl-C stops everything cleanly."""

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

import grpc
import pytest

from services.infra.local_infra import LocalInfra, ServerState
from services.mesh.mesh_record import read_mesh_record
from tests.databases import drop_database, fresh_database
from tests.replication.replica_set import status_of

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
        assert "USDT  total           80,461.00 USDT" in demo.stdout, demo.stdout
        assert "bob     update ORDER_STATUS_CANCELLED" in demo.stdout, demo.stdout
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


def _leader_of(addresses: list[str]) -> tuple[str, int]:
    """The leading replica's address and term."""
    for address in addresses:
        try:
            status = status_of(address)
        except grpc.RpcError:
            continue
        if status.leading:
            return address, status.term
    raise AssertionError(f"none of {addresses} leads")


def _wait_new_term(addresses: list[str], old_term: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(AssertionError):
            if _leader_of(addresses)[1] > old_term:
                return
        assert time.monotonic() < deadline, f"no term after {old_term} among {addresses}"
        time.sleep(0.1)


def _demo(state_dir: Path, environment: dict[str, str]) -> None:
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


@pytest.mark.slow
def test_oms_up_with_three_replicas_trades_through_the_leaders_kills(
    tmp_path: Path, etcd_endpoints: tuple[str, ...], database_url: str
) -> None:
    """`oms up --replicas 3` on the session's etcd and a database of its own: the demo
    trades; the shard's and a matcher group's leaders are killed; the supervisor
    restarts them as followers, new leaders are elected, every service finds them in
    etcd, and the demo trades again."""
    state_dir = tmp_path / "state"
    own_database = fresh_database(database_url)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment["OMS_ETCD_ENDPOINTS"] = ",".join(etcd_endpoints)
    environment["OMS_DATABASE_URL"] = own_database
    command = [sys.executable, "-m", "services.command_line", "up", "--replicas", "3"]
    process = subprocess.Popen(
        [*command, "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=ROOT,
    )
    seen: list[str] = []
    try:
        lines = _lines(process)
        _wait_for(lines, "[mesh] all services serving", seen, 120)
        _demo(state_dir, environment)
        record = read_mesh_record(state_dir)
        assert record is not None and record.replicas == 3
        shard_leader = _leader_of(record.shard_replicas())
        matcher_leader = _leader_of(record.matcher_replicas("g1"))
        for address, _ in (shard_leader, matcher_leader):
            pattern = f"listen {address}"
            assert subprocess.run(["pkill", "-9", "-f", pattern], check=False).returncode == 0
        _wait_new_term(record.shard_replicas(), shard_leader[1])
        _wait_new_term(record.matcher_replicas("g1"), matcher_leader[1])
        _demo(state_dir, environment)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        drop_database(database_url, own_database)
