"""PostgreSQL crashed under a trading load, with fsync on: nothing lost, nothing twice.

The mesh has a PostgreSQL server of its own, durable (fsync and synchronous commit
on, unlike the suite's shared server). Under the load, the server is crashed twice
while the persister writes: first `pg_ctl stop -m immediate` (no checkpoint, crash
recovery at the next start), then SIGKILL of the server and every backend. Each
time the trading goes on without it (nothing on the hot path reads the database)
while the persister's transactions fail, some of them at their commit, whose outcome
it cannot know; then the server is started again on its folder, recovers from its
WAL, and the persister writes on from where it is. Afterwards: the mesh's
invariants with every acknowledged order (the persister's duplicate and refusal
oracles among them), each acknowledged order exactly once in PostgreSQL, and the
independent auditor on the flat mesh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.infra.embedded_postgres import EmbeddedPostgres
from services.infra.postgres_account import postgres_account
from services.infra.postgres_binaries import postgres_binary
from tests.e2e.gateway_load import GatewayOrderLoad, load_accounts, run_load_until
from tests.e2e.test_database_outage import children
from tests.e2e.test_faults import (
    AFTER_FAULT,
    BEFORE_FAULT,
    DURING_FAULT,
    LOAD_USERS,
    check_after_fault,
)
from tests.full_mesh import FullMesh
from tests.server_folders import server_reachable_folder
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
STOP_S = 30.0
LOCK_CHECK_S = 15.0  # it checks its lock's connection every second, then stops


@pytest.fixture
def durable_postgres() -> Iterator[EmbeddedPostgres]:
    with server_reachable_folder("oms-crash-postgres-") as data_dir:
        postgres = EmbeddedPostgres(data_dir)  # fsync, synchronous_commit, full pages: on
        postgres.start()
        try:
            yield postgres
        finally:
            postgres.stop()


@pytest.fixture
def restarted(durable_postgres: EmbeddedPostgres) -> Iterator[list[RestartedServer]]:
    """The servers the test starts again; stopped after the mesh (which needs one to drop
    its database) and before the first server's fixture ends."""
    servers: list[RestartedServer] = []
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
async def mesh(
    durable_postgres: EmbeddedPostgres,
    restarted: list[RestartedServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[FullMesh]:
    mesh = FullMesh.create(tmp_path_factory.mktemp("crash-mesh"), durable_postgres.url)
    await asyncio.to_thread(mesh.start)
    try:
        yield mesh
    finally:
        mesh.stop()


def recorded_pid(data_dir: Path) -> int | None:
    """The postmaster's pid, as its postmaster.pid says, or None."""
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        return int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    return None


def crash_immediately(data_dir: Path) -> None:
    """`pg_ctl stop -m immediate`: every process quits at once, no checkpoint."""
    command = [str(postgres_binary("pg_ctl")), "stop", "-m", "immediate", "-D", str(data_dir)]
    account = postgres_account()
    if account is not None:
        command = ["runuser", "-u", account.name, "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=STOP_S)


def crash_by_sigkill(data_dir: Path) -> None:
    """SIGKILL the postmaster and every backend, as the OOM killer or a power cut would."""
    pid = recorded_pid(data_dir)
    assert pid is not None, "no postmaster recorded"
    # Held before the kill: its parent (the restarter) reaps it at once, and a pid
    # reaped cannot be opened any more.
    descriptor = os.pidfd_open(pid)
    try:
        for victim in [pid, *children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        select.select([descriptor], [], [], STOP_S)
    finally:
        os.close(descriptor)


class RestartedServer:
    """PostgreSQL started again by `postgres_restart.py`, which stays its parent."""

    def __init__(self, postgres: EmbeddedPostgres) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.postgres_restart", str(postgres.data_dir),
             str(postgres.port)],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        ready = False
        for line in self.process.stdout:  # its log lines come first, then "ready <pid>"
            if line.startswith(b"ready"):
                ready = True
                break
        if not ready:  # it exited
            _, errors = self.process.communicate(timeout=WAIT_S)
            raise AssertionError(f"postgres did not start again: {errors.decode()[-3000:]}")

    def reap(self) -> None:
        """After a crash: the parent has reaped the server; reap the parent."""
        self.process.wait(timeout=STOP_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.communicate(timeout=STOP_S)


async def test_postgres_crashed_twice_under_load_loses_and_doubles_nothing(
    durable_postgres: EmbeddedPostgres, restarted: list[RestartedServer], mesh: FullMesh
) -> None:
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, LOAD_USERS)
    load = GatewayOrderLoad(mesh.gateway.address, accounts, seed=11)
    data_dir = durable_postgres.data_dir

    async def crashes() -> None:
        await load.wait_accepted(BEFORE_FAULT)
        for crash in (crash_immediately, crash_by_sigkill):
            crashed_at = time.monotonic()
            await asyncio.to_thread(crash, data_dir)
            # Reap the crashed server (its pid, a zombie, would hold its socket's lock
            # file against the next start): the first is this process's child, the
            # next the restarter's.
            durable_postgres.stop()
            for server in restarted:
                await asyncio.to_thread(server.reap)
            # Trading goes on while the persister's transactions fail.
            await load.wait_accepted(len(load.acknowledged) + DURING_FAULT, timeout_s=WAIT_S)
            started_at = time.monotonic()
            restarted.append(await asyncio.to_thread(RestartedServer, durable_postgres))
            recovery_s = time.monotonic() - started_at
            # A persister whose lock's connection broke stops (crash-only: another may
            # already write); its supervisor starts it again, as here.
            await asyncio.to_thread(restart_if_stopped, mesh.persister)
            await load.wait_accepted(len(load.acknowledged) + AFTER_FAULT, timeout_s=WAIT_S)
            print(
                f"{crash.__name__}: PostgreSQL down {started_at - crashed_at:.2f} s, its"
                f" restart (crash recovery) {recovery_s:.2f} s, longest wait for an accepted"
                f" order {load.longest_pause_s(crashed_at):.2f} s"
            )  # shown with -s

    await run_load_until(load, crashes)
    await check_persister_met_the_crashes(mesh)
    await check_after_fault(mesh, load)


async def check_persister_met_the_crashes(mesh: FullMesh) -> None:
    log = mesh.persister.log_path.read_text(errors="replace")
    lost = log.count('"event": "persister.shard_lock_lost"')
    failed = log.count('"event": "persister.store_unavailable"')
    print(f"persister: {mesh.persister.incarnations} incarnations, lock lost {lost} times,"
          f" {failed} writes failed and retried")  # fmt: skip
    # Each crash stopped the persister (its lock's connection broke, or a write failed
    # in a way it does not retry), and it was started again.
    assert mesh.persister.incarnations == 3, mesh.persister.incarnations
    assert lost >= 1, lost


def restart_if_stopped(process: ServiceProcess, wait_s: float = LOCK_CHECK_S) -> None:
    """Start `process` again if it stops within `wait_s`, as its supervisor would."""
    deadline = time.monotonic() + wait_s
    while process.running():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    process.start_serving()
