"""Real etcd and PostgreSQL: the session fixtures, the embedded servers' failure modes and
`oms infra`. Every server a test starts listens on a free 127.0.0.1 port and is stopped by
the test itself."""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from services.coordination.etcd_session import EtcdSession
from services.infra import command
from services.infra.embedded_etcd import EmbeddedEtcd, EmbeddedEtcdCluster
from services.infra.embedded_postgres import EmbeddedPostgres
from services.infra.errors import InfraError, PortTakenError
from services.infra.local_infra import InfraEndpoints, LocalInfra, ServerState
from services.infra.ports import (
    LOOPBACK,
    free_port,
    free_ports,
    listening_port_range,
    port_is_free,
    port_is_listening,
)
from services.infra.processes import pid_is_running
from services.infra.readiness import wait_until_ready
from services.infra.server_log import ServerLog
from services.infra.settings import InfraSettings
from services.settings import load_settings
from services.transport.development import DevelopmentTls

# Failures must be reported promptly, never after a hang or a full startup deadline.
PROMPTLY = 5.0


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else already listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((LOOPBACK, 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def no_external_infra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `oms infra` embed its servers even when CI points the session at external ones."""
    for name in ("OMS_ETCD_ENDPOINTS", "OMS_DATABASE_URL", "OMS_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)


async def test_database_fixture_answers_queries(database_url: str) -> None:
    connection = await asyncpg.connect(database_url, timeout=10)
    try:
        assert await connection.fetchval("SELECT 1") == 1
    finally:
        await connection.close()


async def test_etcd_fixture_stores_and_returns_a_key(etcd_endpoint: str) -> None:
    key = f"/tests/infra/{uuid.uuid4()}".encode()
    async with EtcdSession((etcd_endpoint,), timeout_s=10) as session:
        await session.put(key, b"value")
        stored = await session.get(key)
        await session.delete(key)
    assert stored is not None
    assert stored.value == b"value"


def test_infra_endpoints_fixture_combines_both(
    infra_endpoints: InfraEndpoints, etcd_endpoint: str, database_url: str
) -> None:
    assert infra_endpoints.etcd_endpoints[0] == etcd_endpoint
    assert infra_endpoints.database_url == database_url


def test_free_ports_are_distinct_and_busy_ports_are_recognised(busy_port: int) -> None:
    assert len(set(free_ports(8))) == 8
    assert port_is_listening(LOOPBACK, busy_port)
    assert not port_is_free(LOOPBACK, busy_port)
    assert not port_is_listening(LOOPBACK, free_port())


def test_one_process_never_hands_out_a_port_twice() -> None:
    # Picked one at a time with nothing bound in between, the kernel may repeat itself;
    # two services of one mesh must still never be given the same address.
    picked = [free_port() for _ in range(300)] + list(free_ports(50))
    assert len(set(picked)) == len(picked)


def test_servers_get_ports_no_outgoing_connection_can_take_first(busy_port: int) -> None:
    # An outgoing connection's source port comes from the ephemeral range and blocks a
    # later listen on that port, even with SO_REUSEADDR; picked ports stay below it.
    with socket.create_connection((LOOPBACK, busy_port)) as outgoing:
        source_port = int(outgoing.getsockname()[1])
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        assert source_port >= ephemeral_low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as late_server:
            late_server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):
                late_server.bind((LOOPBACK, source_port))
    assert listening_port_range().stop == ephemeral_low
    assert all(port in listening_port_range() for port in free_ports(50))


@pytest.mark.parametrize("taken", ["client", "peer"])
def test_etcd_on_a_busy_port_fails_promptly_naming_it(
    tmp_path: Path, busy_port: int, taken: str
) -> None:
    etcd = EmbeddedEtcd(
        tmp_path / "etcd",
        client_port=busy_port if taken == "client" else None,
        peer_port=busy_port if taken == "peer" else None,
    )
    began = time.monotonic()
    with pytest.raises(InfraError, match=rf"etcd {taken} port {busy_port} .* already in use"):
        etcd.start()
    assert time.monotonic() - began < PROMPTLY
    assert etcd.pid is None


def test_postgres_on_a_busy_port_fails_promptly_naming_it(tmp_path: Path, busy_port: int) -> None:
    postgres = EmbeddedPostgres(tmp_path / "postgres", port=busy_port, fast_unsafe=True)
    began = time.monotonic()
    with pytest.raises(InfraError, match=rf"postgres port {busy_port} .* already in use"):
        postgres.start()
    assert time.monotonic() - began < PROMPTLY
    assert postgres.pid is None


def test_picked_ports_taken_before_the_servers_start_are_picked_again(tmp_path: Path) -> None:
    etcd = EmbeddedEtcd(tmp_path / "etcd", unsafe_no_fsync=True)
    postgres = EmbeddedPostgres(tmp_path / "postgres", fast_unsafe=True)
    taken = (etcd.client_port, etcd.peer_port, postgres.port)
    with contextlib.ExitStack() as stack:
        for port in taken:  # what another process on the machine may do in the meantime
            holder = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            holder.bind((LOOPBACK, port))
            holder.listen()
        with etcd, postgres:
            assert not {etcd.client_port, etcd.peer_port, postgres.port} & set(taken)
            assert port_is_listening(LOOPBACK, etcd.client_port)
            assert port_is_listening(LOOPBACK, postgres.port)
            assert postgres.psql("SELECT 1") == "1"


@pytest.mark.parametrize(
    ("last_words", "taken"),
    [
        ("listen tcp 127.0.0.1:2380: bind: address already in use", True),
        ('LOG:  could not bind IPv4 address "127.0.0.1": Address already in use', True),
        ("FATAL:  data directory has wrong ownership", False),
    ],
)
def test_a_server_exiting_during_startup_says_whether_its_port_was_taken(
    tmp_path: Path, last_words: str, taken: bool
) -> None:
    log = ServerLog(tmp_path / "server.log")
    with log.open_for_run() as log_file:
        process = subprocess.Popen(
            [sys.executable, "-c", f"print({last_words!r}); raise SystemExit(1)"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    with pytest.raises(InfraError, match="exited with code 1 during startup") as raised:
        wait_until_ready(process, lambda: False, server="server", timeout=PROMPTLY, log=log)
    assert isinstance(raised.value, PortTakenError) == taken


def test_etcd_not_ready_by_its_deadline_is_stopped_and_reported(tmp_path: Path) -> None:
    etcd = EmbeddedEtcd(tmp_path / "etcd", unsafe_no_fsync=True, startup_timeout=0.0)
    with pytest.raises(InfraError, match=r"did not become ready within 0 s; last lines of"):
        etcd.start()
    assert etcd.pid is not None
    assert not pid_is_running(etcd.pid)


def _elected(cluster: EmbeddedEtcdCluster, other_than: EmbeddedEtcd | None = None) -> EmbeddedEtcd:
    deadline = time.monotonic() + 10.0
    while (leader := cluster.leader()) is None or leader is other_than:
        assert time.monotonic() < deadline, "no etcd leader elected"
        time.sleep(0.05)
    return leader


async def test_an_etcd_cluster_keeps_serving_without_a_killed_member_which_rejoins(
    tmp_path: Path,
) -> None:
    with EmbeddedEtcdCluster(tmp_path / "etcd", unsafe_no_fsync=True) as cluster:
        endpoints = cluster.endpoints
        assert len(set(endpoints)) == 3
        leader = _elected(cluster)
        pid = leader.pid
        assert pid is not None
        leader.kill()
        assert not pid_is_running(pid)
        _elected(cluster, other_than=leader)
        async with EtcdSession(endpoints) as session:
            await session.put(b"/written", b"while a member was down")
        leader.start()
        assert cluster.endpoints == endpoints  # the same ports, the same folder
        # Read from the restarted member alone: it caught up from its peers.
        async with EtcdSession((leader.endpoint,)) as session:
            written = await session.get(b"/written")
        assert written is not None and written.value == b"while a member was down"
        pids = [member.pid for member in cluster.members]
    assert not any(pid is not None and pid_is_running(pid) for pid in pids)


def test_an_etcd_cluster_whose_picked_port_is_taken_starts_on_others(tmp_path: Path) -> None:
    cluster = EmbeddedEtcdCluster(tmp_path / "etcd", unsafe_no_fsync=True)
    taken = cluster.members[1].peer_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((LOOPBACK, taken))
        holder.listen()
        with cluster:
            ports = {port for m in cluster.members for port in (m.client_port, m.peer_port)}
            assert taken not in ports and len(ports) == 6
            _elected(cluster)


def test_etcd_refuses_a_data_folder_another_etcd_holds(tmp_path: Path) -> None:
    with EmbeddedEtcd(tmp_path / "etcd", unsafe_no_fsync=True) as running:
        intruder = EmbeddedEtcd(tmp_path / "etcd", unsafe_no_fsync=True)
        with pytest.raises(InfraError, match="locked by another running etcd"):
            intruder.start()
        assert intruder.pid is None
        assert port_is_listening(LOOPBACK, running.client_port)


def test_postgres_recovers_a_data_folder_left_locked_by_a_dead_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "postgres"
    with EmbeddedPostgres(data_dir, fast_unsafe=True) as first:
        lock = (data_dir / "postmaster.pid").read_text()
        dead_pid = first.pid
    assert dead_pid is not None
    assert not pid_is_running(dead_pid)
    # What `kill -9` of a container leaves: the lock file of a postmaster that is gone,
    # still saying "ready".
    (data_dir / "postmaster.pid").write_text(lock)
    assert lock.split()[0] == str(dead_pid)

    with EmbeddedPostgres(data_dir, fast_unsafe=True) as second:
        assert second.psql("SELECT 1") == "1"
        assert (data_dir / "postmaster.pid").read_text().split()[0] == str(second.pid)


def test_postgres_refuses_a_data_folder_a_running_server_holds(tmp_path: Path) -> None:
    data_dir = tmp_path / "postgres"
    with EmbeddedPostgres(data_dir, fast_unsafe=True) as running:
        intruder = EmbeddedPostgres(data_dir, fast_unsafe=True)
        with pytest.raises(InfraError, match=rf"in use by a running postgres \(pid {running.pid}"):
            intruder.start()
        assert intruder.pid is None
        assert running.psql("SELECT 1") == "1"


def test_initdb_failure_quotes_its_output(tmp_path: Path) -> None:
    data_dir = tmp_path / "postgres"
    data_dir.mkdir()
    (data_dir / "leftover.txt").write_text("not a database")
    with pytest.raises(InfraError, match=r"initdb for .* exited") as raised:
        EmbeddedPostgres(data_dir, fast_unsafe=True).start()
    assert "not empty" in str(raised.value)


def test_postgres_exiting_during_startup_quotes_its_log(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(
        tmp_path / "postgres", fast_unsafe=True, server_settings={"shared_buffers": "plenty"}
    )
    with pytest.raises(InfraError, match=r"exited with code \d+ during startup") as raised:
        postgres.start()
    assert "shared_buffers" in str(raised.value)
    assert postgres.pid is not None
    assert not pid_is_running(postgres.pid)


def test_local_infra_up_is_idempotent_and_down_stops_everything(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    infra = LocalInfra(state_dir, fast_unsafe=True)
    try:
        endpoints = infra.up()
        etcd, postgres = infra.status()
        assert (etcd.state, postgres.state) == (ServerState.RUNNING, ServerState.RUNNING)
        assert endpoints == InfraEndpoints(
            etcd_endpoints=(str(etcd.endpoint),),
            database_url=str(postgres.endpoint),
            embedded=True,
        )
        assert (state_dir / "infra.json").is_file()

        # A second `up`, as from another command: reuses the same servers.
        again = LocalInfra(state_dir, fast_unsafe=True)
        assert again.up() == endpoints
        assert [status.pid for status in again.status()] == [etcd.pid, postgres.pid]

        stopped = infra.down()
        assert [status.state for status in stopped] == [ServerState.STOPPED] * 2
        assert [status.state for status in infra.status()] == [ServerState.STOPPED] * 2
        for pid in (etcd.pid, postgres.pid):
            assert pid is not None
            assert not pid_is_running(pid)
    finally:
        infra.down()


def test_a_state_folder_keeps_the_tls_its_etcd_was_set_up_with(tmp_path: Path) -> None:
    """`oms up` sets its etcd up with TLS (and auth, in etcd's store); a later `oms up
    --plaintext` on the folder is refused with the reason, and a tool that only wants
    the servers up (`oms infra up`, the benchmarks) starts etcd with TLS again."""
    state_dir = tmp_path / "state"
    unused_database = "postgresql://unused@127.0.0.1:1/none"  # etcd alone is started
    files = DevelopmentTls.under(state_dir).etcd_server_tls()
    infra = LocalInfra(state_dir, database_url=unused_database, fast_unsafe=True, etcd_tls=files)
    try:
        (endpoint,) = infra.up().etcd_endpoints
        assert endpoint.startswith("https://127.0.0.1:")
        infra.down()
        plaintext = LocalInfra(state_dir, database_url=unused_database, etcd_tls=None)
        with pytest.raises(InfraError, match="set up with TLS"):
            plaintext.up()
        as_recorded = LocalInfra(state_dir, database_url=unused_database, fast_unsafe=True)
        assert as_recorded.up().etcd_endpoints == (endpoint,)
    finally:
        infra.down()


def test_local_infra_uses_endpoints_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMS_ETCD_ENDPOINTS", "10.0.0.7:2379,10.0.0.8:2379")
    monkeypatch.setenv("OMS_DATABASE_URL", "postgresql://oms:secret@db.internal:5432/oms")
    monkeypatch.setenv("OMS_STATE_DIR", str(tmp_path / "state"))
    infra = LocalInfra.from_settings(load_settings(InfraSettings))

    assert infra.up() == InfraEndpoints(
        etcd_endpoints=("10.0.0.7:2379", "10.0.0.8:2379"),
        database_url="postgresql://oms:secret@db.internal:5432/oms",
        embedded=False,
    )
    assert not (tmp_path / "state" / "etcd").exists()
    assert not (tmp_path / "state" / "postgres").exists()
    assert [command.format_status(status) for status in infra.status()] == [
        "etcd       external 10.0.0.7:2379,10.0.0.8:2379  (from OMS_ETCD_ENDPOINTS)",
        "postgres   external postgresql://oms:***@db.internal:5432/oms  (from OMS_DATABASE_URL)",
    ]


def test_command_line_starts_reports_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_external_infra: None
) -> None:
    state_dir = tmp_path / "state"

    def oms(action: str) -> tuple[int, list[str]]:
        parser = argparse.ArgumentParser(prog="oms")
        command.register(parser.add_subparsers(dest="command", required=True))
        arguments = parser.parse_args(["infra", action, "--state-dir", str(state_dir)])
        exit_code = arguments.handler(arguments)
        captured = capsys.readouterr()
        # readouterr() consumes stderr, so a failing action would otherwise hide its reason.
        assert exit_code in (0, command.EXIT_NOT_RUNNING), captured.err
        return exit_code, captured.out.splitlines()

    try:
        exit_code, started = oms("up")
        assert exit_code == 0
        assert len(started) == 2
        assert re.fullmatch(
            r"etcd       running  127\.0\.0\.1:\d+  pid \d+  \(embedded, data \S+/state/etcd\)",
            started[0],
        )
        assert re.fullmatch(
            r"postgres   running  postgresql://postgres@127\.0\.0\.1:\d+/oms  pid \d+"
            r"  \(embedded, data \S+/state/postgres\)",
            started[1],
        )
        assert oms("status") == (0, started)
    finally:
        exit_code, stopped = oms("down")
    assert exit_code == 0
    assert [line.split()[:3] for line in stopped] == [
        ["etcd", "stopped", "-"],
        ["postgres", "stopped", "-"],
    ]
    assert oms("status") == (command.EXIT_NOT_RUNNING, stopped)
