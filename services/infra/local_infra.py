"""The etcd and PostgreSQL a developer runs locally: started by `oms infra up`, found again later.

Servers run detached (own session) so they outlive the command that started them; pids,
ports and data folders go to `state_dir/infra.json`. Endpoints given through
OMS_ETCD_ENDPOINTS / OMS_DATABASE_URL replace the embedded server of that kind.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.infra.embedded_etcd import EmbeddedEtcd, EtcdServerTls
from services.infra.embedded_postgres import EmbeddedPostgres
from services.infra.errors import InfraError
from services.infra.infra_record import (
    EtcdRecord,
    InfraRecord,
    PostgresRecord,
    read_record,
    write_record,
)
from services.infra.ports import LOOPBACK, port_is_free, port_is_listening
from services.infra.processes import pid_runs, stop_pid
from services.infra.settings import InfraSettings
from services.transport.development import DevelopmentTls

ETCD = "etcd"
POSTGRES = "postgres"
_LOCK_TIMEOUT = 300.0
_LOCK_POLL_INTERVAL = 0.1
_ETCD_STOP_TIMEOUT = 10.0
_POSTGRES_STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class InfraEndpoints:
    """Where services find etcd and PostgreSQL.

    `embedded` is True when both are servers this project started itself (LocalInfra or the
    test fixtures), False when either came from the environment.
    """

    etcd_endpoints: tuple[str, ...]
    database_url: str
    embedded: bool


class ServerState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    # The process lives but its port does not answer: starting, hung, or shutting down.
    UNRESPONSIVE = "unresponsive"
    EXTERNAL = "external"


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: ServerState
    endpoint: str | None
    pid: int | None
    data_dir: Path | None
    source: str


class EtcdTlsAsRecorded(enum.Enum):
    """`LocalInfra(etcd_tls=AS_RECORDED)`: TLS for etcd as the state folder's record says."""

    AS_RECORDED = "as recorded"


AS_RECORDED = EtcdTlsAsRecorded.AS_RECORDED


class LocalInfra:
    def __init__(
        self,
        state_dir: Path,
        *,
        etcd_endpoints: tuple[str, ...] = (),
        database_url: str = "",
        fast_unsafe: bool = False,
        startup_timeout: float = 30.0,
        etcd_tls: EtcdServerTls | EtcdTlsAsRecorded | None = AS_RECORDED,
    ) -> None:
        """`etcd_endpoints` / `database_url`, when given, are used instead of embedded servers.

        `fast_unsafe` trades durability for speed (no fsync); meant for throwaway state dirs.
        `etcd_tls`: the embedded etcd's client port on mutual TLS with these files (`oms
        up`), None for plaintext (`oms up --plaintext`), or as the state folder's record
        says (`oms infra up`, the benchmarks: a folder whose etcd was set up with TLS
        starts it again with the development authority's files under `state_dir/tls`).
        """
        self.state_dir = state_dir.resolve()
        self.etcd_tls = etcd_tls
        self.external_etcd = etcd_endpoints
        self.external_database_url = database_url
        self.fast_unsafe = fast_unsafe
        self.startup_timeout = startup_timeout

    @classmethod
    def from_settings(
        cls,
        settings: InfraSettings,
        *,
        etcd_tls: EtcdServerTls | EtcdTlsAsRecorded | None = AS_RECORDED,
    ) -> LocalInfra:
        return cls(
            settings.state_dir,
            etcd_endpoints=settings.etcd_endpoints,
            database_url=settings.database_url,
            etcd_tls=etcd_tls,
        )

    @property
    def state_file(self) -> Path:
        return self.state_dir / "infra.json"

    @property
    def etcd_dir(self) -> Path:
        return self.state_dir / ETCD

    @property
    def postgres_dir(self) -> Path:
        return self.state_dir / POSTGRES

    def up(self) -> InfraEndpoints:
        """Start whatever is not running yet; reuse what is. Starts nothing on failure."""
        with self._exclusive():
            record = read_record(self.state_file)
            etcd, postgres = record.etcd, record.postgres
            etcd_endpoints, database_url = self.external_etcd, self.external_database_url
            started: list[Callable[[], None]] = []
            try:
                if not etcd_endpoints:
                    etcd = self._ensure_etcd(record, started)
                    etcd_endpoints = (etcd.endpoint,)
                if not database_url:
                    postgres = self._ensure_postgres(record, started)
                    database_url = postgres.url
            except BaseException:
                # Leave nothing half-up: stop whatever this call started.
                for stop in reversed(started):
                    stop()
                raise
            write_record(self.state_file, InfraRecord(etcd=etcd, postgres=postgres))
        return InfraEndpoints(
            etcd_endpoints=etcd_endpoints,
            database_url=database_url,
            embedded=not (self.external_etcd or self.external_database_url),
        )

    def down(self) -> list[ServerStatus]:
        """Stop the servers `up` started (even ones now overridden by the environment)."""
        with self._exclusive():
            record = read_record(self.state_file)
            if record.etcd is not None and record.etcd.pid is not None:
                _stop_recorded(
                    record.etcd.pid, record.etcd.data_dir, signal.SIGTERM, _ETCD_STOP_TIMEOUT
                )
            if record.postgres is not None and record.postgres.pid is not None:
                _stop_recorded(
                    record.postgres.pid,
                    record.postgres.data_dir,
                    signal.SIGINT,
                    _POSTGRES_STOP_TIMEOUT,
                )
            if self.state_file.exists():
                write_record(self.state_file, record.stopped())
            stopped = record.stopped()
        return [self._etcd_status(stopped.etcd), self._postgres_status(stopped.postgres)]

    def status(self) -> list[ServerStatus]:
        """One status per server, in the order etcd, postgres."""
        record = read_record(self.state_file)
        etcd = (
            ServerStatus(
                ETCD,
                ServerState.EXTERNAL,
                ",".join(self.external_etcd),
                None,
                None,
                "from OMS_ETCD_ENDPOINTS",
            )
            if self.external_etcd
            else self._etcd_status(record.etcd)
        )
        postgres = (
            ServerStatus(
                POSTGRES,
                ServerState.EXTERNAL,
                self.external_database_url,
                None,
                None,
                "from OMS_DATABASE_URL",
            )
            if self.external_database_url
            else self._postgres_status(record.postgres)
        )
        return [etcd, postgres]

    def _ensure_etcd(self, record: InfraRecord, started: list[Callable[[], None]]) -> EtcdRecord:
        previous = record.etcd
        etcd_tls = self.etcd_tls
        if isinstance(etcd_tls, EtcdTlsAsRecorded):
            recorded_tls = previous is not None and previous.tls
            etcd_tls = (
                DevelopmentTls.under(self.state_dir).etcd_server_tls() if recorded_tls else None
            )
        tls = etcd_tls is not None
        if previous is not None:
            state = _state(previous.pid, previous.data_dir, previous.client_port)
            if state is ServerState.RUNNING and previous.tls == tls:
                return previous
            if previous.tls and not tls:
                raise InfraError(
                    f"the etcd under {self.state_dir} was set up with TLS and its auth on "
                    "(users named by certificates): start it with TLS again (no --plaintext) "
                    "or use another state folder"
                )
            if state is ServerState.RUNNING:
                raise InfraError(
                    f"the etcd under {self.state_dir} runs without TLS: stop it "
                    "(`oms infra down`) and start again, or use --plaintext"
                )
            _refuse_unresponsive(ETCD, state, previous.pid, previous.client_port)
        server = EmbeddedEtcd(
            self.etcd_dir,
            # Reuse last run's ports when free, so endpoints stay the same across restarts.
            client_port=_reusable(None if previous is None else previous.client_port),
            peer_port=_reusable(None if previous is None else previous.peer_port),
            unsafe_no_fsync=self.fast_unsafe,
            tls=etcd_tls,
            startup_timeout=self.startup_timeout,
        )
        server.start(detached=True)
        started.append(server.stop)
        return EtcdRecord(
            pid=server.pid,
            client_port=server.client_port,
            peer_port=server.peer_port,
            data_dir=server.data_dir,
            tls=tls,
        )

    def _ensure_postgres(
        self, record: InfraRecord, started: list[Callable[[], None]]
    ) -> PostgresRecord:
        previous = record.postgres
        if previous is not None:
            state = _state(previous.pid, previous.data_dir, previous.port)
            if state is ServerState.RUNNING:
                return previous
            _refuse_unresponsive(POSTGRES, state, previous.pid, previous.port)
        server = EmbeddedPostgres(
            self.postgres_dir,
            port=_reusable(None if previous is None else previous.port),
            fast_unsafe=self.fast_unsafe,
            startup_timeout=self.startup_timeout,
        )
        server.start(detached=True)
        started.append(server.stop)
        return PostgresRecord(
            pid=server.pid, port=server.port, data_dir=server.data_dir, url=server.url
        )

    def _etcd_status(self, record: EtcdRecord | None) -> ServerStatus:
        if record is None:
            return ServerStatus(ETCD, ServerState.STOPPED, None, None, self.etcd_dir, "embedded")
        state = _state(record.pid, record.data_dir, record.client_port)
        return ServerStatus(
            ETCD,
            state,
            record.endpoint,
            None if state is ServerState.STOPPED else record.pid,
            record.data_dir,
            "embedded",
        )

    def _postgres_status(self, record: PostgresRecord | None) -> ServerStatus:
        if record is None:
            return ServerStatus(
                POSTGRES, ServerState.STOPPED, None, None, self.postgres_dir, "embedded"
            )
        state = _state(record.pid, record.data_dir, record.port)
        return ServerStatus(
            POSTGRES,
            state,
            record.url,
            None if state is ServerState.STOPPED else record.pid,
            record.data_dir,
            "embedded",
        )

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        # Two `oms infra up` at once would both start servers on the same data folders.
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.state_dir / "infra.lock"
        with lock_path.open("a") as lock_file:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise InfraError(
                            f"another `oms infra` command has held {lock_path} for "
                            f"{_LOCK_TIMEOUT:g} s; is one stuck?"
                        ) from None
                    time.sleep(_LOCK_POLL_INTERVAL)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)


def _state(pid: int | None, data_dir: Path, port: int) -> ServerState:
    if pid is None or not pid_runs(pid, str(data_dir)):
        return ServerState.STOPPED
    if port_is_listening(LOOPBACK, port):
        return ServerState.RUNNING
    return ServerState.UNRESPONSIVE


def _refuse_unresponsive(name: str, state: ServerState, pid: int | None, port: int) -> None:
    if state is ServerState.UNRESPONSIVE:
        raise InfraError(
            f"{name} (pid {pid}) is running but does not answer on {LOOPBACK}:{port}: "
            "run `oms infra down`, then `oms infra up`"
        )


def _stop_recorded(pid: int, data_dir: Path, polite: signal.Signals, timeout: float) -> None:
    if pid_runs(pid, str(data_dir)):
        # Started with start_new_session, so the server leads its own process group.
        stop_pid(pid, polite, timeout, own_group=True)


def _reusable(port: int | None) -> int | None:
    return port if port is not None and port_is_free(LOOPBACK, port) else None
